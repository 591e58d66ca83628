"""beam_jax.text.Tokenizer: Arrow columns tokenized in one call, one failure per bad row."""

from __future__ import annotations

import json
import pathlib
import pickle

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest

import beam_jax as bj
from beam_jax import text
from beam_jax.text import SentenceEncoder, TextTooLongError

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tokenizer():
    return SentenceEncoder.from_dir().tokenizer()


@pytest.fixture(scope="module")
def texts():
    return json.loads((FIXTURES / "minilm_reference.json").read_text(encoding="utf-8"))["texts"]


def _lists(ids: pa.ListArray) -> list:
    return ids.to_pylist()


def test_encode_arrow_equals_encode_batch_on_real_text(tokenizer, texts):
    ids, failures = tokenizer.encode_arrow(pa.array(texts))
    assert failures == {}
    assert ids.type == pa.list_(pa.int32()) and ids.null_count == 0
    assert _lists(ids) == [x.tolist() for x in tokenizer.encode_batch(texts)]
    # large_string and chunked columns give the same.
    chunked = pa.chunked_array([texts[:10], texts[10:]], pa.large_string())
    assert _lists(tokenizer.encode_arrow(chunked)[0]) == _lists(ids)
    # So does a categorical column (a dictionary of strings), whole or in chunks each with
    # its own dictionary (row groups).
    categorical = pa.array(texts).dictionary_encode()
    assert _lists(tokenizer.encode_arrow(categorical)[0]) == _lists(ids)
    chunks = pa.chunked_array([pa.array(t).dictionary_encode() for t in (texts[:10], texts[10:])])
    assert _lists(tokenizer.encode_arrow(chunks)[0]) == _lists(ids)
    flat, lengths = tokenizer.encode_flat(texts)
    np.testing.assert_array_equal(flat, ids.values.to_numpy())
    np.testing.assert_array_equal(lengths, np.diff(ids.offsets.to_numpy()))


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
@hypothesis.given(
    picks=st.lists(st.integers(0, 10_000), max_size=12),
    extra=st.lists(st.text(max_size=40), max_size=4),
    long_at=st.integers(0, 3),
)
def test_count_tokens_equals_encode_flat(tokenizer, texts, picks, extra, long_at):
    """Counts without ids: what encode_flat's lengths are, for real, odd and long texts
    (a text past max_chars counts from its prefix, as encode_flat tokenizes it)."""
    chosen = [texts[i % len(texts)] for i in picks] + extra
    chosen.insert(min(long_at, len(chosen)), "word " * (tokenizer.max_chars // 4))
    _, lengths = tokenizer.encode_flat(chosen)
    counts = tokenizer.count_tokens(chosen)
    assert counts.dtype == np.int64
    np.testing.assert_array_equal(counts, lengths)


def test_bad_rows_fail_alone(tokenizer):
    column = pa.array(["A cat.", None, "", "  spaced  ", None])
    ids, failures = tokenizer.encode_arrow(column)
    spaced = tokenizer.encode("spaced").tolist()
    assert _lists(ids) == [[101, 1037, 4937, 1012, 102], None, [101, 102], spaced, None]
    assert sorted(failures) == [1, 4]
    assert isinstance(failures[1], bj.InvalidElementError)
    assert "row 1's text is null" in str(failures[1])


def test_invalid_utf8_fails_that_row(tokenizer):
    good, bad = b"a cat", b"\xff\xfe cat"
    data = good + bad + good
    offsets = np.array([0, len(good), len(good) + len(bad), len(data)], np.int32)
    column = pa.Array.from_buffers(
        pa.string(), 3, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
    )
    ids, failures = tokenizer.encode_arrow(column)
    assert list(failures) == [1] and "not valid UTF-8" in str(failures[1])
    assert _lists(ids) == [[101, 1037, 4937, 102], None, [101, 1037, 4937, 102]]


def test_long_texts_are_tokenized_from_their_start(tokenizer, texts):
    prose = " ".join(texts)
    assert len(prose) > text.MAX_TOKENIZED_CHARS
    blank = "x " + " " * (text.MAX_TOKENIZED_CHARS + 10) + "the end"
    ids, failures = tokenizer.encode_arrow(pa.array([prose, blank]))
    # The prefix reaches the 256-token window, so the ids are the whole text's.
    assert _lists(ids)[0] == tokenizer.encode(prose).tolist() and len(_lists(ids)[0]) == 256
    assert list(failures) == [1] and isinstance(failures[1], TextTooLongError)
    assert "hold only 1 tokens, fewer than the 254 embedded" in str(failures[1])


def test_whitespace_at_a_long_text_s_ends_is_not_counted_against_it(tokenizer):
    # Its first characters were all whitespace: "its first 7 hold only 2 tokens".
    edged = [" " * (text.MAX_TOKENIZED_CHARS + 10) + "the end", "the end" + "\n" * 70_000]
    ids, failures = tokenizer.encode_arrow(pa.array(edged))
    want = tokenizer.encode("the end").tolist()
    assert not failures and _lists(ids) == [want, want]
    assert tokenizer.count_tokens(edged).tolist() == [len(want)] * 2


def test_a_text_the_tokenizer_rejects_fails_alone(tokenizer, monkeypatch):
    real = tokenizer._fast

    def picky(batch):
        if any("poison" in t for t in batch):
            raise RuntimeError("the tokenizer cannot take 'poison'")
        return real(batch)

    monkeypatch.setattr(tokenizer, "_fast", picky)
    # Non-ASCII texts go to the Rust tokenizer, in one batch; the ASCII one never does.
    column = pa.array(["a cat", "poison café", "a dog in a café"])
    ids, failures = tokenizer.encode_arrow(column)
    assert list(failures) == [1] and "cannot take 'poison'" in str(failures[1])
    cafe = real(["a dog in a café"])[0].ids
    assert _lists(ids) == [[101, 1037, 4937, 102], None, cafe]


def test_refuses_what_is_not_a_string_column(tokenizer):
    with pytest.raises(TypeError, match="Arrow string array, got int64"):
        tokenizer.encode_arrow(pa.array([1, 2]))
    with pytest.raises(TypeError, match="got list"):
        tokenizer.encode_arrow(["a"])
    ids, failures = tokenizer.encode_arrow(pa.array([], pa.string()))
    assert len(ids) == 0 and failures == {}


def test_lowercase_and_pickling(tokenizer):
    upper = text.Tokenizer(tokenizer.path, max_length=8, lowercase=True)
    again = pickle.loads(pickle.dumps(upper))
    assert (again.max_length, again.lowercase) == (8, True)
    column = pa.array(["HELLO WORLD"])
    assert _lists(again.encode_arrow(column)[0]) == [tokenizer.encode("hello world").tolist()]
    with pytest.raises(ValueError, match="max_chars must be a positive int, got 0"):
        text.Tokenizer(tokenizer.path, max_length=8, max_chars=0)
    with pytest.raises(FileNotFoundError, match="expected a tokenizer.json file"):
        text.Tokenizer(tokenizer.path.with_name("nothing.json"), max_length=8)


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
@hypothesis.given(
    st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=12),
)
def test_encode_arrow_is_encode_batch_row_by_row(values):
    """Any mix of texts and nulls: each row is what the row alone gives, or its failure."""
    tokenizer = _shared_tokenizer()
    ids, failures = tokenizer.encode_arrow(pa.array(values, pa.string()))
    assert sorted(failures) == [i for i, v in enumerate(values) if v is None]
    for value, got in zip(values, _lists(ids), strict=True):
        assert got == (None if value is None else tokenizer.encode(value).tolist())


_TOKENIZER: list = []


def _shared_tokenizer():
    if not _TOKENIZER:
        _TOKENIZER.append(SentenceEncoder.from_dir().tokenizer())
    return _TOKENIZER[0]


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    rows=st.lists(
        st.one_of(
            st.none(),
            st.sampled_from(["A cat.", "", " x ", "[MASK] it", "naïve café", "日本語", "a\x0bb"]),
            st.text(alphabet="ab .,é\t", max_size=12),
        ),
        max_size=20,
    )
)
def test_ascii_and_other_rows_interleave_in_row_order(tokenizer, rows):
    """Rows tokenized with numpy and rows left to the Rust tokenizer come back in their
    places: the same ids as the Rust tokenizer alone, nulls failing alone."""
    ids, failures = tokenizer.encode_arrow(pa.array(rows, pa.string()))
    assert sorted(failures) == [i for i, r in enumerate(rows) if r is None]
    texts = [r for r in rows if r is not None]
    expected = [x.tolist() for x in tokenizer.encode_batch(texts)] if texts else []
    assert [x for x in _lists(ids) if x is not None] == expected
    flat, lengths = tokenizer.encode_flat(texts)
    assert lengths.tolist() == [len(x) for x in expected]
    assert flat.tolist() == [i for x in expected for i in x]


def test_encode_flat_leaves_what_arrow_cannot_hold_to_the_rust_tokenizer(tokenizer):
    """A lone surrogate is no UTF-8: the Rust tokenizer's own error, as before, not Arrow's."""
    with pytest.raises(Exception) as caught:
        tokenizer.encode_flat(["ok", "bad \ud800"])
    assert not isinstance(caught.value, (pa.ArrowException, UnicodeError))
