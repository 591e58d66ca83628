"""Small bundles: bundle mode vs cross-bundle mode vs one large bundle, heavy kernel.

Streaming runners hand a DoFn bundles of a handful of elements; bundle mode then runs
batches of one or two rows per bucket. This benchmark runs on the BundleBasedDirectRunner
(``--streaming``), the local runner that behaves like a streaming one: a ``TestStream``
emits record indices in bundles of ``--per-bundle``, each bundle ``--arrival-ms`` of
processing time after the previous one (the stream's own clock, shared with the transform,
so waits are measured in stream time), and every bundle flows through the pipeline as a
bundle. The modes run on the same records, side by side in one process, ``--repeat``
times each in alternating order (forward, then backward, ...); the table shows medians:

* ``large_bundle``: bundle mode, all records in one bundle (today's batch run);
* ``small_bundle``: bundle mode, bundles of ``--per-bundle`` records;
* ``cross_bundle``: cross-bundle mode (``with_cross_bundle_batching``), same small bundles;
* ``fnapi_large``, ``fnapi_cross``: bundle mode and cross-bundle mode on the FnApiRunner,
  one large bundle: what cross-bundle mode's extra shuffle and state cost on a fast runner
  (the direct runner's own per-element cost of state dominates its ``cross_bundle`` time);
* ``fnapi_small``, ``fnapi_small_cross``: bundle mode and cross-bundle mode on the
  FnApiRunner with bundles of ``--per-bundle`` records: a splittable source defers the rest
  of its range after each ``--per-bundle`` records, and the runner runs each residual as a
  bundle of its own, so the small bundles come without the direct runner's cost per
  element (processing-time waits are wall time here).

The ``x large`` column compares each direct-runner mode with ``large_bundle`` and each
FnApiRunner mode with ``fnapi_large``.

It prints elements/s (wall time, compile time excluded), the ratio to ``large_bundle``, the
mean batch fill, the padding ratio, flush causes and the time elements waited in the buffer
(p50, p99 to the resolution of the wait-bucket counters; stream time). Every run's outputs
are checked against the first run's. ::

    python bench/small_bundles.py --elements 4000 --per-bundle 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import apache_beam as beam  # noqa: E402
import numpy as np  # noqa: E402
import stream_clock  # noqa: E402
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.runners.direct import direct_runner  # noqa: E402
from apache_beam.testing.test_stream import TestStream  # noqa: E402
from data import DIM, MAX_LEN, sample_lengths  # noqa: E402
from fingerprint import fingerprint, format_fingerprint  # noqa: E402
from kernels import KERNELS, load_params  # noqa: E402

import beam_jax as bj  # noqa: E402

# The module whose ``Metrics`` the engine counts with, wherever the package keeps it.
engine_metrics = sys.modules[bj.Summary.__module__]
FLUSH_CAUSES = ("full", "timer", "window_end")  # bj.BufferingSummary.flushes' keys

MODES = (
    "large_bundle",
    "small_bundle",
    "cross_bundle",
    "fnapi_large",
    "fnapi_cross",
    "fnapi_small",
    "fnapi_small_cross",
)
SPEC = {"x": bj.ArraySpec(("L", DIM), np.float32)}


def indices(n: int, per_bundle: int, arrival_ms: float) -> TestStream:
    """``range(n)`` as bundles of ``per_bundle`` (0: one bundle), ``arrival_ms`` apart."""
    stream = TestStream()
    step = per_bundle or n
    for start in range(0, n, step):
        stream = stream.add_elements(list(range(start, min(n, start + step))))
        stream = stream.advance_processing_time(arrival_ms / 1000)
    return stream.advance_watermark_to_infinity()


class _Counter:
    def __init__(self, totals: dict, name: str):
        self._totals, self._name = totals, name

    def inc(self, n: int = 1) -> None:
        self._totals[self._name] = self._totals.get(self._name, 0) + n

    def update(self, value: int) -> None:  # a distribution: sum, count, max
        s, c, m = self._totals.get(self._name, (0, 0, 0))
        self._totals[self._name] = (s + value, c + 1, max(m, value))


class InProcessMetrics:
    """Stands in for ``apache_beam.metrics.Metrics`` in ``beam_jax._src.engine.metrics``: the
    direct runner's streaming mode keeps only one bundle's metric updates per step, so the
    benchmark counts in this process (the direct runner runs DoFns here)."""

    totals: dict = {}

    @classmethod
    def counter(cls, namespace, name):
        return _Counter(cls.totals, name)

    distribution = counter


def wait_quantile(totals: dict, q: float) -> float:
    """Upper bound of the ``q`` quantile of buffer waits, from the wait-bucket counters
    (``buffer_wait_ms_le_<bound>`` and ``buffer_wait_ms_over``), as ``bj.BufferingSummary``
    reports it."""
    counts = sorted(
        (float(k.rsplit("_", 1)[1]), n)
        for k, n in totals.items()
        if k.startswith("buffer_wait_ms_le_")
    )
    counts.append((float("inf"), totals.get("buffer_wait_ms_over", 0)))
    total = sum(n for _, n in counts)
    if not total:
        return float("nan")
    seen = 0
    for bound, n in counts:
        seen += n
        if seen >= q * total:
            return bound
    return float("inf")


def summary(totals: dict) -> dict:
    waits = totals.get("buffer_wait_ms", (0, 0, float("nan")))
    return {
        "results": totals.get("results", 0),
        "batches": totals.get("batches", 0),
        "compile_s": totals.get("compile_ms", 0) / 1000,
        "batch_fill": totals.get("batch_rows", 0) / max(totals.get("batch_capacity", 0), 1),
        "padding_ratio": totals.get("padded_size", 0) / max(totals.get("real_size", 0), 1),
        "flushes": {c: totals.get(f"flushes_{c}", 0) for c in FLUSH_CAUSES},
        "wait_p50_ms": min(wait_quantile(totals, 0.5), float(waits[2])),
        "wait_p99_ms": min(wait_quantile(totals, 0.99), float(waits[2])),
        "wait_mean_ms": waits[0] / waits[1] if waits[1] else float("nan"),
        "wait_max_ms": float(waits[2]) if waits[1] else float("nan"),
    }


def record(i: int, lengths: np.ndarray) -> tuple[int, dict]:
    rng = np.random.default_rng(i)
    return i, {"x": rng.standard_normal((int(lengths[i]), DIM), dtype=np.float32)}


class Keep(beam.DoFn):
    """Outputs back to the driver (the FnApiRunner runs in this process)."""

    store: dict[str, dict[int, np.ndarray]] = {}

    def __init__(self, name: str):
        self._name = name

    def process(self, kv):
        Keep.store.setdefault(self._name, {})[kv[0]] = np.asarray(kv[1])


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


def run_mode(mode: str, args, lengths: np.ndarray, bucketing: bj.Bucketing) -> dict:
    per_bundle = 0 if mode == "large_bundle" else args.per_bundle
    fnapi = mode.startswith("fnapi_")
    transform = bj.RunKernel(
        KERNELS["heavy"], spec=SPEC, bucketing=bucketing, load_params=load_params, keyed=True
    )
    if mode in ("cross_bundle", "fnapi_cross", "fnapi_small_cross"):
        transform = transform.with_cross_bundle_batching(
            max_wait_s=args.max_wait_s,
            shards=args.shards,
            clock=time.time if fnapi else stream_clock.stream_time,
        )
    stream_clock.reset()
    if fnapi:
        p = beam.Pipeline(runner="FnApiRunner", options=PipelineOptions([]))
        if mode.startswith("fnapi_small"):
            source = p | beam.Create([args.elements]) | beam.ParDo(SmallBundles(per_bundle))
        else:  # one large bundle: what the state and shuffle cost
            source = p | "Indices" >> beam.Create(range(args.elements))
    else:
        p = beam.Pipeline(
            runner=direct_runner.BundleBasedDirectRunner(),
            options=PipelineOptions(["--streaming"]),
        )
        source = p | "Indices" >> indices(args.elements, per_bundle, args.arrival_ms)
    _ = (
        source
        | "Record" >> beam.Map(record, lengths)
        | transform
        | "Keep" >> beam.ParDo(Keep(mode))
    )
    InProcessMetrics.totals = {}
    start = time.perf_counter()
    p.run().wait_until_finish()
    elapsed = time.perf_counter() - start
    out = summary(InProcessMetrics.totals)
    assert out["results"] == args.elements, out
    out["elapsed_s"] = elapsed
    out["elements_per_s"] = args.elements / max(elapsed - out["compile_s"], 1e-9)
    return out


def _median_run(runs: list[dict]) -> dict:
    """The run with the median rate (the slower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r["elements_per_s"], reverse=True)
    out = dict(ordered[len(ordered) // 2])
    rates = [r["elements_per_s"] for r in runs]
    out["spread"] = (max(rates) - min(rates)) / out["elements_per_s"]
    out["runs_elements_per_s"] = [round(x, 1) for x in rates]
    return out


def _table(results: dict) -> str:
    def rate(mode: str) -> float:
        return results[mode]["elements_per_s"] if mode in results else float("nan")

    base, fnapi_base = rate("large_bundle"), rate("fnapi_large")
    head = (
        f"{'mode':<18}{'elem/s':>9}{'spread':>8}{'x large':>9}{'fill':>7}{'padding':>9}"
        f"{'batches':>9}"
        f"{'wait p50':>10}{'wait p99':>10}{'wait max':>10}  flushes (full/timer/window end)"
    )
    lines = [head]
    for mode, r in results.items():
        f = r["flushes"]
        waits = "".join(
            f"{r[k]:>8.0f}ms" if r[k] == r[k] else f"{'-':>10}"
            for k in ("wait_p50_ms", "wait_p99_ms", "wait_max_ms")
        )
        lines.append(
            f"{mode:<18}{r['elements_per_s']:>9.0f}{100 * r['spread']:>7.0f}%"
            f"{r['elements_per_s'] / (fnapi_base if mode.startswith('fnapi_') else base):>9.2f}"
            f"{r['batch_fill']:>7.2f}{r['padding_ratio']:>9.2f}{r['batches']:>9}{waits}"
            f"  {f['full']}/{f['timer']}/{f['window_end']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=4000)
    parser.add_argument("--per-bundle", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-buckets", type=int, default=8)
    parser.add_argument("--max-wait-s", type=float, default=1.0)
    parser.add_argument("--arrival-ms", type=float, default=10.0, help="between bundles")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs per mode; the order alternates (forward, backward, ...); medians",
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    original, engine_metrics.Metrics = engine_metrics.Metrics, InProcessMetrics
    try:
        lengths = sample_lengths(args.elements, args.seed)
        bounds = bj.plan_boundaries(lengths[:4096], args.num_buckets, max_size=MAX_LEN)
        bucketing = bj.Bucketing(
            boundaries={"L": bounds}, batch_size=args.batch_size, max_padded_size=32768
        )
        modes = args.modes.split(",")
        print(
            f"{args.elements} records, heavy kernel, buckets {list(bounds)}, batch size "
            f"{args.batch_size}, {args.per_bundle} per small bundle every {args.arrival_ms} ms, "
            f"max wait {args.max_wait_s}s, {args.shards} shard(s)",
            flush=True,
        )
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for rep in range(args.repeat):
            # Alternate the order, so no mode always runs first (or last) in the process.
            for mode in modes if rep % 2 == 0 else modes[::-1]:
                runs[mode].append(run_mode(mode, args, lengths, bucketing))
                print(f"  {mode}: {runs[mode][-1]['elapsed_s']:.1f}s", flush=True)
        results = {mode: _median_run(rs) for mode, rs in runs.items()}
        reference = Keep.store[modes[0]]
        for mode in modes[1:]:
            out = Keep.store[mode]
            assert out.keys() == reference.keys(), mode
            worst = max(float(np.max(np.abs(out[i] - reference[i]))) for i in reference)
            assert worst < 1e-3, (mode, worst)
        print(_table(results))
        print(f"medians of {args.repeat} runs each; {format_fingerprint(fingerprint())}")
    finally:
        engine_metrics.Metrics = original
        stream_clock.restore()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
