"""The measured variants. Each runs in a fresh process and returns its numbers.

Every variant reads the same records and writes ``(ids, outputs)`` chunks to ``outdir`` so
the driver can check that all variants agree. Timing covers everything from pipeline
construction to the last output written, compiles included. ``limit`` is the kernel alone:
its batches are bucketed, padded and stacked and its shapes compiled before its clock
starts (the compile time is reported beside it), and its clock stops at the last output
fetched. The I/O bounds (``read_only*``) are in read_only.py.
"""

from __future__ import annotations

import os
import time
import uuid
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
from apache_beam.options.pipeline_options import PipelineOptions
from data import DIM, RecordReader
from data import warm as _warm
from harness import Clock
from kernels import KERNELS, load_params
from read_only import run_read_only, run_read_only_binary, run_read_only_raw

import beam_jax as bj
from beam_jax.internal import Plan

SPEC = {"x": bj.ArraySpec(("L", DIM), np.float32)}


_JITTED: dict[str, Any] = {}  # stock variants' jitted functions, to count their compiles


class CollectRows(beam.DoFn):
    """Writes ``(ids, outputs)`` chunks to ``outdir``; accepts the shapes each variant emits."""

    def __init__(self, outdir: str, kind: str):
        self.outdir = outdir
        self.kind = kind

    def start_bundle(self):
        self.ids, self.values, self.count = [], [], 0

    def process(self, element):
        if self.kind == "arrow":
            self.ids.append(element.column("id").to_numpy())
            self.values.append(element.column("output").flatten().to_numpy().reshape(-1, DIM))
            self.count += element.num_rows
        else:  # (id, vector) or (id, PredictionResult)
            key, value = element
            if isinstance(value, PredictionResult):
                value = value.inference
            self.ids.append(np.asarray([key]))
            self.values.append(np.asarray(value)[None])
            self.count += 1
        if self.count >= 8192:
            self._flush()

    def finish_bundle(self):
        self._flush()

    def _flush(self):
        if self.count:
            np.savez(
                os.path.join(self.outdir, f"{uuid.uuid4().hex}.npz"),
                ids=np.concatenate(self.ids),
                values=np.concatenate(self.values),
            )
        self.ids, self.values, self.count = [], [], 0


class ReadRecord(beam.DoFn):
    """Index -> ``(index, record)``, read from the raw file inside the pipeline."""

    def __init__(self, workdir: str, as_dict: bool):
        self.workdir = workdir
        self.as_dict = as_dict

    def setup(self):
        self.reader = RecordReader(self.workdir)
        self.reader.open()

    def process(self, i):
        x = self.reader.read(i)
        yield (i, {"x": x} if self.as_dict else x)

    def teardown(self):
        self.reader.close()


def _indices(p, n: int):
    return p | "Impulse" >> beam.Impulse() | "Indices" >> beam.FlatMap(lambda _: range(n))


def _pipeline():
    return beam.Pipeline(runner="FnApiRunner", options=PipelineOptions([]))


def _bucketing(cfg) -> bj.Bucketing:
    return bj.Bucketing(
        boundaries={"L": tuple(cfg["boundaries"])},
        batch_size=cfg["batch_size"],
        batch_sizes=tuple(cfg["batch_sizes"]) if cfg["batch_sizes"] else None,
        max_padded_size=cfg["max_padded_size"],
    )


def run_limit(kernel: str, cfg: dict) -> dict:
    """The same jitted kernel over pre-bucketed, pre-padded, pre-stacked numpy batches."""
    plan = Plan(SPEC, _bucketing(cfg))
    reader = RecordReader(cfg["workdir"])
    lengths = np.load(os.path.join(cfg["workdir"], "lengths.npy"))
    groups: dict[tuple, list[int]] = {}
    for i, n in enumerate(lengths.tolist()):
        groups.setdefault(plan.bucket_for((n,)), []).append(i)
    batches, padded, real = [], 0, int(lengths.sum())
    for bucket, ids in groups.items():
        top = plan.max_batch(bucket)
        for lo in range(0, len(ids), top):
            chunk = ids[lo : lo + top]
            size = plan.padded_batch_size(bucket, len(chunk))
            x = np.zeros((size, bucket[0], DIM), np.float32)
            lens = np.zeros(size, np.int32)
            for row, i in enumerate(chunk):
                rec = reader.read(i)
                x[row, : len(rec)] = rec
                lens[row] = len(rec)
            batches.append((np.asarray(chunk), x, lens))
            padded += size * bucket[0]
    params = jax.device_put(load_params())
    jax.block_until_ready(params)
    fn = jax.jit(jax.vmap(KERNELS[kernel], in_axes=(None, 0, 0)))
    # Every shape compiled before the clock starts: the bound is the kernel's run time
    # alone (the compiles are reported beside it, and the variants' own include theirs).
    compile_start = time.perf_counter()
    compiled = {}
    for _, x, lens in batches:
        if x.shape not in compiled:
            compiled[x.shape] = fn.lower(params, {"x": x}, {"L": lens}).compile()
    compile_s = time.perf_counter() - compile_start
    start = Clock()
    outs = []
    for _, x, lens in batches:
        # Waiting for each batch measured faster here than queueing them all (which
        # runs several batches at once on the same cores).
        outs.append(np.asarray(compiled[x.shape](params, {"x": x}, {"L": lens})))
    times = start.stop()
    ids = np.concatenate([b[0] for b in batches])
    values = np.concatenate([o[: len(b[0])] for o, b in zip(outs, batches, strict=True)])
    np.savez(os.path.join(cfg["outdir"], "all.npz"), ids=ids, values=values)
    return {
        **times,
        "compiles": len(compiled),
        "compile_s": compile_s,
        "padding_ratio": padded / real,
    }


def run_beam_jax(kernel: str, cfg: dict) -> dict:
    """RunKernel on the FnApiRunner from an in-memory source of record indices."""
    _warm(os.path.join(cfg["workdir"], "values.f32"))
    start = Clock()
    p = _pipeline()
    records = _indices(p, cfg["n"]) | "Read" >> beam.ParDo(ReadRecord(cfg["workdir"], True))
    results, _ = (
        records
        | bj.RunKernel(
            KERNELS[kernel],
            spec=SPEC,
            bucketing=_bucketing(cfg),
            load_params=load_params,
            keyed=True,
        ).with_exception_handling()
    )
    _ = results | "Collect" >> beam.ParDo(CollectRows(cfg["outdir"], "pairs"))
    return _finish(p, start)


def run_beam_jax_arrow(kernel: str, cfg: dict, file: str = "data.parquet") -> dict:
    """RunKernelOnArrow on the FnApiRunner from the Parquet file (``x: list<float32>``)."""
    path = os.path.join(cfg["workdir"], file)
    _warm(path)
    start = Clock()
    p = _pipeline()
    results, _ = (
        p
        | bj.ReadArrowBatches(path)
        | bj.RunKernelOnArrow(
            KERNELS[kernel],
            spec=SPEC,
            columns=bj.ArrowColumns(leaves={"x": "x"}, id="id"),
            bucketing=_bucketing(cfg),
            load_params=load_params,
        ).with_exception_handling()
    )
    _ = results | "Collect" >> beam.ParDo(CollectRows(cfg["outdir"], "arrow"))
    return _finish(p, start)


def run_beam_jax_arrow_binary(kernel: str, cfg: dict) -> dict:
    """RunKernelOnArrow from the same records stored as ``x: binary`` (raw float32 bytes)."""
    return run_beam_jax_arrow(kernel, cfg, "data_binary.parquet")


def _finish(p, start) -> dict:
    result = p.run()
    result.wait_until_finish()
    times = start.stop()
    s = bj.summarize(result)
    if not s.conserved or s.dead_letters:
        raise RuntimeError(f"beam_jax lost or rejected elements: {s}")
    return {**times, "compiles": s.compiles, "padding_ratio": s.padding_ratio}


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
    """Beam's length buckets for the plan's boundaries. Beam's are lower-inclusive
    (``bisect_right``), beam_jax's upper-inclusive: Beam's ``b + 1`` groups the lengths of
    beam_jax's ``b``; the last boundary is the longest length, no bucket above it."""
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


def run_stock_beam_tuned(kernel: str, cfg: dict) -> dict:
    """Stock Beam as a careful user tunes it: ``BatchElements(min_batch_size=B,
    max_batch_size=B)``, every batch padded to B rows and its length to the bucket of its
    longest element, so it compiles once per bucket (B = ``--batch-size``)."""
    return run_stock_beam(kernel, cfg, tuned=True)


def run_stock_beam_buckets(kernel: str, cfg: dict) -> dict:
    """Stock Beam with its own length buckets: ``BatchElements(min_batch_size=B,
    max_batch_size=B, max_batch_duration_secs=60, length_fn=..., bucket_boundaries=...)``
    at the plan's boundaries, each batch padded to B rows and its bucket's length."""
    return run_stock_beam(kernel, cfg, buckets=True)


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


def run_stock_runinference_tuned(kernel: str, cfg: dict) -> dict:
    """``stock_runinference`` with ``min_batch_size=max_batch_size=B`` and every batch
    padded to B rows: one compile per bucket, as a careful user would set it up."""
    return run_stock_runinference(kernel, cfg, tuned=True)


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


VARIANTS = {
    "limit": run_limit,
    "read_only": run_read_only,
    "read_only_binary": run_read_only_binary,
    "read_only_raw": run_read_only_raw,
    "beam_jax": run_beam_jax,
    "beam_jax_arrow": run_beam_jax_arrow,
    "beam_jax_arrow_binary": run_beam_jax_arrow_binary,
    "stock_beam": run_stock_beam,
    "stock_beam_tuned": run_stock_beam_tuned,
    "stock_beam_buckets": run_stock_beam_buckets,
    "stock_runinference": run_stock_runinference,
    "stock_runinference_tuned": run_stock_runinference_tuned,
    "beam_jax_runinference": run_beam_jax_runinference,
}
