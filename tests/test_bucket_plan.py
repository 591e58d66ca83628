"""plan_bucketing: buckets and batch sizes under a compile budget, batch rows counted."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax.internal import Plan, padding_ratio


def simulated_padding(lengths, plan, max_size):
    """Padded over real volume when ``lengths`` arrive in one bundle and are batched as the
    engine does: full batches of a bucket's largest size, the rest padded up to the
    smallest allowed size that holds it."""
    lengths = np.minimum(np.maximum(np.asarray(lengths), 1), max_size)
    engine = Plan(bj.ArraySpec(("L",), np.int32), plan.bucketing)
    bounds = plan.bucketing.boundaries["L"]
    index = np.searchsorted(bounds, lengths)
    padded = 0
    for i, b in enumerate(bounds):
        n = int((index == i).sum())
        top = engine.max_batch((b,))
        full, rest = divmod(n, top)
        padded += b * top * full
        if rest:
            padded += b * engine.padded_batch_size((b,), rest)
    return padded / lengths.sum()


lengths_st = st.lists(st.integers(0, 300), min_size=1, max_size=300)


@settings(max_examples=100, deadline=2000)
@given(
    lengths=lengths_st,
    budget=st.integers(1, 12),
    max_batch=st.integers(1, 64),
    max_padded=st.one_of(st.none(), st.integers(256, 4096)),
    devices=st.sampled_from([1, 2, 4]),
)
def test_plan_keeps_the_budget_and_predicts_its_padding(
    lengths, budget, max_batch, max_padded, devices
):
    plan = bj.plan_bucketing(
        lengths,
        max_size=256,
        compile_budget=budget,
        max_batch_size=max_batch,
        max_padded_size=max_padded,
        num_devices=devices,
    )
    engine = Plan(bj.ArraySpec(("L",), np.int32), plan.bucketing, num_devices=devices)
    # The shapes the engine will compile are exactly the plan's, within the budget.
    assert len(engine.shapes()) == plan.shapes <= budget
    assert plan.bucketing.boundaries["L"][-1] == 256
    assert all(s % devices == 0 for _, s in engine.shapes())
    # Its expected padding is what batching the sample itself gives.
    assert plan.padding_ratio == pytest.approx(simulated_padding(lengths, plan, 256))
    assert sum(plan.counts) == len(lengths)


@settings(max_examples=100, deadline=2000)
@given(lengths=lengths_st, budget=st.integers(1, 10))
def test_more_budget_never_pads_more(lengths, budget):
    small = bj.plan_bucketing(lengths, max_size=256, compile_budget=budget)
    large = bj.plan_bucketing(lengths, max_size=256, compile_budget=budget + 3)
    assert large.padding_ratio <= small.padding_ratio + 1e-12


@settings(max_examples=100, deadline=2000)
@given(lengths=lengths_st, budget=st.integers(2, 12))
def test_a_price_per_shape_buys_fewer_shapes(lengths, budget):
    free = bj.plan_bucketing(lengths, max_size=256, compile_budget=budget)
    priced = bj.plan_bucketing(lengths, max_size=256, compile_budget=budget, shape_cost=1e9)
    assert priced.shapes <= free.shapes
    assert priced.shapes == len(priced.bucketing.boundaries["L"])


def test_equal_batches_pad_fewer_rows_than_batches():
    # 130 elements of one length, at most 64 a batch: 3 batches of 44 (2 padded rows),
    # where batches of 64 would pad the last one by 62.
    plan = bj.plan_bucketing([20] * 130, max_size=20, compile_budget=1)
    assert plan.bucketing.batch_sizes == {(20,): (44,)}
    assert plan.padding_ratio == pytest.approx(132 / 130)


def test_total_scales_the_sample_to_the_job():
    plan = bj.plan_bucketing([20] * 10, max_size=20, compile_budget=1, total=1000)
    assert plan.counts == (1000,)
    assert plan.bucketing.batch_sizes[(20,)] == (63,)  # 16 batches of at most 63 rows
    assert plan.padding_ratio == pytest.approx(16 * 63 / 1000)


def test_long_tailed_text_lengths_reach_low_padding_with_the_budget():
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(30), 0.9, 2000)), 3, 256).astype(int)
    fixed = padding_ratio(lengths, (16, 24, 32, 48, 64, 96, 128, 192, 256))
    plan = bj.plan_bucketing(lengths, max_size=256, compile_budget=24, max_padded_size=2048)
    assert plan.shapes <= 24
    assert plan.padding_ratio < 1.08 < fixed


def test_a_bucket_the_sample_misses_still_takes_elements():
    plan = bj.plan_bucketing([5, 5, 6], max_size=64, compile_budget=4)
    assert plan.bucketing.boundaries["L"][-1] == 64
    engine = Plan(bj.ArraySpec(("L",), np.int32), plan.bucketing)
    assert engine.padded_batch_size((64,), 1) >= 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"compile_budget": 0}, "compile_budget"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"shape_cost": -1.0}, "shape_cost"),
        ({"total": 0}, "total"),
        ({"max_padded_size": 0}, "max_padded_size=0 is below max_size=8"),
        ({"max_padded_size": 4}, "Raise max_padded_size to at least 8, or lower max_size"),
    ],
)
def test_bad_limits_are_refused(kwargs, message):
    with pytest.raises(bj.SpecError, match=message):
        bj.plan_bucketing([3, 4], max_size=8, **kwargs)


def test_per_bucket_batch_sizes_are_validated():
    with pytest.raises(bj.SpecError, match=r"bucket \(8,\)"):
        bj.Bucketing(boundaries={"L": (8,)}, batch_sizes={(8,): (4, 2)})
    bucketing = bj.Bucketing(boundaries={"L": (8, 16)}, batch_sizes={(8,): (3,)}, batch_size=8)
    with pytest.raises(bj.SpecError, match="no entry for bucket"):
        Plan(bj.ArraySpec(("L",)), bucketing)
    assert math.isfinite(bj.plan_bucketing([1], max_size=1, compile_budget=1).padding_ratio)
