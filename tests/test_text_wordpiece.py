"""WordPiece on Arrow columns: exactly the Rust tokenizer's ids, for every text it takes."""

from __future__ import annotations

import copy
import json
import threading

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
import tokenizers

from beam_jax._src.text import wordpiece
from beam_jax._src.text.wordpiece import WordPiece
from beam_jax.text import SentenceEncoder, Tokenizer, builtin_corpus

# How the model's tokenizer.json is varied: each variant is one that BERT checkpoints ship.
VARIANTS = {
    "uncased": lambda spec: None,
    "cased": lambda spec: spec["normalizer"].update(lowercase=False),
    "no normalizer": lambda spec: spec.update(normalizer=None),
    "bert processing": lambda spec: spec.update(
        post_processor={"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}
    ),
    "no post-processor": lambda spec: spec.update(post_processor=None),
}


@pytest.fixture(scope="module")
def spec():
    path = SentenceEncoder.from_dir().tokenizer().path
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def variants(spec, tmp_path_factory):
    """Each variant's tokenizer.json, written once."""
    directory = tmp_path_factory.mktemp("wordpiece")
    paths = {}
    for name, change in VARIANTS.items():
        varied = copy.deepcopy(spec)
        change(varied)
        paths[name] = directory / f"{name.replace(' ', '_')}.json"
        paths[name].write_text(json.dumps(varied), encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def words(spec):
    """Vocabulary entries a text is built from (whole words, pieces, marks, specials)."""
    return sorted(w for w in spec["model"]["vocab"] if w.isascii())[::7]


def _rust(path, max_length: int) -> tokenizers.Tokenizer:
    rust = tokenizers.Tokenizer.from_file(str(path))
    rust.no_padding()
    rust.enable_truncation(max_length, strategy="longest_first")
    return rust


def _texts(words: list[str]):
    """Texts of vocabulary words, marks and every kind of ASCII whitespace, half of them
    with one thing that sends a text elsewhere or splits words oddly inserted: a control
    byte, non-ASCII, an added token in any case, a word of over 100 characters, or capitals."""
    marks = st.sampled_from(list(" \t\n\r.,!?'\"-_[]#()@~`{}|\\/$%^&*+=<>;:"))
    odd = st.sampled_from(
        ["\x0b", "\x0c", "\x00", "\x1f", "\x7f", "é", "中", "\u00a0", "\U0001f600"]
        + ["[CLS]", "[mask]", "[Sep]", "[PAD", "##", "x" * 101, "Y" * 100, "UnAffable"]
    )
    clean = st.lists(st.one_of(st.sampled_from(words), marks, st.just(" ")), max_size=40)
    return st.tuples(clean, st.none() | odd, st.integers(0, 40)).map(
        lambda t: "".join(t[0][: t[2]] + ([t[1]] if t[1] else []) + t[0][t[2] :])
    )


def _check(path, max_length: int, texts: list[str]) -> np.ndarray:
    """Asserts every text WordPiece takes gets the Rust tokenizer's ids; returns which."""
    column = pa.array(texts, pa.string())
    handled, lengths, ids = WordPiece.of(path, max_length=max_length).encode(column)
    expected = _rust(path, max_length).encode_batch(texts)
    assert lengths.dtype == np.int64 or np.issubdtype(lengths.dtype, np.integer)
    at = np.concatenate([[0], np.cumsum(lengths)])
    for k, row in enumerate(np.flatnonzero(handled)):
        assert ids[at[k] : at[k + 1]].tolist() == expected[row].ids, repr(texts[row])
    assert at[-1] == len(ids)
    return handled


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(data=st.data())
def test_the_ids_of_the_rust_tokenizer(variants, words, data):
    name = data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")
    max_length = data.draw(st.sampled_from([2, 3, 8, 256]), label="max_length")
    texts = data.draw(st.lists(_texts(words), max_size=30), label="texts")
    handled = _check(variants[name], max_length, texts)
    # Not refusing what it can take: printable ASCII without an added token is taken.
    for text, taken in zip(texts, handled, strict=True):
        plain = all(c in "\t\n\r" or " " <= c <= "~" for c in text)
        added = any(
            t.lower() in text.lower() for t in ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")
        )
        assert taken == (plain and not added), repr(text)


def test_the_built_in_corpus(variants):
    texts = [t for _, t in builtin_corpus()]
    handled = _check(variants["uncased"], 256, texts)
    assert handled.mean() > 0.99


def test_slices_large_strings_nulls_and_skips(variants):
    path = variants["uncased"]
    texts = ["Hello, world!", None, "", "  a  ", "ça va", "A.B;c", "[CLS] x", "unaffable"]
    wp = WordPiece.of(path, max_length=16)
    rust = _rust(path, 16)
    for column in (pa.array(texts), pa.array(texts, pa.large_string()), pa.array(texts)[1:]):
        skip = np.zeros(len(column), bool)
        skip[-1] = True
        handled, lengths, ids = wp.encode(column, skip=skip)
        rows = column.to_pylist()
        expected = [rust.encode(t).ids for t, h in zip(rows, handled, strict=True) if h]
        assert [x.tolist() for x in np.split(ids, np.cumsum(lengths)[:-1])] == expected
        taken = [t for t, h in zip(rows, handled, strict=True) if h]
        assert None not in taken and "ça va" not in taken and "[CLS] x" not in taken
        assert "unaffable" not in taken  # skipped
        assert "Hello, world!" in taken or column.offset


def test_not_bert_pipelines_are_left_to_the_rust_tokenizer(spec, tmp_path):
    changes = {
        "pre_tokenizer": {"type": "Whitespace"},
        "normalizer": {"type": "Lowercase"},
        "post_processor": {
            "type": "RobertaProcessing",
            "sep": ["[SEP]", 102],
            "cls": ["[CLS]", 101],
        },
    }
    for key, value in changes.items():
        varied = dict(spec, **{key: value})
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(varied), encoding="utf-8")
        assert WordPiece.of(path, max_length=16) is None, key
        # The Tokenizer still tokenizes, by the Rust tokenizer alone.
        tokenizer = Tokenizer(path, max_length=16)
        ids, failures = tokenizer.encode_arrow(pa.array(["A cat, here."]))
        assert failures == {} and ids.to_pylist() == [
            x.tolist() for x in tokenizer.encode_batch(["A cat, here."])
        ]


def test_the_word_cache_starts_again_when_full(variants, monkeypatch):
    monkeypatch.setattr(wordpiece, "_MAX_CACHED_WORDS", 5)
    texts = [t for _, t in builtin_corpus(200)]
    path = variants["uncased"]
    wp = WordPiece.of(path, max_length=64)
    rust = _rust(path, 64)
    for start in range(0, len(texts), 50):
        chunk = texts[start : start + 50]
        handled, lengths, ids = wp.encode(pa.array(chunk))
        got = [x.tolist() for x in np.split(ids, np.cumsum(lengths)[:-1])]
        assert got == [rust.encode(t).ids for t, h in zip(chunk, handled, strict=True) if h]
    assert len(wp._words) <= 50 * 40  # started again, not grown with every chunk


def test_threads_share_one_wordpiece(variants, monkeypatch):
    """Four threads on one WordPiece, its word cache small enough to start again while
    the others read it: every text still gets its own ids."""
    monkeypatch.setattr(wordpiece, "_MAX_CACHED_WORDS", 300)
    texts = [t for _, t in builtin_corpus(800)]
    path = variants["uncased"]
    wp = WordPiece.of(path, max_length=256)
    expected = [e.ids for e in _rust(path, 256).encode_batch(texts)]
    errors: list[BaseException] = []

    def work(offset: int):
        try:
            for start in range(offset, len(texts), 64):
                chunk = texts[start : start + 64]
                handled, lengths, ids = wp.encode(pa.array(chunk))
                got = iter(np.split(ids, np.cumsum(lengths)[:-1]))
                for row, taken in enumerate(handled):
                    if taken:
                        assert next(got).tolist() == expected[start + row]
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k * 16,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
