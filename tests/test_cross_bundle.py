"""Cross-bundle batching: TestStream pipelines on the BundleBasedDirectRunner (the local
runner with TestStream and processing-time timers), bounded ones on the FnApiRunner."""

from __future__ import annotations

import apache_beam as beam
import jax.numpy as jnp
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import FixedWindows, TimestampedValue

import beam_jax as bj
from beam_jax._src.core.tree_codec import decode_tree, encode_tree
from beam_jax._src.transforms.cross_bundle import BufferedElement, BufferedElementCoder
from beam_jax.testing import StreamTest
from tests import kernels
from tests.beam_helpers import pipeline, run

SPEC = {"x": bj.ArraySpec(("L",), np.float32)}
BATCH = 8
BUCKETING = bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=BATCH)


def batch_probe(params, element, lengths):
    """Per row: its masked sum, how many real rows its batch held, and the spread of the
    batch's first values (0 when every row of the batch carries the same first value)."""
    x = element["x"]
    mask = jnp.arange(x.shape[1])[None, :] < lengths["L"][:, None]
    valid = lengths.valid
    first = x[:, 0]
    high = jnp.max(jnp.where(valid, first, -jnp.inf))
    low = jnp.min(jnp.where(valid, first, jnp.inf))
    rows = jnp.broadcast_to(jnp.sum(valid.astype(jnp.int32)), valid.shape)
    return {
        "sum": jnp.sum(jnp.where(mask, x, 0.0), axis=1),
        "rows": rows,
        "spread": jnp.broadcast_to(high - low, valid.shape),
    }


def probe(clock=None, **config):
    run_kernel = bj.RunKernel(
        batch_probe, spec=SPEC, bucketing=BUCKETING, batched=True, devices=[0]
    )
    if not config:
        return run_kernel
    # Waits in TestStream time: the direct runner's processing-time timers read that clock.
    if clock is not None:
        config["clock"] = clock
    return run_kernel.with_cross_bundle_batching(**config)


def element(value: float, length: int = 3) -> dict:
    return {"x": np.full(length, value, np.float32)}


def fill(results) -> float:
    """Mean batch fill from per-row ``rows``: a batch of ``r`` rows shows up ``r`` times."""
    rows = [int(r["rows"]) for r in results]
    batches = sum(1 / r for r in rows)
    return len(rows) / (batches * BATCH)


def small_bundles(values, per_bundle=10, advance=None, times=None) -> _TestStream:
    """``values`` as a TestStream of bundles of ``per_bundle`` elements."""
    stream = _TestStream()
    for start in range(0, len(values), per_bundle):
        chunk = values[start : start + per_bundle]
        stamped = [
            TimestampedValue(element(v), t)
            for v, t in zip(chunk, (times or values)[start : start + per_bundle], strict=True)
        ]
        stream = stream.add_elements(stamped)
        if advance:
            stream = stream.advance_processing_time(advance)
    return stream


# --- the state coder ------------------------------------------------------------------


def test_tree_codec_round_trips_pytrees_of_arrays_without_pickle():
    tree = {
        "x": np.arange(12, dtype=np.float16).reshape(3, 4)[:, ::2],  # not contiguous
        "meta": ("id-7", b"\x00raw", None, True, 2**70, -0.5, [np.int8(3)]),
        "empty": np.zeros((0, 5), np.int32),
    }
    data = encode_tree(tree)
    assert b"pickle" not in data and b"\x80\x04" not in data[:2]
    back = decode_tree(data)
    np.testing.assert_array_equal(back["x"], tree["x"])
    assert back["x"].dtype == np.float16 and back["empty"].shape == (0, 5)
    assert back["meta"][:6] == tree["meta"][:6]
    assert back["meta"][6][0] == 3 and back["meta"][6][0].dtype == np.int8
    assert list(back) == ["x", "meta", "empty"]  # key order kept (dead-letter echoes)


def test_tree_codec_refuses_objects_and_corrupt_bytes():
    with pytest.raises(TypeError, match=r"at <root>\['f'\]: cannot store object"):
        encode_tree({"f": object()})
    with pytest.raises(TypeError, match="dtype object"):
        encode_tree(np.array([None]))
    with pytest.raises(ValueError, match="truncated"):
        decode_tree(encode_tree(np.ones(4))[:-3])
    with pytest.raises(ValueError, match="left over"):
        decode_tree(encode_tree(1) + b"N")


def test_buffered_element_coder_and_deterministic_keys():
    coder = BufferedElementCoder()
    value = BufferedElement(encode_tree(("k", element(2.0))), 1_500_000, 12.25)
    assert coder.decode(coder.encode(value)) == value
    assert beam.coders.registry.get_coder(BufferedElement) == coder
    key = beam.coders.registry.get_coder(beam.typehints.Tuple[int, int])
    assert key.is_deterministic()


def test_cross_bundle_options_are_validated():
    with pytest.raises(bj.SpecError, match="max_wait_s must be > 0"):
        bj.CrossBundle(max_wait_s=0)
    with pytest.raises(bj.SpecError, match="shards must be an int >= 1, got 0"):
        bj.CrossBundle(shards=0)
    with pytest.raises(bj.SpecError, match="when must be one of"):
        bj.CrossBundle(when="sometimes")
    with pytest.raises(bj.SpecError, match="does not batch across bundles"):
        bj.RunKernelOnArrow(
            lambda p, e, n: e["x"].sum(), spec=SPEC, bucketing=BUCKETING,
            columns=bj.ArrowColumns(leaves={"x": "x"}),
        ).with_cross_bundle_batching()  # fmt: skip
    config = bj.CrossBundle(max_wait_s=2.0)
    run_kernel = probe().with_cross_bundle_batching(config, shards=3)
    assert run_kernel.cross_bundle == bj.CrossBundle(max_wait_s=2.0, shards=3)
    assert probe().cross_bundle is None  # the copy left the original in bundle mode


def test_unbounded_only_keeps_bounded_input_in_bundle_mode():
    p = pipeline()
    _ = p | beam.Create([element(1.0)]) | probe(when="unbounded")
    labels = [t.full_label for t in p.transforms_stack[0].parts[-1].parts]
    assert not any("KeyByBucket" in label for label in labels)
    assert bj.CrossBundle(when="unbounded").applies_to(beam.pvalue.PCollection(p, is_bounded=False))


# --- bounded pipelines ----------------------------------------------------------------


def test_bounded_fnapi_pipeline_gives_bundle_mode_results_and_metrics():
    """Keyed elements of several buckets and two shards, on the FnApiRunner."""
    values = [(f"k{i}", element(i + 0.5, 1 + i % 7)) for i in range(60)]
    expected = [(k, float(v["x"][0])) for k, v in values]
    p = pipeline()
    run_kernel = bj.RunKernel(
        kernels.failing_mean, spec={"x": bj.ArraySpec(("L", 1), np.float32)}, keyed=True,
        bucketing=BUCKETING, load_params=lambda: np.float32(1.0),
    ).with_cross_bundle_batching(max_wait_s=3600, shards=2)  # fmt: skip
    out = (
        p
        | beam.Create([(k, {"x": v["x"][:, None]}) for k, v in values])
        | run_kernel
        | beam.Map(lambda kv: (kv[0], float(kv[1]["mean"][0])))
    )
    assert_that(out, equal_to(expected))
    summary = bj.summarize(run(p))
    assert summary.conserved and summary.results == 60 and summary.compiles >= 2
    buffering = summary.buffering
    assert buffering.waited == 60
    # 2 buckets x 2 shards: each key's last partial batch flushes once the input ends (the
    # FnApiRunner then fires the pending timers, the processing-time one included).
    flushes = buffering.flushes
    assert flushes["full"] >= 4 and flushes["timer"] + flushes["window_end"] <= 4
    assert sum(flushes.values()) == summary.batches
    assert 0 < summary.batch_fill <= 1


def test_forced_small_bundles_same_results_and_full_batches():
    """Bundles of 10 elements: bundle mode runs batches of <= 10 rows padded to 8 or 16;
    cross-bundle mode fills them."""
    values = [float(v) for v in range(200)]
    outputs = {}
    for mode in ("bundle", "cross"):
        with StreamTest() as test:
            transform = probe(test.clock, max_wait_s=3600) if mode == "cross" else probe()
            kept = test.collect(test.pipeline | small_bundles(values) | transform)
        outputs[mode] = kept()
        # Every bundle's metric updates are counted (a plain run there keeps the first's).
        assert (test.summary.elements, test.summary.results) == (len(values), len(values))
    for mode, items in outputs.items():
        assert sorted(float(x["sum"]) for x, *_ in items) == [3 * v for v in values], mode
        assert sorted(ts.micros for _, _, ts, _ in items) == [v * 1e6 for v in values], mode
    assert fill([x for x, *_ in outputs["cross"]]) >= 0.9
    assert fill([x for x, *_ in outputs["bundle"]]) <= 0.7  # 10 rows: 8 + 2, never 8 + 8


# --- streams with processing time -----------------------------------------------------


def test_no_element_waits_longer_than_the_bound_plus_one_timer_firing():
    """1 element a second, batches of 8, at most 2.5 s of waiting: flushed by the timer."""
    step, max_wait = 1.0, 2.5
    values = [float(v) for v in range(12)]
    stream = small_bundles(values, per_bundle=1, advance=step)
    with StreamTest() as test:
        stream = stream.advance_watermark_to_infinity()
        kept = test.collect(test.pipeline | stream | probe(test.clock, max_wait_s=max_wait))
    items = kept()
    arrived = {3 * v: i * step for i, v in enumerate(values)}  # sum -> arrival time
    waits = [t - arrived[float(x["sum"])] for x, t, *_ in items]
    assert len(waits) == len(values)
    assert max(waits) <= max_wait + step
    assert len({t for _, t, *_ in items}) > 3  # flushed along the way, not at the end
    buffering = test.summary.buffering  # every bundle counted on this runner too
    assert buffering.waited == len(values) and buffering.max_wait_ms <= 1000 * (max_wait + step)
    assert buffering.flushes["timer"] >= 3


def test_a_burst_fills_batches():
    values = [float(v) for v in range(5 * BATCH)]
    with StreamTest() as test:
        stream = small_bundles(values, per_bundle=len(values))
        kept = test.collect(test.pipeline | stream | probe(test.clock, max_wait_s=1.0))
    assert all(int(item.value["rows"]) == BATCH for item in kept())
    assert test.summary.batch_fill == 1.0 and test.summary.batches == 5


def test_end_of_stream_flushes_everything():
    """Fewer elements than a batch, a wait no stream reaches: the window's end flushes."""
    with StreamTest() as test:
        stream = small_bundles([1.0, 2.0, 3.0], per_bundle=1).advance_watermark_to_infinity()
        kept = test.collect(test.pipeline | stream | probe(test.clock, max_wait_s=3600))
    assert sorted(float(item.value["sum"]) for item in kept()) == [3.0, 6.0, 9.0]


def test_batches_never_mix_windows_and_results_keep_their_windows():
    """Elements of windows [0, 10) and [10, 20) interleaved in every bundle; each element's
    first value is its window, so a batch mixing windows shows a spread of 10."""
    times = [t for pair in zip(range(10), range(10, 20), strict=True) for t in pair]
    values = [float(t // 10 * 10) for t in times]
    with StreamTest() as test:
        stream = small_bundles(values, per_bundle=4, times=times)
        stream = stream.advance_watermark_to(30).advance_watermark_to_infinity()
        windowed = test.pipeline | stream | beam.WindowInto(FixedWindows(10))
        kept = test.collect(windowed | probe(test.clock, max_wait_s=3600))
    assert len(kept()) == 20
    for x, _, ts, window in kept():
        assert float(x["spread"]) == 0.0
        assert window.start <= ts < window.end and float(x["sum"]) == 3 * float(window.start)


def test_reduce_kernel_sums_per_window_as_in_bundle_mode():
    """On the FnApiRunner (tests/test_window_sums.py runs windowed sums under TestStream)."""
    rows = [np.array([t % 7, 1.0], np.float32) for t in range(20)]
    totals = {}
    for mode in ("bundle", "cross"):
        reduce = bj.ReduceKernel(
            lambda params, e, lengths: e["x"], spec={"x": bj.ArraySpec((2,), np.float32)},
            bucketing=bj.Bucketing(batch_size=4),
        )  # fmt: skip
        if mode == "cross":
            reduce = reduce.with_cross_bundle_batching(max_wait_s=3600, shards=2)
        p = pipeline()
        out = (
            p
            | beam.Create([TimestampedValue({"x": r}, t) for t, r in enumerate(rows)])
            | beam.WindowInto(FixedWindows(10))
            | reduce
            | beam.ParDo(_with_window)
        )
        expected = [
            (0, (float(sum(t % 7 for t in range(10))), 10.0), 10),
            (10_000_000, (float(sum(t % 7 for t in range(10, 20))), 10.0), 10),
        ]
        assert_that(out, equal_to(expected))
        totals[mode] = bj.summarize(run(p))
    assert totals["cross"].results == totals["bundle"].results == 20
    assert totals["cross"].buffering.waited == 20


def _with_window(r, w=beam.DoFn.WindowParam):
    yield (w.start.micros, tuple(r.total.tolist()), r.count)


# --- failures -------------------------------------------------------------------------


def _dead_letter_fields(records):
    return sorted((r.key, r.element, r.stage, r.error_type, r.message) for r in records)


def test_bad_inputs_and_kernel_faults_give_the_same_dead_letters():
    spec = {"x": bj.ArraySpec(("L", 1), np.float32)}
    inputs = [(f"k{i}", {"x": np.full((1 + i % 5, 1), float(i), np.float32)}) for i in range(24)]
    inputs[3] = ("k3", {"x": np.ones((2, 2), np.float32)})  # wrong shape: validation
    inputs[5] = ("k5", {"y": np.ones((2, 1), np.float32)})  # wrong key: validation
    inputs[7] = ("k7", {"x": np.full((2, 1), kernels.SENTINEL, np.float32)})  # kernel fault
    inputs[11] = ("k11", {"x": np.full((3, 1), np.inf, np.float32)})  # non-finite output
    found = {}
    for mode in ("bundle", "cross"):
        transform = bj.RunKernel(
            kernels.failing_mean, spec=spec, keyed=True, bucketing=BUCKETING,
            load_params=lambda: np.float32(1.0),
            validation=bj.Validation(check_outputs_finite=True),
        )  # fmt: skip
        if mode == "cross":
            transform = transform.with_cross_bundle_batching(shards=3)
        with StreamTest() as test:
            stream = _TestStream()
            for i in range(0, len(inputs), 5):
                stream = stream.add_elements(inputs[i : i + 5])
            result = test.pipeline | stream | transform.with_exception_handling()
            ok = test.collect(result.results | beam.Map(lambda kv: kv[0]))
            dead = test.collect(result.dead_letters)
        values = sorted(item.value for item in ok())
        found[mode] = (values, _dead_letter_fields([item.value for item in dead()]))
    assert found["cross"] == found["bundle"]
    ok, dead = found["cross"]
    assert len(ok) == 19
    assert {d[0]: d[2] for d in dead} == {
        "k3": "validation", "k5": "validation", "k7": "kernel", "k11": "output",
        "k13": "kernel",  # 13.0 is the kernel's sentinel too
    }  # fmt: skip


def test_threshold_applies_in_cross_bundle_mode():
    bad = [{"x": np.ones((2, 2), np.float32)}] * 3 + [{"x": np.ones((2, 1), np.float32)}] * 3
    p = pipeline()
    run_kernel = (
        bj.RunKernel(
            kernels.failing_mean,
            spec={"x": bj.ArraySpec(("L", 1), np.float32)},
            bucketing=BUCKETING,
            load_params=lambda: np.float32(1.0),
        )
        .with_cross_bundle_batching(max_wait_s=3600)
        .with_exception_handling(threshold=0.25)
    )
    _ = p | beam.Create(bad) | run_kernel  # fmt: skip
    with pytest.raises(Exception, match="3 of 6 elements failed"):
        run(p)
