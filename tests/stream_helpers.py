"""TestStream pipelines on the BundleBasedDirectRunner, the one local runner that runs
``TestStream`` (the FnApiRunner and Prism refuse it) and fires processing-time timers.

Two things make its runs observable from a test:

* ``runner_clock``: the direct runner keeps ``TestStream``'s processing time in a
  ``TestClock`` it makes per run; ``streaming_pipeline`` makes it use one shared clock, so a
  ``CrossBundle(clock=runner_time)`` measures waits in the stream's own time.
* ``Collect``: results land in an in-process list with the processing time at which they
  came out. ``assert_that`` cannot check the end of a stream here: the Python direct runner
  does not hold the watermark for user timers, so results flushed when the watermark jumps
  to infinity reach ``assert_that``'s GroupByKey late and are dropped (on Dataflow and
  Flink, timers hold the watermark).
"""

from __future__ import annotations

import collections
import contextlib
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct import clock as direct_clock
from apache_beam.runners.direct import direct_runner

_CLOCK = direct_clock.TestClock()
_COLLECTED: dict[str, list] = collections.defaultdict(list)


def runner_time() -> float:
    """The processing time of the running TestStream pipeline (seconds)."""
    return _CLOCK.time()


@contextlib.contextmanager
def streaming_pipeline():
    """A streaming pipeline on the BundleBasedDirectRunner whose TestStream clock is
    ``runner_time``; it runs when the ``with`` block ends."""
    global _CLOCK
    _CLOCK = direct_clock.TestClock()
    original = direct_runner.TestClock
    direct_runner.TestClock = lambda: _CLOCK
    try:
        p = beam.Pipeline(
            runner=direct_runner.BundleBasedDirectRunner(),
            options=PipelineOptions(["--streaming"]),
        )
        yield p
        p.run().wait_until_finish()
    finally:
        direct_runner.TestClock = original


class _Keep(beam.DoFn):
    # A module-level DoFn: pickled by reference, so it appends to this process's lists.
    def __init__(self, name: str):
        self._name = name

    def process(self, x, ts=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam):
        _COLLECTED[self._name].append((x, runner_time(), ts, w))


class Collect(beam.PTransform):
    """Keep ``(element, processing time it came out, timestamp, window)`` in memory."""

    def __init__(self):
        self.name = uuid.uuid4().hex
        super().__init__(label=f"Collect_{self.name[:8]}")

    def expand(self, pcoll):
        return pcoll | beam.ParDo(_Keep(self.name))

    @property
    def items(self) -> list:
        return list(_COLLECTED[self.name])

    @property
    def values(self) -> list:
        return [x for x, *_ in _COLLECTED[self.name]]
