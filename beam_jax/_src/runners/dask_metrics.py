"""Beam metrics of a job on Dask: counted per bundle on the workers, sent to the client as
Dask events, committed once per task.

Beam's ``DaskRunner`` (2.78) gives its DoFns no metrics container, so every counter is
dropped, and its result's ``metrics()`` raises ``NotImplementedError``. Here each bundle (a
Dask task's partition) counts into its own ``MetricsContainer``; when the bundle has
finished, its totals go to the client as one event on the job's topic
(``Worker.log_event``), tagged with the task's key. A task that runs again (its worker died
and Dask recomputes it) sends the same key: *committed* values keep one event per task and
step, the last; *attempted* values add up every event received.

Example:
    >>> metrics = DaskMetrics()
    >>> metrics.receive((0.0, {"task": "t1", "step": "Count", "counters": [["ns", "n", 2]]}))
    >>> metrics.receive((0.0, {"task": "t1", "step": "Count", "counters": [["ns", "n", 2]]}))
    >>> [(r.committed, r.attempted) for r in metrics.query()["counters"]]
    [(2, 4)]
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from apache_beam.metrics.cells import DistributionData, GaugeData, StringSetData
from apache_beam.metrics.execution import MetricKey, MetricsContainer, MetricUpdates
from apache_beam.metrics.metric import MetricResults
from apache_beam.metrics.metricbase import MetricName
from apache_beam.runners.direct.direct_metrics import DirectMetrics
from apache_beam.runners.worker import statesampler
from apache_beam.utils.counters import CounterFactory

__all__ = ["DaskMetrics", "counting", "send", "topic"]


def topic(job: str) -> str:
    """The Dask event topic a job's metrics travel on."""
    return f"beam_jax-metrics-{job}"


@contextlib.contextmanager
def counting(step: str) -> Iterator[MetricsContainer]:
    """Beam metrics updated in this thread while the block runs count into the container
    it yields (as a worker of another runner counts a bundle of ``step``)."""
    container = MetricsContainer(step)
    previous = statesampler.get_current_tracker()
    sampler = statesampler.StateSampler("dask", CounterFactory())  # never started: no thread
    statesampler.set_current_tracker(sampler)
    try:
        with sampler.scoped_state(step, "process", metrics_container=container):
            yield container
    finally:
        statesampler.set_current_tracker(previous)


def send(job: str, step: str, container: MetricsContainer) -> None:
    """Sends the container's totals to the job's client, from a task on a Dask worker."""
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return  # not in a Dask worker (a bundle run by hand): nobody to tell
    updates = container.get_cumulative()
    message = {"task": str(worker.get_current_task()), "step": step, **_encode(updates)}
    worker.log_event(topic(job), message)


def _name(key: MetricKey) -> list[str]:
    return [key.metric.namespace, key.metric.name]


def _encode(updates: MetricUpdates) -> dict[str, list]:
    """The updates as plain lists (Dask events must be msgpack-serializable)."""
    return {
        "counters": [[*_name(k), int(v)] for k, v in updates.counters.items()],
        "distributions": [
            [*_name(k), d.sum, d.count, d.min, d.max] for k, d in updates.distributions.items()
        ],
        "gauges": [[*_name(k), g.value, g.timestamp] for k, g in updates.gauges.items()],
        "string_sets": [
            [*_name(k), sorted(s.string_set), s.string_size] for k, s in updates.string_sets.items()
        ],
    }


def _decode(message: dict[str, Any]) -> MetricUpdates:
    step = message["step"]

    def key(namespace: str, name: str) -> MetricKey:
        return MetricKey(step, MetricName(namespace, name))

    return MetricUpdates(
        counters={key(ns, n): v for ns, n, v in message.get("counters", ())},
        distributions={
            key(ns, n): DistributionData(s, c, lo, hi)
            for ns, n, s, c, lo, hi in message.get("distributions", ())
        },
        gauges={key(ns, n): GaugeData(v, t) for ns, n, v, t in message.get("gauges", ())},
        string_sets={
            key(ns, n): StringSetData(set(v), size)
            for ns, n, v, size in message.get("string_sets", ())
        },
    )


class DaskMetrics(MetricResults):
    """A job's metrics as its events arrive: Beam's ``MetricResults``, queried as on any
    runner (``beam_jax.summarize(result)``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []

    def receive(self, event: tuple[float, dict[str, Any]]) -> None:
        """A Dask event ``(timestamp, message)`` of the job's topic (the client's handler)."""
        with self._lock:
            self._events.append(event[1])

    def query(self, filter=None):
        with self._lock:
            events = list(self._events)
        last = {(m["task"], m["step"]): m for m in events}
        totals = DirectMetrics()
        for m in events:
            totals.commit_physical(m["task"], _decode(m))
        for (task, _), m in last.items():
            totals.commit_logical(task, _decode(m))
        return totals.query(filter)
