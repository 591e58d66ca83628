"""``bench/run.py``'s limit, beam_jax's variants and the reads; each returns its numbers.

Every variant reads the same records and writes ``(ids, outputs)`` chunks to ``outdir`` so
the driver can check that all variants agree. Timing covers everything from pipeline
construction to the last output written, compiles included. ``limit`` is the kernel alone:
its batches are bucketed, padded and stacked and its shapes compiled before its clock
starts (the compile time is reported beside it), and its clock stops at the last output
fetched. ``read_only*`` are the I/O bounds: each input file read and decoded as its
variants read it, with no Beam, no kernel and no output. Stock Beam's are in ``stock.py``.
"""

from __future__ import annotations

import functools
import os
import time
import uuid

import apache_beam as beam
import jax
import numpy as np
from apache_beam.ml.inference.base import PredictionResult
from apache_beam.options.pipeline_options import PipelineOptions

import beam_jax as bj
from beam_jax.internal import Plan
from bench._lib.harness import Clock
from bench._lib.records import DIM, KERNELS, RecordReader, load_params
from bench._lib.records import warm as _warm

SPEC = {"x": bj.ArraySpec(("L", DIM), np.float32)}


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


def _finish(p, start) -> dict:
    result = p.run()
    result.wait_until_finish()
    times = start.stop()
    s = bj.summarize(result)
    if not s.conserved or s.dead_letters:
        raise RuntimeError(f"beam_jax lost or rejected elements: {s}")
    return {**times, "compiles": s.compiles, "padding_ratio": s.padding_ratio}


# ---- the I/O bounds ------------------------------------------------------------------------


def run_read_only(kernel: str, cfg: dict, file: str = "data.parquet") -> dict:
    """The I/O bound of the Arrow variants: the Parquet file read and decoded by pyarrow.

    Row group by row group, as ``ReadArrowBatches`` reads it (the file memory-mapped for
    each read, its footer parsed once), the ``x`` column becomes its flat values and int
    offsets (``list<float32>``: the float values; ``binary``: the raw bytes), and ``id`` an
    int array: what any reader must do before a kernel sees the data. No Beam, no kernel,
    no output.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(cfg["workdir"], file)
    _warm(path)
    start = Clock()
    metadata = pq.ParquetFile(path).metadata
    rows = 0
    for i in range(metadata.num_row_groups):
        with pa.memory_map(path) as mapped:
            f = pq.ParquetFile(mapped, metadata=metadata)
            table = f.read_row_group(i, columns=["id", "x"])
        for chunk in table.column("x").chunks:
            if hasattr(chunk, "values"):  # list<float32>
                values = chunk.values.to_numpy(zero_copy_only=False)
                offsets, size = np.asarray(chunk.offsets), len(values)
            else:  # binary: the buffers, viewed as int32 offsets and float32 values
                _, offs, data = chunk.buffers()
                lo = chunk.offset
                offsets = np.frombuffer(offs, np.int32)[lo : lo + len(chunk) + 1]
                values = np.frombuffer(data, np.float32)
                size = len(values) * 4
            assert size >= offsets[-1] - offsets[0]
        rows += len(table.column("id").to_numpy())
    times = start.stop()
    if rows != cfg["n"]:
        raise RuntimeError(f"read {rows} rows, expected {cfg['n']}")
    return {**times, "compiles": 0, "padding_ratio": 1.0}  # nothing padded


def run_read_only_raw(kernel: str, cfg: dict) -> dict:
    """The I/O bound of the variants that ``pread`` each record from ``values.f32``.

    The same ``RecordReader.read`` call per record as their ``ReadRecord`` DoFn, in a plain
    loop: no Beam, no kernel, no output.
    """
    _warm(os.path.join(cfg["workdir"], "values.f32"))
    reader = RecordReader(cfg["workdir"])
    reader.open()
    start = Clock()
    rows = sum(len(reader.read(i)) > 0 for i in range(cfg["n"]))
    times = start.stop()
    reader.close()
    if rows != cfg["n"]:
        raise RuntimeError(f"read {rows} records, expected {cfg['n']}")
    return {**times, "compiles": 0, "padding_ratio": 1.0}


# ``*_binary``: the same records stored as ``x: binary`` (raw float32 bytes per row).
VARIANTS = {
    "limit": run_limit,
    "read_only": run_read_only,
    "read_only_binary": functools.partial(run_read_only, file="data_binary.parquet"),
    "read_only_raw": run_read_only_raw,
    "beam_jax": run_beam_jax,
    "beam_jax_arrow": run_beam_jax_arrow,
    "beam_jax_arrow_binary": functools.partial(run_beam_jax_arrow, file="data_binary.parquet"),
}
