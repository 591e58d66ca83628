"""``bench/run.py``'s stock Beam peers: ``BatchElements`` and ``RunInference`` set up as
Beam's docs advise, and beam_jax's RunInference handler under the same batching.

Beam's length buckets are lower-inclusive (``bisect_right``), beam_jax's upper-inclusive:
Beam's ``b + 1`` groups the lengths of beam_jax's ``b``, so both group the same lengths.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import apache_beam as beam
import jax
import numpy as np
from apache_beam.ml.inference.base import (
    KeyedModelHandler,
    ModelHandler,
    PredictionResult,
    RunInference,
)

import beam_jax as bj
from bench._lib.harness import Clock
from bench._lib.records import DIM, KERNELS, load_params
from bench._lib.records import warm as _warm
from bench._lib.variants import (
    SPEC,
    CollectRows,
    ReadRecord,
    _bucketing,
    _finish,
    _indices,
    _pipeline,
)

_JITTED: dict[str, Any] = {}  # the stock variants' jitted functions, to count their compiles


class _PadAndRun(beam.DoFn):
    """Stock: pad each batch to its longest element (or its bucket), run the jitted kernel."""

    def __init__(self, kernel: str, bounds: tuple[int, ...] | None, rows: int | None = None):
        self.kernel = kernel
        self.bounds = bounds
        self.rows = rows

    def setup(self):
        model = _load_model(self.kernel)
        self.params, self.fn = model.params, model.fn
        self.padded = beam.metrics.Metrics.counter("bench", "padded_size")
        self.real = beam.metrics.Metrics.counter("bench", "real_size")

    def process(self, batch):
        ids = [i for i, _ in batch]
        outs = _pad_and_run(self, [x for _, x in batch])
        yield from zip(ids, outs, strict=True)


class _Model:
    # RunInference keeps models in apache_beam.utils.shared, which needs a weak reference.
    def __init__(self, params, fn):
        self.params, self.fn = params, fn


def _load_model(kernel: str) -> _Model:
    fn = jax.jit(jax.vmap(KERNELS[kernel], in_axes=(None, 0, 0)))
    _JITTED[kernel] = fn
    return _Model(jax.device_put(load_params()), fn)


def _pad_and_run(owner, xs: list[np.ndarray]) -> np.ndarray:
    """Pads the length axis to the longest element (or its bucket when ``owner.bounds``)
    and, when ``owner.rows``, the batch axis to that many rows; returns the real rows."""
    longest = max(len(x) for x in xs)
    width = longest
    if owner.bounds is not None:
        width = next(b for b in owner.bounds if b >= longest)
    rows = max(owner.rows or 0, len(xs))
    padded = np.zeros((rows, width, DIM), np.float32)
    lens = np.zeros(rows, np.int32)
    for row, x in enumerate(xs):
        padded[row, : len(x)] = x
        lens[row] = len(x)
    owner.padded.inc(padded.shape[0] * width)
    owner.real.inc(int(lens.sum()))
    return np.asarray(owner.fn(owner.params, {"x": padded}, {"L": lens}))[: len(xs)]


def _beam_bounds(cfg) -> list[int]:
    """Beam's length buckets for the plan's boundaries (the last one: no bucket above it)."""
    return [b + 1 for b in cfg["boundaries"][:-1]]


def _record_length(pair: tuple[int, np.ndarray]) -> int:
    """The length of an ``(index, record)`` pair's record: what ``BatchElements`` buckets by."""
    return len(pair[1])


def run_stock_beam(kernel: str, cfg: dict, tuned: bool = False, buckets: bool = False) -> dict:
    """Stock Beam: BatchElements, then a Map that pads each batch to its longest element."""
    _warm(os.path.join(cfg["workdir"], "values.f32"))
    size = cfg["batch_size"]
    if buckets:
        # Beam's own length-aware batching (its stateful path: buckets exist only there),
        # batches of exactly B so each bucket compiles once; a batch job has no latency to
        # keep, so batches wait as long as they need to fill.
        batching = beam.BatchElements(
            min_batch_size=size,
            max_batch_size=size,
            max_batch_duration_secs=60,
            length_fn=_record_length,
            bucket_boundaries=_beam_bounds(cfg),
        )
        pad = _PadAndRun(kernel, tuple(cfg["boundaries"]), rows=size)
    elif tuned:
        batching = beam.BatchElements(min_batch_size=size, max_batch_size=size)
        pad = _PadAndRun(kernel, tuple(cfg["boundaries"]), rows=size)
    else:
        batching = beam.BatchElements(max_batch_size=size)
        pad = _PadAndRun(kernel, None)
    start = Clock()
    p = _pipeline()
    _ = (
        _indices(p, cfg["n"])
        | "Read" >> beam.ParDo(ReadRecord(cfg["workdir"], False))
        | batching
        | "PadAndRun" >> beam.ParDo(pad)
        | "Collect" >> beam.ParDo(CollectRows(cfg["outdir"], "pairs"))
    )
    return _finish_stock(p, start, kernel)


class JaxModelHandler(ModelHandler):
    """A minimal RunInference handler: Beam's length buckets, padding within each batch.

    Beam's buckets are lower-inclusive (``bisect_right``), so it is given ``b + 1`` for each
    beam_jax boundary ``b``: both then group the same lengths, and each batch is padded to
    its bucket's boundary, the most stable shape stock batching allows.
    """

    def __init__(self, kernel: str, bounds: tuple[int, ...], batch_size: int, tuned: bool = False):
        super().__init__(
            min_batch_size=batch_size if tuned else None,
            max_batch_size=batch_size,
            max_batch_duration_secs=60,
            batch_length_fn=_example_length,
            batch_bucket_boundaries=[b + 1 for b in bounds[:-1]],  # as _beam_bounds
        )
        self.kernel = kernel
        self.bounds = bounds
        self.rows = batch_size if tuned else None

    def load_model(self):
        return _load_model(self.kernel)

    def run_inference(self, batch, model, inference_args=None):
        if not hasattr(self, "padded"):
            self.padded = beam.metrics.Metrics.counter("bench", "padded_size")
            self.real = beam.metrics.Metrics.counter("bench", "real_size")
        self.params, self.fn = model.params, model.fn
        outs = _pad_and_run(self, list(batch))
        return [PredictionResult(x, o) for x, o in zip(batch, outs, strict=True)]

    def get_num_bytes(self, batch) -> int:
        return sum(x.nbytes for x in batch)


def _example_length(example: np.ndarray) -> int:
    """The length RunInference batches by. Beam's ``KeyedModelHandler`` hands
    ``batch_length_fn`` the example, not the ``(key, example)`` pair (since Beam 2.78)."""
    return len(example)


def run_stock_runinference(kernel: str, cfg: dict, tuned: bool = False) -> dict:
    """Stock Beam RunInference with length-bucketed (stateful) BatchElements."""
    _warm(os.path.join(cfg["workdir"], "values.f32"))
    start = Clock()
    p = _pipeline()
    handler = KeyedModelHandler(
        JaxModelHandler(kernel, tuple(cfg["boundaries"]), cfg["batch_size"], tuned=tuned)
    )
    _ = (
        _indices(p, cfg["n"])
        | "Read" >> beam.ParDo(ReadRecord(cfg["workdir"], False))
        | RunInference(handler)
        | "Collect" >> beam.ParDo(CollectRows(cfg["outdir"], "pairs"))
    )
    return _finish_stock(p, start, kernel)


def run_beam_jax_runinference(kernel: str, cfg: dict) -> dict:
    """RunInference with beam_jax's handler: the same Beam length buckets and stateful
    batching as ``stock_runinference``, each batch run by beam_jax's engine."""
    _warm(os.path.join(cfg["workdir"], "values.f32"))
    start = Clock()
    p = _pipeline()
    handler = bj.KeyedJaxModelHandler(
        KERNELS[kernel],
        spec=SPEC,
        bucketing=_bucketing(cfg),
        load_params=load_params,
        max_batch_duration_secs=60,
    )
    _ = (
        _indices(p, cfg["n"])
        | "Read" >> beam.ParDo(ReadRecord(cfg["workdir"], True))
        | RunInference(handler)
        | "Collect" >> beam.ParDo(CollectRows(cfg["outdir"], "pairs"))
    )
    return _finish(p, start)


def _finish_stock(p, start, kernel: str) -> dict:
    result = p.run()
    result.wait_until_finish()
    times = start.stop()
    totals = {}
    query = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("bench"))
    for c in query["counters"]:
        totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + (c.committed or 0)
    fn = _JITTED.get(kernel)
    return {
        **times,
        "compiles": fn._cache_size() if fn is not None else None,
        "padding_ratio": totals.get("padded_size", 0) / max(totals.get("real_size", 0), 1),
    }


# ``_tuned``: batches of exactly B (``min_batch_size=max_batch_size``), every batch padded
# to B rows and its length to its bucket, so it compiles once per bucket, as a careful user
# sets it up; ``stock_beam_buckets``: the same with Beam's own length buckets
# (``length_fn``, ``bucket_boundaries``: its stateful path, batches waiting up to 60 s).
STOCK_VARIANTS = {
    "stock_beam": run_stock_beam,
    "stock_beam_tuned": functools.partial(run_stock_beam, tuned=True),
    "stock_beam_buckets": functools.partial(run_stock_beam, buckets=True),
    "stock_runinference": run_stock_runinference,
    "stock_runinference_tuned": functools.partial(run_stock_runinference, tuned=True),
    "beam_jax_runinference": run_beam_jax_runinference,
}
