"""The curation job's passes, each one Beam pipeline run: a training pass sums every record's
gradient with ``ReduceKernel``; the scoring pass runs ``RunKernel`` for GraNd and EL2N
(docs/curate.md). Labels are flipped on the way into the kernels by :class:`LabelNoise`, from
a seeded hash of each id, so every pass, worker and runner sees the same labels.

Example:
    >>> LabelNoise(("a", "b"), fraction=0.0, seed=0).observe(7, "b")
    (1, 1)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.parquetio import WriteToParquetBatched
from apache_beam.options.pipeline_options import PipelineOptions

import beam_jax as bj
from beam_jax import jobs
from pipelines.curate.model import gradient_kernel, score_kernel
from pipelines.curate.report import SCORES, PassStats

_ROWS_PER_TABLE = 1024


@dataclasses.dataclass(frozen=True)
class LabelNoise:
    """Each record's label is replaced, with probability ``fraction`` (within [0, 1)), by
    one of the other ``classes`` chosen uniformly, from a ``seed``-ed hash of its id."""

    classes: tuple[str, ...]
    fraction: float
    seed: int

    def __post_init__(self):
        if len(self.classes) < 2:
            raise ValueError(f"need at least 2 classes to flip between, got {self.classes}.")
        if not 0 <= self.fraction < 1:
            raise ValueError(f"fraction must be within [0, 1), got {self.fraction}.")

    def observe(self, key: Any, label: str) -> tuple[int, int]:
        """``(true, observed)`` class indices of the record with id ``key`` and ``label``."""
        true = self.classes.index(label)
        digest = hashlib.blake2b(repr((self.seed, key)).encode(), digest_size=16).digest()
        if int.from_bytes(digest[:8], "little") / 2**64 >= self.fraction:
            return true, true
        shift = 1 + int.from_bytes(digest[8:], "little") % (len(self.classes) - 1)
        return true, (true + shift) % len(self.classes)


def examples(batch: pa.RecordBatch | pa.Table, noise: LabelNoise):
    """Keyed kernel inputs: ``((id, true, observed, source, row), {"tokens", "label"})``."""
    tokens = batch.column("tokens")
    tokens = tokens.combine_chunks() if isinstance(tokens, pa.ChunkedArray) else tokens
    offsets = tokens.offsets.to_numpy()
    values = tokens.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    keys, labels = batch.column("id").to_pylist(), batch.column("label").to_pylist()
    sources, rows = batch.column("source").to_pylist(), batch.column("row").to_pylist()
    for i, (key, label) in enumerate(zip(keys, labels, strict=True)):
        true, observed = noise.observe(key, label)
        element = {"tokens": values[offsets[i] : offsets[i + 1]], "label": np.int32(observed)}
        yield (key, true, observed, sources[i], rows[i]), element


def filed_by_origin(record: bj.FailedElement) -> bj.FailedElement:
    """A pass's dead letter (keyed by :func:`examples`' key) filed under the record's id and
    the input file and row it was read from; other dead letters as they are."""
    if record.key_type is None and isinstance(record.key, tuple) and len(record.key) == 5:
        key, _, _, source, row = record.key
        return record.with_origin(key=key, source=source, row=row)
    return record


def write_dead_letters(dead, output: str, name: str) -> None:
    """Dead letters as JSON lines under ``OUTPUT/_failed/NAME-*.jsonl`` (no file if none),
    each counted under ``dead_letters_STAGE``."""
    path = FileSystems.join(output, "_failed", name)
    filed = dead | f"{name}Origins" >> beam.Map(filed_by_origin)
    _ = filed | f"{name}DeadLetters" >> jobs.WriteDeadLetters(path, metrics_namespace="curate")


def run_pipeline(pipeline: beam.Pipeline):
    result = pipeline.run()
    result.wait_until_finish()
    return result


@dataclasses.dataclass(frozen=True)
class Job:
    """What every pass needs: where things are, the labels, the batching, the options."""

    output: str
    noise: LabelNoise
    bucketing: bj.Bucketing
    options: PipelineOptions
    compilation_cache_dir: str | None

    def params_path(self, step: int) -> str:
        return FileSystems.join(self.output, "passes", f"params-{step:03d}.npz")

    def gradient_path(self, step: int) -> str:
        return FileSystems.join(self.output, "passes", f"gradient-{step:03d}.npz")

    def kernel(self, transform, fn, step: int, **kwargs):
        """``transform`` (ReduceKernel or RunKernel) of ``fn`` at ``params-step``, keyed."""
        spec = {
            "tokens": bj.ArraySpec(("L",), np.int32),
            "label": bj.ArraySpec((), np.int32, valid_range=(0, len(self.noise.classes))),
        }
        options = bj.KernelOptions(
            bucketing=self.bucketing,
            load_params=functools.partial(bj.read_params, self.params_path(step)),
            validation=bj.Validation(check_outputs_finite=True),
            compilation_cache_dir=self.compilation_cache_dir,
        )
        return transform(fn, spec=spec, keyed=True, options=options, **kwargs)

    def examples(self, pipeline: beam.Pipeline):
        """The records as keyed kernel inputs; their row groups are spread over workers."""
        records = FileSystems.join(self.output, "data", "records-*.parquet")
        return (
            pipeline
            | "ReadRecords" >> bj.ReadArrowBatches(records)
            | "Examples" >> beam.FlatMap(examples, self.noise)
        )


def _save_reduction(reduction: bj.Reduction, path: str) -> None:
    if reduction.total is None:
        raise bj.KernelError(
            "no record reached the gradient sum (all were dead-lettered); see _failed/"
        )
    bj.write_params({"total": reduction.total, "count": np.int64(reduction.count)}, path)


def gradient_pass(job: Job, step: int) -> tuple[dict, PassStats]:
    """One pipeline run: the full-batch mean gradient at ``params-step``, and its stats."""
    started = time.perf_counter()
    pipeline = beam.Pipeline(options=job.options)
    reduce = job.kernel(bj.ReduceKernel, gradient_kernel, step)
    total, dead = job.examples(pipeline) | "FullBatchGradient" >> reduce.with_exception_handling()
    _ = total | "SaveGradient" >> beam.Map(_save_reduction, job.gradient_path(step))
    write_dead_letters(dead, job.output, f"pass-{step:03d}")
    kernel = bj.summarize(run_pipeline(pipeline))
    saved = bj.read_params(job.gradient_path(step))
    count, total = int(saved["count"].item()), saved["total"]
    grad = {k: np.asarray(v, np.float64) / count for k, v in total["grad"].items()}
    stats = PassStats(
        loss=total["loss"].item() / count,
        accuracy=total["correct"].item() / count,
        count=count,
        dead_letters=kernel.dead_letters,
        compiles=kernel.compiles,
        seconds=time.perf_counter() - started,
    )
    return grad, stats


def _scores_table(rows, schema: pa.Schema, classes) -> pa.Table:
    names = np.asarray(classes, dtype=object)
    true = np.array([k[1] for k, _ in rows])
    observed = np.array([k[2] for k, _ in rows])
    columns = {
        "id": pa.array([k[0] for k, _ in rows], schema.field("id").type),
        "label": pa.array(names[observed].tolist(), pa.string()),
        "true_label": pa.array(names[true].tolist(), pa.string()),
        "flipped": pa.array(true != observed),
        **{s: pa.array(np.array([o[s] for _, o in rows], np.float32)) for s in SCORES},
        "predicted": pa.array(names[[int(o["predicted"]) for _, o in rows]].tolist()),
    }
    return pa.Table.from_pydict(columns, schema=schema)


def score_pass(job: Job, step: int, id_type: pa.DataType) -> Any:
    """One pipeline run: every record's scores at ``params-step``, to ``scores-*.parquet``;
    returns the finished ``PipelineResult`` (for its kernel metrics)."""
    pipeline = beam.Pipeline(options=job.options)
    score = job.kernel(bj.RunKernel, score_kernel, step, batched=True)
    results, dead = job.examples(pipeline) | "Score" >> score.with_exception_handling()
    fields = [("id", id_type), ("label", pa.string()), ("true_label", pa.string())]
    fields += [("flipped", pa.bool_()), *[(s, pa.float32()) for s in SCORES]]
    schema = pa.schema([*fields, ("predicted", pa.string())])
    path = FileSystems.join(job.output, "scores")
    _ = (
        results
        | "BatchScores" >> beam.BatchElements(_ROWS_PER_TABLE, _ROWS_PER_TABLE)
        | "ScoresToArrow" >> beam.Map(_scores_table, schema, job.noise.classes)
        | "WriteScores" >> WriteToParquetBatched(path, schema, file_name_suffix=".parquet")
    )
    write_dead_letters(dead, job.output, "score")
    return run_pipeline(pipeline)
