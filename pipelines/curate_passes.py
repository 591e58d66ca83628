"""The curation job's passes over its records: each one Beam pipeline run, any runner.

A training pass sums every record's loss gradient with ``beam_jax.ReduceKernel`` (bucketed,
padded, masked; partial sums combined across bundles and workers) at the parameters the
driver saved for that step, and writes the sum to a file for the driver. The scoring pass
runs ``beam_jax.RunKernel`` over the same records for their GraNd and EL2N scores and writes
them to Parquet. Records that fail in a kernel are dead letters under ``_failed/``.

Example:
    >>> grad, stats = gradient_pass(job, step=0)  # doctest: +SKIP
    >>> stats.loss, stats.count  # doctest: +SKIP
    (2.302..., 1755)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.parquetio import ReadFromParquetBatched, WriteToParquetBatched
from apache_beam.options.pipeline_options import PipelineOptions

import beam_jax as bj
from pipelines import curate_data as data
from pipelines import curate_model as cm
from pipelines.embed import write as tp

__all__ = ["SCORES", "Job", "PassStats", "gradient_pass", "save_params", "score_pass"]

SCORES = ("grand", "el2n", "loss")
_ROWS_PER_TABLE = 1024


def write_dead_letters(dead, output: str, name: str) -> None:
    """Dead letters as JSON lines under ``OUTPUT/_failed/NAME-*.jsonl`` (no file if none)."""
    _ = (
        dead
        | f"{name}ToJson" >> beam.Map(lambda record: tp.dead_letter_json(record))
        | f"{name}WriteFailed"
        >> beam.io.WriteToText(
            FileSystems.join(output, "_failed", name), file_name_suffix=".jsonl", skip_if_empty=True
        )
    )


@dataclasses.dataclass(frozen=True)
class Job:
    """What every pass needs: where things are, the labels, the batching, the options."""

    output: str
    noise: data.LabelNoise
    bucketing: bj.Bucketing
    options: PipelineOptions
    compilation_cache_dir: str | None

    @property
    def records(self) -> str:
        return FileSystems.join(self.output, "data", "records-*.parquet")

    def params_path(self, step: int) -> str:
        return FileSystems.join(self.output, "passes", f"params-{step:03d}.npz")

    def gradient_path(self, step: int) -> str:
        return FileSystems.join(self.output, "passes", f"gradient-{step:03d}.npz")

    def kernel_options(self, step: int) -> bj.KernelOptions:
        """What both passes' kernels share: batching, checks, cache, and ``params-step``."""
        return bj.KernelOptions(
            bucketing=self.bucketing,
            load_params=functools.partial(bj.read_params, self.params_path(step)),
            validation=bj.Validation(check_outputs_finite=True),
            compilation_cache_dir=self.compilation_cache_dir,
        )

    @property
    def spec(self) -> dict:
        return {
            "tokens": bj.ArraySpec(("L",), np.int32),
            "label": bj.ArraySpec((), np.int32, valid_range=(0, len(self.noise.classes))),
        }


def read_examples(pipeline: beam.Pipeline, job: Job):
    """The records as keyed kernel inputs, spread over the workers.

    A few record files are read by few workers; the reshuffle of their row groups (256
    records each) lets every worker sum its share of the gradient.
    """
    return (
        pipeline
        | "ReadRecords" >> ReadFromParquetBatched(job.records)
        | "SpreadRowGroups" >> beam.Reshuffle()
        | "Examples" >> beam.FlatMap(data.examples, job.noise)
    )


def save_params(params: dict, path: str) -> None:
    """``beam_jax.write_params``, creating a local directory first."""
    if "://" not in path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    bj.write_params(params, path)


def _save_reduction(reduction: bj.Reduction, path: str) -> None:
    if reduction.total is None:
        raise bj.KernelError(
            "no record reached the gradient sum (all were dead-lettered); see _failed/"
        )
    save_params({"total": reduction.total, "count": np.int64(reduction.count)}, path)


@dataclasses.dataclass(frozen=True)
class PassStats:
    """One full-batch pass: the loss and accuracy at the parameters it started from.

    Attributes:
        loss: Mean cross-entropy against the observed labels.
        accuracy: Share of records whose predicted class is their observed label.
        count: Records summed.
        dead_letters: Records dead-lettered in this pass (e.g. a non-finite gradient).
        compiles: Batch shapes compiled (or loaded from the compilation cache).
        seconds: Wall time of the pass, pipeline start-up included.
    """

    loss: float
    accuracy: float
    count: int
    dead_letters: int
    compiles: int
    seconds: float


def run_pipeline(pipeline: beam.Pipeline):
    """Run ``pipeline`` to completion; returns its result (for metrics)."""
    result = pipeline.run()
    result.wait_until_finish()
    return result


def gradient_pass(job: Job, step: int) -> tuple[dict, PassStats]:
    """One pipeline run: the full-batch mean gradient at ``params-step``.

    Returns:
        The mean gradient (a dict like the parameters) and the pass's statistics.
    """
    started = time.perf_counter()
    pipeline = beam.Pipeline(options=job.options)
    total, dead = (
        read_examples(pipeline, job)
        | "FullBatchGradient"
        >> bj.ReduceKernel(
            cm.gradient_kernel, spec=job.spec, keyed=True, options=job.kernel_options(step)
        ).with_exception_handling()
    )
    _ = total | "SaveGradient" >> beam.Map(_save_reduction, job.gradient_path(step))
    write_dead_letters(dead, job.output, f"pass-{step:03d}")
    kernel = bj.summarize(run_pipeline(pipeline))
    saved = bj.read_params(job.gradient_path(step))
    count = int(saved["count"].item())
    total = saved["total"]
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


def _scores_table(rows: Sequence[tuple[tuple, dict]], schema: pa.Schema, classes) -> pa.Table:
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


def _scores_schema(id_type: pa.DataType) -> pa.Schema:
    return pa.schema(
        [("id", id_type), ("label", pa.string()), ("true_label", pa.string()),
         ("flipped", pa.bool_())]
        + [(s, pa.float32()) for s in SCORES]
        + [("predicted", pa.string())]
    )  # fmt: skip


def score_pass(job: Job, step: int, id_type: pa.DataType) -> bj.Summary:
    """One pipeline run: every record's scores at ``params-step``, to ``scores-*.parquet``."""
    pipeline = beam.Pipeline(options=job.options)
    results, dead = (
        read_examples(pipeline, job)
        | "Score"
        >> bj.RunKernel(
            cm.score_kernel,
            spec=job.spec,
            keyed=True,
            options=job.kernel_options(step),
            batched=True,
        ).with_exception_handling()
    )
    schema = _scores_schema(id_type)
    _ = (
        results
        | "BatchScores"
        >> beam.BatchElements(min_batch_size=_ROWS_PER_TABLE, max_batch_size=_ROWS_PER_TABLE)
        | "ScoresToArrow" >> beam.Map(_scores_table, schema, job.noise.classes)
        | "WriteScores"
        >> WriteToParquetBatched(
            FileSystems.join(job.output, "scores"), schema, file_name_suffix=".parquet"
        )
    )
    write_dead_letters(dead, job.output, "score")
    return bj.summarize(run_pipeline(pipeline))
