"""The runner matrix job: every beam_jax transform, with bad records, in one pipeline.

One pipeline per runner keeps the number of job submissions (each costs a job service
round trip and worker start-up) low. Its branches read the elements of
``tests._runner_job`` (values are small multiples of 1/4, so every sum is exact whatever the
batching): ``RunKernel`` (bundle mode), ``RunKernel`` in cross-bundle mode,
``RunKernelOnArrow`` over a Parquet file, and ``ReduceKernel`` over the whole input and per
fixed window. Each branch writes its results and its dead letters as sorted, deterministic
text lines, so outputs must be byte-identical across runners.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence

import apache_beam as beam
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window

import beam_jax as bj
from tests import _runner_job as job

# Each branch counts under its own metrics namespace, so summaries can be read per branch.
BRANCHES = ("run", "cross_bundle", "arrow", "reduce", "reduce_windowed")
WINDOW_S = 20  # element i has timestamp i: windows [0, 20), [20, 40), [40, 60)


def write_parquet(path: str) -> None:
    """The job's elements as a Parquet file of ``id`` and ``x`` (``list<list<float>>``)."""
    ids, xs = [], []
    for i in range(job.N):
        _, element = job.make_element(i)
        ids.append(i)
        xs.append(element["x"].tolist())
    table = pa.table(
        {"id": pa.array(ids, pa.int64()), "x": pa.array(xs, pa.list_(pa.list_(pa.float32())))}
    )
    pq.write_table(table, path, row_group_size=7)


def sum_kernel(params, element, lengths):
    """The masked, scaled column sums of one element (the part ``ReduceKernel`` adds up)."""
    x = element["x"]
    mask = bj.length_mask(lengths["L"], x.shape[0]).astype(jnp.float32)[:, None]
    return {"sum": jnp.sum(x * mask, axis=0) * params["scale"]}


def _options(namespace: str, output_spec=None, compilation_cache_dir=None) -> dict:
    """A branch's kernel options; its metrics count under ``namespace``."""
    return dict(
        spec=job.SPEC,
        **({} if output_spec is None else {"output_spec": output_spec}),
        bucketing=job.BUCKETING,
        validation=job.VALIDATION,
        load_params=job.load_params,
        metrics_namespace=namespace,
        compilation_cache_dir=compilation_cache_dir,
    )


def arrow_lines(batch: pa.RecordBatch) -> list[str]:
    """One line per result row of a ``RunKernelOnArrow`` output batch, as ``result_line``."""
    rows = []
    columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    for r in range(batch.num_rows):
        out = {
            "sum": np.asarray(columns["sum"][r], np.float32),
            "rows": np.asarray(columns["rows"][r], np.float32).reshape(-1, job.D),
        }
        rows.append(job.result_line((columns["id"][r], out)))
    return rows


def reduction_line(reduction: bj.Reduction, w=beam.DoFn.WindowParam) -> str:
    start = float(w.start) if isinstance(w, window.IntervalWindow) else None
    total = None if reduction.total is None else job._hex(reduction.total["sum"])
    return json.dumps({"window": start, "count": reduction.count, "sum": total}, sort_keys=True)


def _write(pcoll, out_dir: str, name: str):
    return pcoll | f"Write{name}" >> beam.io.WriteToText(os.path.join(out_dir, name))


def build(
    pipeline: beam.Pipeline,
    out_dir: str,
    parquet_path: str,
    branches: Sequence[str] = BRANCHES,
    compilation_cache_dir: str | None = None,
) -> None:
    """Add the ``branches`` (default: every one) to ``pipeline``; each writes
    ``out_dir/<branch>*`` and ``out_dir/<branch>_dead*``. Their kernels share
    ``compilation_cache_dir``, if given."""
    options = functools.partial(_options, compilation_cache_dir=compilation_cache_dir)
    elements = (
        pipeline | "Indices" >> beam.Create(range(job.N)) | "Make" >> beam.Map(job.make_element)
    )
    run = bj.RunKernel(job.kernel, keyed=True, **options("run", job.OUTPUT_SPEC))
    make = {  # each branch is applied only if asked for
        "run": lambda: elements | "Run" >> run.with_exception_handling(),
        "cross_bundle": lambda: (
            elements
            | "CrossBundle"
            >> bj.RunKernel(job.kernel, keyed=True, **options("cross_bundle", job.OUTPUT_SPEC))
            .with_cross_bundle_batching(max_wait_s=1.0, shards=2)
            .with_exception_handling()
        ),
        "arrow": lambda: (
            pipeline
            | "ReadArrow" >> bj.ReadArrowBatches(parquet_path, max_rows=5)
            | "Arrow"
            >> bj.RunKernelOnArrow(
                job.kernel,
                columns=bj.ArrowColumns(leaves={"x": "x"}, id="id"),
                **options("arrow", job.OUTPUT_SPEC),
            ).with_exception_handling()
        ),
        "reduce": lambda: (
            elements
            | "Reduce"
            >> bj.ReduceKernel(
                sum_kernel, keyed=True, **options("reduce")
            ).with_exception_handling()
        ),
        "reduce_windowed": lambda: (
            elements
            | "Stamp" >> beam.Map(lambda e: window.TimestampedValue(e, e[0]))
            | "Windows" >> beam.WindowInto(window.FixedWindows(WINDOW_S))
            | "ReduceWindowed"
            >> bj.ReduceKernel(
                sum_kernel, keyed=True, **options("reduce_windowed")
            ).with_exception_handling()
        ),
    }
    to_lines = {
        "run": beam.Map(job.result_line),
        "cross_bundle": beam.Map(job.result_line),
        "arrow": beam.FlatMap(arrow_lines),
        "reduce": beam.Map(reduction_line),
        "reduce_windowed": beam.Map(reduction_line),
    }
    for name in branches:
        results, dead = make[name]()
        _write(results | f"Lines{name}" >> to_lines[name], out_dir, name)
        _write(dead | f"DeadLines{name}" >> beam.Map(job.dead_letter_line), out_dir, f"{name}_dead")


def run(
    argv: Sequence[str],
    out_dir: str,
    parquet_path: str,
    *,
    timeout_ms: int | None = None,
    branches: Sequence[str] = BRANCHES,
    compilation_cache_dir: str | None = None,
):
    """Build and run the job (its ``branches``) with pipeline options ``argv``; returns the
    finished result."""
    pipeline = beam.Pipeline(options=PipelineOptions(list(argv)))
    build(pipeline, out_dir, parquet_path, branches, compilation_cache_dir)
    result = pipeline.run()
    state = result.wait_until_finish(duration=timeout_ms)
    if state != beam.runners.runner.PipelineState.DONE:
        result.cancel()
        raise RuntimeError(f"the job ended in state {state} within {timeout_ms} ms, not DONE.")
    return result


def read_outputs(out_dir: str, branches: Sequence[str] = BRANCHES) -> dict[str, list[str]]:
    """``{branch or branch_dead: sorted lines}``: what runners must agree on, byte for byte."""
    return {
        name: job.read_lines(out_dir, name + "-")
        for branch in branches
        for name in (branch, f"{branch}_dead")
    }
