"""ReduceKernel in cross-bundle mode: exactly one sum per window, whatever the watermark does.

The TestStream runner (the Python BundleBasedDirectRunner) holds no watermark for user
timers, so a window's last batch must not wait for its event-time timer: every window's
element count per key reaches the stateful step as a row, and the last batch runs when the
count is met. These tests step the watermark, jump it to infinity, send late data within the
allowed lateness, and run the same windows bounded on the FnApiRunner.
"""

from __future__ import annotations

import apache_beam as beam
import jax.numpy as jnp
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger
from apache_beam.transforms.window import FixedWindows, TimestampedValue

import beam_jax as bj
from beam_jax.testing import StreamTest
from tests.beam_helpers import pipeline, run

SPEC = {"x": bj.ArraySpec(("L",), np.float32)}
WIDTH = 10  # seconds per window


def _row(t: float) -> dict:
    # Ragged lengths (1..5) spread rows over two buckets; values that sum exactly in float32.
    n = 1 + int(t * 2) % 5
    return {"x": np.full(n, float(int(t * 2) % 7), np.float32)}


def _masked_sum(params, element, lengths):
    x = element["x"]
    mask = jnp.arange(x.shape[0]) < lengths["L"]
    return {"sum": jnp.where(mask, x, 0.0).sum(), "n": lengths["L"]}


def _reduce(shards: int = 2, batch: int = 4):
    return bj.ReduceKernel(
        _masked_sum, spec=SPEC, devices=[0],
        bucketing=bj.Bucketing(boundaries={"L": (2, 8)}, batch_size=batch),
    ).with_cross_bundle_batching(max_wait_s=3600, shards=shards)  # fmt: skip


def _expected(times) -> dict[int, tuple[float, int, int]]:
    """numpy's sum per window start: (sum of values, sum of lengths, count)."""
    out: dict[int, list] = {}
    for t in times:
        x = _row(t)["x"]
        acc = out.setdefault(int(t // WIDTH) * WIDTH, [0.0, 0, 0])
        acc[0] += float(np.sum(x, dtype=np.float64))
        acc[1] += len(x)
        acc[2] += 1
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def _by_window(items) -> list[tuple[int, float, int, int]]:
    return sorted(
        (int(w.start), float(r.total["sum"]), int(r.total["n"]), r.count) for r, _, _, w in items
    )


def _stream(times, per_bundle=3) -> _TestStream:
    stream = _TestStream()
    for i in range(0, len(times), per_bundle):
        chunk = times[i : i + per_bundle]
        stream = stream.add_elements([TimestampedValue(_row(t), t) for t in chunk])
    return stream


TIMES = [i * 0.5 for i in range(40)]  # 20 rows in [0, 10), 20 in [10, 20)


def _run_stream(stream, **window) -> list:
    with StreamTest() as test:
        windowed = test.pipeline | stream | beam.WindowInto(FixedWindows(WIDTH), **window)
        kept = test.collect(windowed | _reduce())
    return kept()


@pytest.mark.parametrize(
    "watermarks", [(), (10,), (10, 20), (5, 10, 15, 20)], ids=["jump", "one", "two", "four"]
)
def test_one_exact_sum_per_window_with_stepped_and_jumping_watermarks(watermarks):
    stream = _stream(TIMES)
    for w in watermarks:
        stream = stream.advance_watermark_to(w)
    items = _run_stream(stream.advance_watermark_to_infinity())
    expected = sorted((k, *v) for k, v in _expected(TIMES).items())
    assert _by_window(items) == expected


def test_watermark_steps_between_bundles_of_one_window():
    """The watermark moves inside window [0, 10) while it still receives rows."""
    stream = _TestStream()
    for i, t in enumerate(TIMES):
        stream = stream.add_elements([TimestampedValue(_row(t), t)])
        if i % 4 == 3:
            stream = stream.advance_watermark_to(t)
    items = _run_stream(stream.advance_watermark_to_infinity())
    assert _by_window(items) == sorted((k, *v) for k, v in _expected(TIMES).items())


def test_late_rows_within_the_allowed_lateness_come_as_one_late_pane():
    """Window [0, 10) closes with 20 rows; 3 more arrive late (allowed lateness 30 s): they
    are summed into one late pane, as Beam's own combine does; none is lost or counted
    twice."""
    late = [1.0, 2.5, 7.0]
    stream = _stream(TIMES).advance_watermark_to(15)
    stream = stream.add_elements([TimestampedValue(_row(t), t) for t in late])
    items = _run_stream(
        stream.advance_watermark_to_infinity(),
        allowed_lateness=30,
        trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    )
    panes = _by_window(items)
    first = [p for p in panes if p[0] == 0]
    on_time = _expected(TIMES)[0]
    assert (0, *on_time) in first
    rest = [p for p in first if p != (0, *on_time)]
    assert sum(p[3] for p in rest) == len(late)
    assert sum(p[1] for p in rest) == pytest.approx(_expected(late)[0][0])
    assert [p for p in panes if p[0] == 10] == [(10, *_expected(TIMES)[10])]


def test_assert_that_sees_every_window_at_the_end_of_a_stream():
    """Results flushed when the watermark jumps to infinity reach a GroupByKey downstream
    on time (``assert_that`` groups its input), not dropped as late data."""
    with StreamTest() as test:
        stream = _stream(TIMES).advance_watermark_to_infinity()
        sums = (
            test.pipeline
            | stream
            | "Windows" >> beam.WindowInto(FixedWindows(WIDTH))
            | _reduce(shards=3)
            | beam.Map(lambda r: (int(r.total["n"]), r.count))
            | "Global" >> beam.WindowInto(beam.window.GlobalWindows())
        )
        expected = _expected(TIMES)
        assert_that(sums, equal_to([(v[1], v[2]) for v in expected.values()]))


def test_fnapi_runner_gives_the_same_one_sum_per_window():
    p = pipeline()
    sums = (
        p
        | beam.Create([TimestampedValue(_row(t), t) for t in TIMES])
        | beam.WindowInto(FixedWindows(WIDTH))
        | _reduce(shards=3)
        | beam.Map(
            lambda r, w=beam.DoFn.WindowParam: (
                int(w.start),
                float(r.total["sum"]),
                int(r.total["n"]),
                r.count,
            )
        )
    )
    assert_that(sums, equal_to([(k, *v) for k, v in _expected(TIMES).items()]))
    run(p)
