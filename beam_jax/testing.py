"""Helpers for testing pipelines that use beam_jax (also used by beam_jax's own tests)."""

from __future__ import annotations

import collections
import os
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from beam_jax._src.compat.beam import direct_runner_clock, metrics_per_bundle
from beam_jax._src.engine.metrics import NAMESPACE, Summary, summarize

__all__ = [
    "Collected",
    "CountingLoader",
    "StreamTest",
    "VirtualClock",
    "assert_conserved",
]


def assert_conserved(result: Any, *, namespace: str = NAMESPACE) -> Summary:
    """Assert every element that entered RunKernel ended as one result or one dead letter.

    Examples:
        >>> result = pipeline.run(); result.wait_until_finish()  # doctest: +SKIP
        >>> assert_conserved(result).dead_letters  # doctest: +SKIP

    Args:
        result: a finished ``PipelineResult``, or a ``Summary``.
        namespace: the metrics namespace the transforms used.

    Returns:
        The summary, for further checks.

    Raises:
        AssertionError: elements in != results + dead letters, or nothing was counted.
    """
    summary = result if isinstance(result, Summary) else summarize(result, namespace)
    if summary.elements == 0:
        raise AssertionError(
            f"no elements were counted in metrics namespace {namespace!r}; did the pipeline "
            "run RunKernel, and has it finished?"
        )
    if not summary.conserved:
        raise AssertionError(
            f"conservation broken: {summary.elements} elements in, but {summary.results} "
            f"results + {summary.dead_letters} dead letters = "
            f"{summary.results + summary.dead_letters}."
        )
    return summary


class CountingLoader:
    """A ``load_params`` that records each call's process id in ``directory``.

    Use it to check that parameters are loaded once per worker process.

    Args:
        directory: where to record calls (one file per call).
        params: what the loader returns.
    """

    def __init__(self, directory: str, params: Any):
        self.directory = str(directory)
        self.params = params

    def __call__(self) -> Any:
        os.makedirs(self.directory, exist_ok=True)
        pid = os.getpid()
        n = len([f for f in os.listdir(self.directory) if f.startswith(f"{pid}-")])
        with open(os.path.join(self.directory, f"{pid}-{n}"), "w") as f:
            f.write(str(pid))
        return self.params

    def calls(self) -> Counter:
        """``{pid: number of loads}`` recorded so far."""
        if not os.path.isdir(self.directory):
            return Counter()
        return Counter(int(f.split("-")[0]) for f in os.listdir(self.directory))


# --- streaming tests with a virtual clock ----------------------------------------------


class VirtualClock:
    """The processing time of a ``StreamTest``'s ``TestStream``, in seconds.

    Pass it as ``CrossBundle(clock=...)`` (``with_cross_bundle_batching(clock=...)``): the
    runner fires processing-time timers on the same clock, so ``max_wait_s`` is measured in
    the stream's own time (``TestStream.advance_processing_time``), not in wall time.
    """

    def __init__(self):
        from apache_beam.runners.direct.clock import TestClock

        self._clock = TestClock()
        self._key = uuid.uuid4().hex
        _CLOCKS[self._key] = self

    def __call__(self) -> float:
        return self._clock.time()

    def __reduce__(self):
        # Pickled into the pipeline by reference: the runner runs in this process.
        return (_clock_of, (self._key,))


# Clocks by key while they exist (the pipeline unpickles them here by key).
_CLOCKS: weakref.WeakValueDictionary[str, VirtualClock] = weakref.WeakValueDictionary()


def _clock_of(key: str) -> VirtualClock:
    return _CLOCKS[key]


class Collected(NamedTuple):
    """One output of a ``StreamTest`` pipeline, as ``StreamTest.collect`` keeps it."""

    value: Any
    processing_time: float  # when it came out, on the test's ``VirtualClock``
    timestamp: Any
    window: Any


# The outputs of each running ``collect``, until its ``StreamTest`` ends.
_COLLECTED: dict[str, list[Collected]] = collections.defaultdict(list)


class _Keep:
    """Appends each output to this process's list for one ``collect`` (a DoFn's body)."""

    def __init__(self, name: str, clock: VirtualClock):
        self.name, self.clock = name, clock

    def __call__(self, value, timestamp, window):
        _COLLECTED[self.name].append(Collected(value, self.clock(), timestamp, window))


class StreamTest:
    """A streaming pipeline for testing cross-bundle batching: ``TestStream`` in, the wait
    bound and batch fill measurable out.

    It runs on Beam's BundleBasedDirectRunner with ``--streaming``, adding what a test needs
    and Beam does not give: ``clock``, a ``VirtualClock`` shared with the runner for
    ``CrossBundle(clock=...)``; and metrics that count every bundle (that runner keeps the
    first bundle's metrics container per step and thread, losing later updates), so
    ``summary`` is exact. The pipeline runs when the ``with`` block ends.

    Example:
        >>> with StreamTest() as test:  # doctest: +SKIP
        ...     kernel = bj.RunKernel(fn, spec=spec)
        ...     batched = kernel.with_cross_bundle_batching(max_wait_s=2.0, clock=test.clock)
        ...     kept = test.collect(test.pipeline | stream | batched)
        >>> max(item.processing_time for item in kept()), test.summary.batch_fill  # doctest: +SKIP

    Args:
        argv: further pipeline options (``--streaming`` is always set).
    """

    def __init__(self, argv: Sequence[str] = ()):
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
        from apache_beam.runners.direct import direct_runner

        self.clock = VirtualClock()
        self.pipeline = beam.Pipeline(
            runner=direct_runner.BundleBasedDirectRunner(),
            options=PipelineOptions(["--streaming", *argv]),
        )
        self.result: Any = None
        self._kept: dict[str, list[Collected]] = {}

    def collect(self, pcoll) -> Callable[[], list[Collected]]:
        """Keep ``pcoll``'s outputs in this process; call the returned function after the run
        for the list of ``Collected(value, processing_time, timestamp, window)``.

        Unlike ``assert_that``, it records *when* each output came out, for wait bounds."""
        import apache_beam as beam

        name = uuid.uuid4().hex
        self._kept[name] = []
        keep = _Keep(name, self.clock)
        _ = pcoll | f"Collect_{name[:8]}" >> beam.Map(
            lambda x, t=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam: keep(x, t, w)
        )
        return lambda: list(self._kept[name])

    @property
    def summary(self) -> Summary:
        """``bj.summarize`` of the finished run (every bundle counted)."""
        if self.result is None:
            raise RuntimeError("the pipeline has not run yet: read summary after the with block.")
        return summarize(self.result)

    def __enter__(self) -> StreamTest:
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if exc_info[0] is None:
                with direct_runner_clock(self.clock._clock), metrics_per_bundle():
                    self.result = self.pipeline.run()
                    self.result.wait_until_finish()
        finally:  # the outputs move to this test; nothing stays in the process
            for name in self._kept:
                self._kept[name] = _COLLECTED.pop(name, [])
