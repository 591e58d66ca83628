"""WorkAhead: a DoFn's native work one or more elements ahead in a thread, its outputs in
their own windows and in order, a fault failing the bundle."""

import pickle
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import FixedWindows, IntervalWindow, TimestampedValue

import beam_jax as bj
from tests.beam_helpers import pipeline, run


class Squares(beam.DoFn):
    """x -> x * x (computed in the background), odd squares also to "odd"; counts in ``then``."""

    def __init__(self, depth: int, fail_on: int | None = None):
        self._ahead = bj.WorkAhead("squares", depth=depth)
        self._fail_on = fail_on

    def setup(self):
        self._ahead.setup()
        self._counted = Metrics.counter("test", "squares")

    def start_bundle(self):
        self._ahead.start_bundle()

    def process(self, x, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        yield from self._ahead.submit(lambda: self._square(x), self._outputs, window, timestamp)

    def finish_bundle(self):
        yield from self._ahead.finish_bundle()

    def teardown(self):
        self._ahead.teardown()

    def _square(self, x):
        if x == self._fail_on:
            raise ValueError(f"no square for {x}")
        time.sleep(0.001 * (x % 3))  # later elements may finish first
        return x * x, threading.current_thread().name

    def _outputs(self, result):
        square, thread = result
        assert thread.startswith("squares"), thread  # the work ran in the background
        self._counted.inc()  # Beam's metrics are per thread: this runs on the bundle's
        yield square
        if square % 2:
            yield beam.pvalue.TaggedOutput("odd", square)


def _in_window(value, window=beam.DoFn.WindowParam):
    return value, int(window.start)


@pytest.mark.parametrize("depth", [1, 3])
def test_outputs_keep_their_elements_windows_and_every_element_comes_out_once(depth):
    p = pipeline()
    values = list(range(23))
    out = (
        p
        | beam.Create(values)
        | beam.Map(lambda x: TimestampedValue(x, x))  # second x: window 10 * (x // 10)
        | beam.WindowInto(FixedWindows(10))
        | beam.ParDo(Squares(depth)).with_outputs("odd", main="squares")
    )
    squares = out.squares | "SquareWindows" >> beam.Map(_in_window)
    odd = out.odd | "OddWindows" >> beam.Map(_in_window)
    assert_that(squares, equal_to([(x * x, 10 * (x // 10)) for x in values]), label="squares")
    expected_odd = [(x * x, 10 * (x // 10)) for x in values if x % 2]
    assert_that(odd, equal_to(expected_odd), label="odd")
    result = run(p)
    counters = result.metrics().query(MetricsFilter().with_name("squares"))["counters"]
    assert sum(c.committed for c in counters) == len(values)


def test_a_fault_in_the_work_fails_the_pipeline_with_its_message():
    p = pipeline()
    _ = p | beam.Create(range(5)) | beam.ParDo(Squares(depth=1, fail_on=3))
    with pytest.raises(Exception, match="no square for 3"):
        run(p)


def test_outputs_come_in_submission_order_whatever_finishes_first():
    ahead = bj.WorkAhead("order", depth=3)
    ahead.setup()
    ahead.start_bundle()
    window = IntervalWindow(0, 10)
    out = []
    for i, delay in enumerate([0.05, 0.0, 0.02, 0.0, 0.01]):

        def work(i=i, delay=delay):
            time.sleep(delay)
            return i

        out += ahead.submit(work, lambda i: [i], window, 5)
        assert len(out) == max(0, i + 1 - 3)  # at most depth elements held back
    out += ahead.finish_bundle()
    ahead.teardown()
    assert [v.value for v in out] == [0, 1, 2, 3, 4]
    assert all(v.windows == (window,) and v.timestamp == 5 for v in out)


def test_with_two_workers_two_elements_work_at_once_and_outputs_keep_their_order():
    ahead = bj.WorkAhead("pair", depth=2, workers=2)
    ahead.setup()
    ahead.start_bundle()
    both = threading.Barrier(2, timeout=30)  # passed only by two works running at once
    out = []
    for i in range(6):

        def work(i=i):
            if i < 2:
                both.wait()
            time.sleep(0.01 * (i % 2))  # the odd ones finish last
            return i, threading.current_thread().name

        out += ahead.submit(work, lambda r: [r])
    out += ahead.finish_bundle()
    ahead.teardown()
    assert [i for i, _ in out] == list(range(6))
    assert len({name for _, name in out}) == 2 and all(n.startswith("pair") for _, n in out)


def test_without_setup_the_work_runs_at_once_and_a_pickled_copy_holds_no_thread():
    ahead = bj.WorkAhead("direct")
    assert list(ahead.submit(lambda: 2, lambda x: [x, x + 1])) == [2, 3]
    ahead.setup()
    copy = pickle.loads(pickle.dumps(ahead))
    assert (copy.name, copy.depth, copy.workers) == ("direct", 1, 1)
    assert list(copy.submit(lambda: 4, lambda x: [x])) == [4]  # no pool in the copy
    ahead.teardown()


def test_a_placeholder_window_and_a_bad_depth_are_refused():
    with pytest.raises(ValueError, match="depth must be a positive int, got 0"):
        bj.WorkAhead("x", depth=0)
    with pytest.raises(ValueError, match="workers must be a positive int, got True"):
        bj.WorkAhead("x", workers=True)
    ahead = bj.WorkAhead("x")
    ahead.setup()
    with pytest.raises(TypeError, match="declare it in process"):
        list(ahead.submit(lambda: 1, lambda x: [x], beam.DoFn.WindowParam, 0))
    ahead.teardown()
