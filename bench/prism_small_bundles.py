"""Small bundles on Prism (``--streaming``): bundle mode against cross-bundle mode.

A ``TestStream`` emits the same records three ways: as one bundle (``large``), and in
bundles of ``--per-bundle`` in bundle mode (``small_bundle``) and in cross-bundle mode
(``cross_bundle``). Every mode runs ``--repeats`` times, in turn, after one unmeasured
warm-up job that compiles every shape; each line prints throughput (records over the job's
wall time, submission included), batches, batch fill, padding and, for cross-bundle mode,
the flushes and waits.

Prism must be running (``tools/runners.sh start prism``):

    python bench/prism_small_bundles.py --job-endpoint localhost:8073
"""

from __future__ import annotations

import argparse
import time

import apache_beam as beam
import jax.numpy as jnp
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import window

import beam_jax as bj

D = 4
SPEC = {"x": bj.ArraySpec(("L", D), np.float32)}
MODES = ("large", "small_bundle", "cross_bundle")


def kernel(params, element, lengths):
    """Masked column sums of one ``(L, 4)`` record, scaled."""
    x = element["x"]
    mask = bj.length_mask(lengths["L"], x.shape[0]).astype(jnp.float32)[:, None]
    return jnp.sum(x * mask, axis=0) * params["scale"]


def load_params():
    return {"scale": np.asarray([0.5, 1.0, 2.0, -1.0], np.float32)}


def record(i: int) -> tuple[int, dict[str, np.ndarray]]:
    length = 1 + (7 * i) % 16
    x = ((np.arange(length * D).reshape(length, D) + i) % 13 - 6).astype(np.float32)
    return i, {"x": x * np.float32(0.25)}


def run_mode(mode: str, namespace: str, args) -> dict:
    per = args.elements if mode == "large" else args.per_bundle
    stream = TestStream()
    for start in range(0, args.elements, per):
        stop = min(args.elements, start + per)
        stream.add_elements([window.TimestampedValue(record(i), i) for i in range(start, stop)])
    stream.advance_watermark_to_infinity()
    options = PipelineOptions(
        [
            "--runner=PortableRunner",
            f"--job_endpoint={args.job_endpoint}",
            "--environment_type=LOOPBACK",
            "--streaming",
            "--experiments=prism_disable_sdf_split",
        ]
    )
    run = bj.RunKernel(
        kernel,
        spec=SPEC,
        bucketing=bj.Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=args.batch_size),
        load_params=load_params,
        keyed=True,
        metrics_namespace=namespace,
    )
    if mode == "cross_bundle":
        run = run.with_cross_bundle_batching(max_wait_s=args.max_wait_s, shards=1)
    p = beam.Pipeline(options=options)
    _ = p | stream | run
    began = time.perf_counter()
    result = p.run()
    result.wait_until_finish()
    wall = time.perf_counter() - began
    s = bj.summarize(result, namespace=namespace)
    if s.results != args.elements:
        raise RuntimeError(f"{mode}: {s.results} results for {args.elements} records")
    row = {
        "mode": mode,
        "elem_per_s": args.elements / wall,
        "batches": s.batches,
        "batch_fill": s.batch_fill,
        "padding": s.padding_ratio,
    }
    if mode == "cross_bundle":
        b = s.buffering
        row.update(flushes=b.flushes, p50_wait_ms=b.p50_wait_ms, p99_wait_ms=b.p99_wait_ms)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-endpoint", default="localhost:8073")
    parser.add_argument("--elements", type=int, default=2000)
    parser.add_argument("--per-bundle", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-wait-s", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    run_mode("small_bundle", "warmup", args)  # compiles every shape, in this process
    rows = []
    for r in range(args.repeats):
        for mode in MODES:
            row = run_mode(mode, f"{mode}_{r}", args)
            rows.append(row)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
