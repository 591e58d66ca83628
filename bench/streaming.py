"""Streaming's small bundles: bundle mode against cross-bundle mode and one large bundle.

    python bench/streaming.py --quick                   # 400 records, one run per mode
    python bench/streaming.py --elements 4000 --per-bundle 10 --repeat 3

Streaming runners hand a DoFn bundles of a handful of elements: bundle mode then runs
batches of a row or two, cross-bundle mode (``with_cross_bundle_batching``) buffers rows
across bundles in state. ``bench/run.py``'s heavy kernel runs the same records in each mode,
side by side in one process, ``--repeat`` times in alternating order (medians shown):

* on the BundleBasedDirectRunner through ``beam_jax.testing.StreamTest`` (``--per-bundle``
  records every ``--arrival-ms`` of stream time): ``large_bundle`` and ``small_bundle``
  (bundle mode), ``cross_bundle`` (cross-bundle mode, small bundles);
* on the FnApiRunner: ``fnapi_large`` and ``fnapi_cross`` (one large bundle, each mode),
  ``fnapi_small`` and ``fnapi_small_cross`` (a splittable source deferring its range after
  each ``--per-bundle`` records, so each residual is a bundle).

It prints records/s (compiles excluded) against the runner's large bundle, batch fill,
padding, batches, buffer waits (p50, p99) and flush causes, on this process's default
backend. Every mode's outputs are checked against the first one's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if not __package__:  # python bench/streaming.py: the repository's root in the place of bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import apache_beam as beam  # noqa: E402
import numpy as np  # noqa: E402
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker  # noqa: E402
from apache_beam.testing.test_stream import TestStream  # noqa: E402

import beam_jax as bj  # noqa: E402
from beam_jax.testing import StreamTest  # noqa: E402
from bench._lib.harness import device  # noqa: E402
from bench._lib.records import DIM, KERNELS, MAX_LEN, load_params, sample_lengths  # noqa: E402

MODES = ("large_bundle", "small_bundle", "cross_bundle",
         "fnapi_large", "fnapi_cross", "fnapi_small", "fnapi_small_cross")  # fmt: skip
CROSS = ("cross_bundle", "fnapi_cross", "fnapi_small_cross")
SPEC = {"x": bj.ArraySpec(("L", DIM), np.float32)}


def indices(n: int, per_bundle: int, arrival_ms: float) -> TestStream:
    """``range(n)`` as bundles of ``per_bundle`` (0: one bundle), ``arrival_ms`` apart."""
    stream = TestStream()
    for start in range(0, n, per_bundle or n):
        stream = stream.add_elements(list(range(start, min(n, start + (per_bundle or n)))))
        stream = stream.advance_processing_time(arrival_ms / 1000)
    return stream.advance_watermark_to_infinity()


def record(i: int, lengths: np.ndarray) -> tuple[int, dict]:
    rng = np.random.default_rng(i)
    return i, {"x": rng.standard_normal((int(lengths[i]), DIM), dtype=np.float32)}


class _Range(beam.transforms.core.RestrictionProvider):
    def initial_restriction(self, n: int) -> OffsetRange:
        return OffsetRange(0, n)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, n: int, restriction: OffsetRange) -> int:
        return restriction.size()


_RANGE = beam.DoFn.RestrictionParam(_Range())


class SmallBundles(beam.DoFn):
    """``range(n)`` from one ``n``, ``per_bundle`` indices per bundle: after that many it
    defers the rest of its range, which the FnApiRunner runs as a new bundle."""

    def __init__(self, per_bundle: int):
        self._per_bundle = per_bundle

    def process(self, n: int, tracker=_RANGE):
        i, sent = tracker.current_restriction().start, 0
        while tracker.try_claim(i):
            yield i
            i, sent = i + 1, sent + 1
            if sent == self._per_bundle:
                tracker.defer_remainder()
                return


class Keep(beam.DoFn):
    """Outputs back to the driver (the FnApiRunner runs in this process)."""

    store: dict[str, dict[int, np.ndarray]] = {}

    def __init__(self, name: str):
        self._name = name

    def process(self, kv):
        Keep.store.setdefault(self._name, {})[kv[0]] = np.asarray(kv[1])


def run_mode(mode: str, args, lengths: np.ndarray, bucketing: bj.Bucketing) -> dict:
    """One run of ``mode``: its rate (compiles excluded) and what ``bj.summarize`` says."""
    per_bundle = 0 if mode == "large_bundle" else args.per_bundle
    kernel = bj.RunKernel(
        KERNELS["heavy"], spec=SPEC, bucketing=bucketing, load_params=load_params, keyed=True
    )
    test = None if mode.startswith("fnapi_") else StreamTest()

    def cross(transform):
        return transform.with_cross_bundle_batching(
            max_wait_s=args.max_wait_s,
            shards=args.shards,
            clock=time.time if test is None else test.clock,
        )

    transform = cross(kernel) if mode in CROSS else kernel
    if test is not None:
        p, source = (
            test.pipeline,
            test.pipeline | indices(args.elements, per_bundle, args.arrival_ms),
        )
    else:
        p = beam.Pipeline(runner="FnApiRunner")
        if mode.startswith("fnapi_small"):
            source = p | beam.Create([args.elements]) | beam.ParDo(SmallBundles(per_bundle))
        else:  # one large bundle: what the state and shuffle cost
            source = p | "Indices" >> beam.Create(range(args.elements))
    Keep.store.pop(mode, None)
    _ = source | beam.Map(record, lengths) | transform | beam.ParDo(Keep(mode))
    start = time.perf_counter()
    if test is not None:
        with test:
            pass  # the pipeline runs as the block ends
        summary = test.summary
    else:
        result = p.run()
        result.wait_until_finish()
        summary = bj.summarize(result)
    elapsed = time.perf_counter() - start
    if summary.results != args.elements or len(Keep.store[mode]) != args.elements:
        raise AssertionError(f"{mode}: {summary.results} results for {args.elements} records")
    b = summary.buffering
    return {
        "elapsed_s": elapsed,
        "elements_per_s": args.elements / max(elapsed - summary.compile_seconds, 1e-9),
        "batches": summary.batches,
        "batch_fill": summary.batch_fill,
        "padding_ratio": summary.padding_ratio,
        "flushes": dict(b.flushes) if b and mode in CROSS else {},
        "wait_p50_ms": b.p50_wait_ms if b and mode in CROSS else None,
        "wait_p99_ms": b.p99_wait_ms if b and mode in CROSS else None,
    }


def _median_run(runs: list[dict]) -> dict:
    """The run with the median rate (the slower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r["elements_per_s"], reverse=True)
    out = dict(ordered[len(ordered) // 2])
    rates = [r["elements_per_s"] for r in runs]
    out["spread"] = (max(rates) - min(rates)) / out["elements_per_s"]
    out["runs_elements_per_s"] = [round(x, 1) for x in rates]
    return out


def _table(results: dict) -> str:
    base = {mode: results.get(mode, {}).get("elements_per_s", float("nan"))
            for mode in ("large_bundle", "fnapi_large")}  # fmt: skip
    lines = [f"{'mode':<18}{'elem/s':>9}{'spread':>8}{'x large':>9}{'fill':>7}{'padding':>9}"
             f"{'batches':>9}{'wait p50':>10}{'wait p99':>10}  flushes"]  # fmt: skip
    for mode, r in results.items():
        large = base["fnapi_large" if mode.startswith("fnapi_") else "large_bundle"]
        waits = "".join(
            f"{'-':>10}" if r[k] is None else f"{r[k]:>8.0f}ms"
            for k in ("wait_p50_ms", "wait_p99_ms")
        )
        flushes = ", ".join(f"{k} {v}" for k, v in r["flushes"].items()) or "-"
        rate = r["elements_per_s"]
        lines.append(
            f"{mode:<18}{rate:>9.0f}{r['spread']:>8.0%}{rate / large:>9.2f}"
            f"{r['batch_fill']:>7.2f}{r['padding_ratio']:>9.2f}{r['batches']:>9}{waits}  {flushes}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="400 records, one run per mode")
    parser.add_argument("--per-bundle", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-buckets", type=int, default=8)
    parser.add_argument("--max-wait-s", type=float, default=1.0)
    parser.add_argument("--arrival-ms", type=float, default=10.0, help="between bundles")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (medians)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.elements, args.repeat = 400, 1
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(set(modes) - set(MODES))}; choose from {MODES}")
    lengths = sample_lengths(args.elements, args.seed)
    bounds = bj.plan_boundaries(lengths[:4096], args.num_buckets, max_size=MAX_LEN)
    bucketing = bj.Bucketing(
        boundaries={"L": bounds}, batch_size=args.batch_size, max_padded_size=32768
    )
    print(f"{args.elements} records, heavy kernel on {device()}, buckets {list(bounds)}, batch "
          f"size {args.batch_size}, {args.per_bundle} per small bundle every {args.arrival_ms} ms, "
          f"max wait {args.max_wait_s} s, {args.shards} shard(s)", flush=True)  # fmt: skip
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for rep in range(args.repeat):
        # Alternate the order, so no mode always runs first (or last) in the process.
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            runs[mode].append(run_mode(mode, args, lengths, bucketing))
            print(f"  {mode}: {runs[mode][-1]['elapsed_s']:.1f} s", flush=True)
    results = {mode: _median_run(rs) for mode, rs in runs.items()}
    reference = Keep.store[modes[0]]
    for mode in modes[1:]:
        worst = max(float(np.max(np.abs(Keep.store[mode][i] - reference[i]))) for i in reference)
        if worst > 1e-3:
            raise AssertionError(f"{mode}'s outputs differ from {modes[0]}'s by up to {worst:.3g}")
    from bench._lib.machine import fingerprint, format_fingerprint

    print(_table(results))
    print(f"medians of {args.repeat} runs each; {format_fingerprint(fingerprint())}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
