"""The TestStream clock shared by the direct runner and the transform in the small-bundle
benchmark (a module of its own, so pickled DoFns refer to it rather than copy it)."""

from apache_beam.runners.direct import clock as direct_clock
from apache_beam.runners.direct import direct_runner

_CLOCK = direct_clock.TestClock()
_ORIGINAL = direct_runner.TestClock


def stream_time() -> float:
    """The TestStream's processing time (the clock the direct runner fires timers by)."""
    return _CLOCK.time()


def reset() -> None:
    """A fresh clock at 0 for the next pipeline; the direct runner will use it."""
    global _CLOCK
    _CLOCK = direct_clock.TestClock()
    direct_runner.TestClock = lambda: _CLOCK


def restore() -> None:
    """The direct runner makes its own test clocks again."""
    direct_runner.TestClock = _ORIGINAL
