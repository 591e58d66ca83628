"""Beam metrics of the kernel transforms, and a summary read back from a finished pipeline."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from typing import Any

from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter

from beam_jax._src.core.dead_letter import METRICS_NAMESPACE, STAGES

NAMESPACE = METRICS_NAMESPACE
# Per-bucket metrics are named "bucket/<label>/<name>", e.g. "bucket/32/elements".
BUCKET_PREFIX = "bucket/"


def bucket_label(bucket: tuple[int, ...]) -> str:
    """A bucket's boundaries as one string: ``(32,)`` -> ``"32"``, ``(16, 64)`` -> ``"16x64"``."""
    return "x".join(str(int(b)) for b in bucket)


class KernelMetrics:
    """The counters one RunKernel DoFn updates (all under one namespace)."""

    def __init__(self, namespace: str = NAMESPACE):
        c = lambda name: Metrics.counter(namespace, name)  # noqa: E731
        self.elements_in = c("elements_in")
        self.results = c("results")
        self.dead_letters = c("dead_letters")
        self.dead_letters_by_stage = {s: c(f"dead_letters_{s}") for s in STAGES}
        self.batches = c("batches")
        self.padded_size = c("padded_size")
        self.real_size = c("real_size")
        self.compiles = c("compiles")
        self.compile_ms = c("compile_ms")
        self.compile_wait_ms = c("compile_wait_ms")
        self.compile_trace_ms = c("compile_trace_ms")
        # Time the host waited for the results of batches it had dispatched: the device's
        # time on the critical path (none where the device keeps ahead of the host).
        self.result_wait_us = c("result_wait_us")
        self.kernel_calls = c("kernel_calls")
        self.kernel_retries = c("kernel_retries")
        self.out_of_memory = c("out_of_memory")
        self.batch_limit_lowered = c("batch_limit_lowered")
        self.batch_latency_ms = Metrics.distribution(namespace, "batch_latency_ms")
        # Out of memory at a batch size FitToMemory chose, and by how much (at least, in
        # percent) XLA's analysis was off (see engine/fit.py).
        self.fit_out_of_memory = c("fit_out_of_memory")
        self.fit_missed_by_pct = Metrics.distribution(namespace, "fit_missed_by_pct")
        # Batch fill: real rows over the bucket's batch limit, for every launched batch.
        self.batch_rows = c("batch_rows")
        self.batch_capacity = c("batch_capacity")
        self.batch_fill_percent = Metrics.distribution(namespace, "batch_fill_percent")

        self._namespace = namespace
        self._per_bucket: dict[tuple[Any, str], Any] = {}
        self._batch_metrics: dict[tuple[int, ...], tuple[Any, ...]] = {}

    def compiled(self, n: int, seconds: float, waited: float = 0.0, traced: float = 0.0) -> None:
        """``n`` shapes compiled in ``seconds``, ``traced`` of them tracing and lowering;
        batches waited ``waited`` seconds for them."""
        if n:
            self.compiles.inc(n)
            self.compile_ms.inc(int(seconds * 1000))
            self.compile_trace_ms.inc(int(traced * 1000))
        if waited > 0:
            self.compile_wait_ms.inc(int(waited * 1000))

    def batch_filled(self, rows: int, capacity: int) -> None:
        """A batch of ``rows`` real rows was launched where ``capacity`` fit."""
        capacity = max(rows, capacity)
        self.batch_rows.inc(rows)
        self.batch_capacity.inc(capacity)
        self.batch_fill_percent.update(100 * rows // capacity if capacity else 0)

    def dead_letter(self, stage: str) -> None:
        self.dead_letters.inc()
        self.dead_letters_by_stage[stage].inc()

    def _bucket(self, bucket: tuple[int, ...], name: str, distribution: bool = False):
        key = (bucket, name)
        metric = self._per_bucket.get(key)
        if metric is None:
            full = f"{BUCKET_PREFIX}{bucket_label(bucket)}/{name}"
            make = Metrics.distribution if distribution else Metrics.counter
            metric = self._per_bucket[key] = make(self._namespace, full)
        return metric

    def batch_succeeded(
        self, bucket: tuple[int, ...], rows: int, padded: int, real: int, latency_ms: int
    ) -> None:
        """One successful kernel call on ``bucket``: its rows, sizes and latency, in the
        totals and in the bucket's own metrics."""
        self.batch_latency_ms.update(latency_ms)
        self.batches.inc()
        self.padded_size.inc(padded)
        self.real_size.inc(real)
        metrics = self._batch_metrics.get(bucket)
        if metrics is None:
            metrics = self._batch_metrics[bucket] = (
                self._bucket(bucket, "elements"),
                self._bucket(bucket, "batches"),
                self._bucket(bucket, "padded_size"),
                self._bucket(bucket, "real_size"),
                self._bucket(bucket, "batch_latency_ms", distribution=True),
            )
        elements, batches, padded_size, real_size, latency = metrics
        elements.inc(rows)
        batches.inc()
        padded_size.inc(padded)
        real_size.inc(real)
        latency.update(latency_ms)

    def bucket_compiles(self, bucket: tuple[int, ...], n: int) -> None:
        """``n`` new batch shapes of ``bucket`` were compiled."""
        self._bucket(bucket, "compiles").inc(n)


# --- cross-bundle mode: flush causes and time waited in Beam state ----------------------

FLUSH_CAUSES = ("full", "timer", "window_end")
"""Why a cross-bundle buffer was flushed: its batch was full, its oldest element waited the
maximum (processing-time timer), or its window ended (event-time timer)."""

WAIT_BOUNDS_MS = (1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700, 1000,
                  1500, 2000, 3000, 5000, 7000, 10000, 15000, 20000, 30000, 60000)  # fmt: skip
"""Upper bounds (ms) of the ``buffer_wait_ms_le_<bound>`` counters: Beam's queryable metrics
have no histogram, so the wait distribution is kept as cumulative-free bucket counters."""


class BufferMetrics:
    """The counters of cross-bundle buffering (same namespace as ``KernelMetrics``)."""

    def __init__(self, namespace: str = NAMESPACE):
        c = lambda name: Metrics.counter(namespace, name)  # noqa: E731
        self.flushes = {cause: c(f"flushes_{cause}") for cause in FLUSH_CAUSES}
        self.buffer_wait_ms = Metrics.distribution(namespace, "buffer_wait_ms")
        self._wait_buckets = [c(f"buffer_wait_ms_le_{b}") for b in WAIT_BOUNDS_MS]
        self._wait_over = c("buffer_wait_ms_over")

    def flushed(self, cause: str, waits_ms: list[int]) -> None:
        """A buffer was flushed for ``cause``; its elements waited ``waits_ms``."""
        self.flushes[cause].inc()
        counts: dict[int, int] = {}
        for wait in waits_ms:
            self.buffer_wait_ms.update(wait)
            i = bisect.bisect_left(WAIT_BOUNDS_MS, wait)
            counts[i] = counts.get(i, 0) + 1
        for i, n in counts.items():
            (self._wait_buckets[i] if i < len(WAIT_BOUNDS_MS) else self._wait_over).inc(n)


@dataclasses.dataclass(frozen=True)
class BufferingSummary:
    """Cross-bundle buffering of a finished pipeline (all zero in bundle mode).

    Attributes:
        flushes: buffers flushed, per cause (``"full"``, ``"timer"``, ``"window_end"``).
        waited: elements that went through a buffer.
        mean_wait_ms, max_wait_ms: time an element waited in its buffer (processing time).
        p50_wait_ms, p99_wait_ms: upper bounds of the median and 99th percentile, to the
            resolution of ``WAIT_BOUNDS_MS`` (and at most ``max_wait_ms``).
    """

    flushes: dict[str, int]
    waited: int
    mean_wait_ms: float
    max_wait_ms: float
    p50_wait_ms: float
    p99_wait_ms: float


def _wait_quantile(totals: dict[str, int], q: float) -> float:
    counts = [totals.get(f"buffer_wait_ms_le_{b}", 0) for b in WAIT_BOUNDS_MS]
    seen = list(itertools.accumulate([*counts, totals.get("buffer_wait_ms_over", 0)]))
    if not seen[-1]:
        return float("nan")
    return float((*WAIT_BOUNDS_MS, float("inf"))[bisect.bisect_left(seen, q * seen[-1])])


def _buffering(totals: dict[str, int], waits: list) -> BufferingSummary:
    total, count, top = waits
    return BufferingSummary(
        flushes={cause: totals.get(f"flushes_{cause}", 0) for cause in FLUSH_CAUSES},
        waited=count,
        mean_wait_ms=total / count if count else float("nan"),
        max_wait_ms=float(top),
        p50_wait_ms=min(_wait_quantile(totals, 0.5), float(top)),
        p99_wait_ms=min(_wait_quantile(totals, 0.99), float(top)),
    )


@dataclasses.dataclass(frozen=True)
class Summary:
    """Totals of a finished pipeline's RunKernel metrics.

    Attributes:
        elements: elements that entered RunKernel.
        results: results emitted.
        dead_letters: dead-letter records emitted, total and per stage.
        batches: kernel calls that succeeded.
        padding_ratio: padded / real size, along ragged axes and counting padded batch rows.
        compiles: distinct shapes compiled, summed over worker processes.
        compile_seconds: time spent compiling, summed over compiles.
        out_of_memory: kernel calls that ran out of memory.
        batch_limit_lowered: times a bucket's batch limit was lowered after out of memory.
        kernel_calls: kernel calls, including failed ones and bisection retries.
        kernel_retries: times a failed batch was split in two and retried, or run again
            whole once a program loaded from the store failed (``Kernel.forget_loaded``).
        mean_batch_latency_ms: mean time from a batch's launch to its results.
        fit_out_of_memory: out-of-memory failures at a batch size ``FitToMemory`` chose.
        fit_missed_by_pct: over those, the least percent by which the memory analysis was
            off (``nan`` when none); see docs/memory.md.
        batch_fill: real rows / batch limit over every launched batch (1.0: all full).
        buffering: cross-bundle buffering (``BufferingSummary``).
        compile_wait_seconds: compile time on the critical path: how long batches waited
            for their shape to compile (or compiled it themselves).
        compile_trace_seconds: of ``compile_seconds``, the time spent tracing the kernel
            and lowering it for XLA: Python holding the interpreter lock, so it slows the
            host's other threads meanwhile, and a compilation cache does not skip it.
        result_wait_seconds: how long the host waited for the results of batches it had
            dispatched: the device's time on the host's critical path (near 0 where the
            host is the bottleneck; JAX's CPU client may run a batch while dispatching it).
    """

    elements: int
    results: int
    dead_letters: int
    dead_letters_by_stage: dict[str, int]
    batches: int
    padding_ratio: float
    compiles: int
    compile_seconds: float
    out_of_memory: int
    batch_limit_lowered: int
    kernel_calls: int
    kernel_retries: int
    mean_batch_latency_ms: float
    fit_out_of_memory: int = 0
    fit_missed_by_pct: float = float("nan")
    batch_fill: float = float("nan")
    buffering: BufferingSummary | None = None
    compile_wait_seconds: float = 0.0
    result_wait_seconds: float = 0.0
    compile_trace_seconds: float = 0.0

    @property
    def compile_overlapped_seconds(self) -> float:
        """Compile time no batch waited for: done in the background meanwhile."""
        return max(0.0, self.compile_seconds - self.compile_wait_seconds)

    @property
    def conserved(self) -> bool:
        """Whether every element ended as exactly one result or one dead letter."""
        return self.elements == self.results + self.dead_letters


def _counter_totals(metrics: dict) -> dict[str, int]:
    totals: dict[str, int] = {}
    for c in metrics["counters"]:
        if c.key.metric.name.startswith(BUCKET_PREFIX):
            continue
        # Committed values where the runner reports them (they exclude retried attempts).
        value = c.committed if c.committed is not None else c.attempted
        totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + (value or 0)
    return totals


def metric_totals(result: Any, namespace: str) -> dict[str, int]:
    """``{counter name: total over all steps and workers}`` for one metrics namespace.

    Use it for a pipeline's own counters next to ``summarize``'s beam_jax ones.
    """
    return _counter_totals(result.metrics().query(MetricsFilter().with_namespace(namespace)))


def summarize(result: Any, namespace: str = NAMESPACE) -> Summary:
    """Read the RunKernel metrics of a finished ``PipelineResult``.

    Beam's local streaming runner (the one that runs a ``TestStream``) keeps only the first
    bundle's counter updates of each step and thread, so a plain run there under-counts; run
    such pipelines through ``beam_jax.testing.StreamTest``, whose ``summary`` counts all.

    Examples:
        >>> summary = summarize(pipeline.run().wait_until_finish() and result)  # doctest: +SKIP
    """
    metrics = result.metrics().query(MetricsFilter().with_namespace(namespace))
    totals = _counter_totals(metrics)
    latency_sum, latency_count = 0, 0
    missed = []
    waits = [0, 0, float("nan")]  # sum, count, max of buffer_wait_ms
    for d in metrics["distributions"]:
        v = d.committed if d.committed is not None else d.attempted
        if v is not None and d.key.metric.name == "batch_latency_ms":
            latency_sum += v.sum
            latency_count += v.count
        if v is not None and v.count and d.key.metric.name == "fit_missed_by_pct":
            missed.append(v.min)
        if v is not None and d.key.metric.name == "buffer_wait_ms":
            if v.count:
                top = v.max if waits[1] == 0 else max(waits[2], v.max)
                waits = [waits[0] + v.sum, waits[1] + v.count, top]
    real = totals.get("real_size", 0)
    return Summary(
        elements=totals.get("elements_in", 0),
        results=totals.get("results", 0),
        dead_letters=totals.get("dead_letters", 0),
        dead_letters_by_stage={s: totals.get(f"dead_letters_{s}", 0) for s in STAGES},
        batches=totals.get("batches", 0),
        padding_ratio=totals.get("padded_size", 0) / real if real else float("nan"),
        compiles=totals.get("compiles", 0),
        compile_seconds=totals.get("compile_ms", 0) / 1000.0,
        out_of_memory=totals.get("out_of_memory", 0),
        batch_limit_lowered=totals.get("batch_limit_lowered", 0),
        kernel_calls=totals.get("kernel_calls", 0),
        kernel_retries=totals.get("kernel_retries", 0),
        mean_batch_latency_ms=latency_sum / latency_count if latency_count else float("nan"),
        fit_out_of_memory=totals.get("fit_out_of_memory", 0),
        fit_missed_by_pct=float(min(missed)) if missed else float("nan"),
        batch_fill=(
            totals.get("batch_rows", 0) / totals["batch_capacity"]
            if totals.get("batch_capacity")
            else float("nan")
        ),
        buffering=_buffering(totals, waits),
        compile_wait_seconds=totals.get("compile_wait_ms", 0) / 1000.0,
        result_wait_seconds=totals.get("result_wait_us", 0) / 1e6,
        compile_trace_seconds=totals.get("compile_trace_ms", 0) / 1000.0,
    )


def bucket_totals(result: Any, namespace: str = NAMESPACE) -> dict[str, dict[str, float]]:
    """Per-bucket totals of a finished pipeline's kernel metrics, keyed by bucket label.

    Each bucket has ``elements`` (rows run), ``batches``, ``padded_size``, ``real_size``,
    ``padding_ratio``, ``compiles`` (batch shapes compiled at launch) and
    ``mean_batch_latency_ms``. Buckets are ordered by their boundaries.

    Example:
        >>> bucket_totals(result)["32"].get("elements")  # doctest: +SKIP
        1200
    """
    metrics = result.metrics().query(MetricsFilter().with_namespace(namespace))
    out: dict[tuple[int, ...], dict[str, float]] = {}

    def slot(name: str) -> tuple[dict[str, float], str] | None:
        if not name.startswith(BUCKET_PREFIX):
            return None
        label, _, field = name[len(BUCKET_PREFIX) :].partition("/")
        key = tuple(int(b) for b in label.split("x"))
        return out.setdefault(key, {"latency_sum": 0, "latency_count": 0}), field

    for c in metrics["counters"]:
        found = slot(c.key.metric.name)
        if found:
            stats, field = found
            value = c.committed if c.committed is not None else c.attempted
            stats[field] = stats.get(field, 0) + (value or 0)
    for d in metrics["distributions"]:
        found = slot(d.key.metric.name)
        v = d.committed if d.committed is not None else d.attempted
        if found and v is not None:
            stats, _ = found
            stats["latency_sum"] += v.sum
            stats["latency_count"] += v.count
    result_by_label = {}
    for key in sorted(out):
        s = out[key]
        real, count = s.get("real_size", 0), s.pop("latency_count")
        total = s.pop("latency_sum")
        result_by_label[bucket_label(key)] = {
            "elements": int(s.get("elements", 0)),
            "batches": int(s.get("batches", 0)),
            "padded_size": int(s.get("padded_size", 0)),
            "real_size": int(real),
            "padding_ratio": s.get("padded_size", 0) / real if real else float("nan"),
            "compiles": int(s.get("compiles", 0)),
            "mean_batch_latency_ms": total / count if count else float("nan"),
        }
    return result_by_label
