"""TokenizeBatches' threads: several batches tokenized at once where the worker has the
cores, each row's tokens and dead letters unchanged, the default sized on the worker."""

from __future__ import annotations

import threading
import time

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_jax import DEAD_LETTERS
from beam_jax._src.transforms import tokenize
from beam_jax.text import SentenceEncoder, TokenizeBatches, builtin_corpus
from tests.beam_helpers import pipeline, run

_STATE: dict = {}  # shared with the DoFn's copies (the FnApiRunner runs in this process)


class _Tokenizer:
    """The packaged tokenizer, counting its calls at once; where two are expected, the first
    two calls pass a barrier only together (so one thread alone fails the pipeline)."""

    def __init__(self, inner):
        self._inner = inner

    def encode_arrow(self, texts):
        state = _STATE
        with state["lock"]:
            state["calls"] += 1
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
            first = state["calls"] <= 2
        try:
            if state["barrier"] is not None and first:
                state["barrier"].wait()
            else:
                time.sleep(0.02)  # long enough for a second thread to overlap
            return self._inner.encode_arrow(texts)
        finally:
            with state["lock"]:
                state["running"] -= 1


class _Encoder:
    def tokenizer(self):
        return _Tokenizer(SentenceEncoder.from_dir().tokenizer())


def _batches(texts: list, size: int) -> list[pa.RecordBatch]:
    return [
        pa.RecordBatch.from_arrays(
            [pa.array(range(s, s + len(texts[s : s + size])), pa.int64()),
             pa.array(texts[s : s + size], pa.string())],
            names=["id", "text"],
        )
        for s in range(0, len(texts), size)
    ]  # fmt: skip


def _rows(batch: pa.RecordBatch) -> list[tuple[int, tuple[int, ...]]]:
    ids = batch.column("id").to_pylist()
    return [(k, tuple(v)) for k, v in zip(ids, batch.column("input_ids").to_pylist(), strict=True)]


@pytest.mark.parametrize(
    ("threads", "cores", "expected"),
    [(2, 1, 2), (None, 4, 2), (None, 2, 1), (1, 13, 1)],
)
def test_batches_tokenize_at_once_as_the_worker_allows_and_rows_are_unchanged(
    monkeypatch, threads, cores, expected
):
    monkeypatch.setattr(tokenize, "usable_cores", lambda: cores)
    barrier = threading.Barrier(2, timeout=30) if expected == 2 else None
    _STATE.clear()
    _STATE.update(lock=threading.Lock(), calls=0, running=0, peak=0, barrier=barrier)
    texts: list = [text for _, text in builtin_corpus()[:120]]
    texts[37] = None  # a null text: its dead letter, the rest of its batch tokenized
    batches = _batches(texts, 20)
    reference = (
        SentenceEncoder.from_dir().tokenizer().encode_batch([t for t in texts if t is not None])
    )
    expected_rows = [
        (k, tuple(int(i) for i in ids))
        for k, ids in zip((k for k, t in enumerate(texts) if t is not None), reference, strict=True)
    ]

    p = pipeline()
    out = (
        p
        | beam.Create(batches)
        | beam.ParDo(TokenizeBatches(_Encoder(), threads=threads)).with_outputs(
            DEAD_LETTERS, main="tokens"
        )
    )
    assert_that(out.tokens | beam.FlatMap(_rows), equal_to(expected_rows), label="tokens")
    dead = out[DEAD_LETTERS] | beam.Map(lambda r: (r.key, r.stage))
    assert_that(dead, equal_to([(37, "validation")]), label="dead")
    run(p)
    assert _STATE["calls"] == len(batches)
    assert _STATE["peak"] == expected


def test_the_default_is_two_threads_from_four_cores_and_threads_are_checked(monkeypatch):
    for cores, want in [(1, 1), (3, 1), (4, 2), (13, 2), (64, 2)]:
        monkeypatch.setattr(tokenize, "usable_cores", lambda cores=cores: cores)
        assert tokenize.default_tokenize_threads() == want
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"threads must be a positive int.*got {bad!r}"):
            TokenizeBatches(_Encoder(), threads=bad)
