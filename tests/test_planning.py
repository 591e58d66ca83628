"""Bucket planning: the DP is optimal (against brute force), respects the budget."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax import plan_boundaries
from beam_jax._src.bucketing.boundaries import boundaries_per_budget, padded_total
from beam_jax.internal import padding_ratio


def brute_force(lengths, num_buckets, max_size=None):
    """Least padded total over every choice of at most ``num_buckets`` boundaries."""
    lengths = np.maximum(np.asarray(lengths), 1)
    if max_size is not None:
        lengths = np.minimum(lengths, max_size)
    top = int(lengths.max()) if max_size is None else max_size
    candidates = sorted(set(int(v) for v in lengths) - {top})
    best = None
    for k in range(0, num_buckets):
        for combo in itertools.combinations(candidates, k):
            cost = padded_total(lengths, (*combo, top))
            best = cost if best is None else min(best, cost)
    return best


lengths_st = st.lists(st.integers(0, 40), min_size=1, max_size=25)


@settings(max_examples=150, deadline=2000)
@given(lengths=lengths_st, num_buckets=st.integers(1, 4))
def test_dp_matches_brute_force(lengths, num_buckets):
    bounds = plan_boundaries(lengths, num_buckets)
    assert padded_total(lengths, bounds) == brute_force(lengths, num_buckets)


@settings(max_examples=100, deadline=2000)
@given(lengths=lengths_st, num_buckets=st.integers(1, 4), max_size=st.integers(1, 60))
def test_dp_with_max_size_matches_brute_force(lengths, num_buckets, max_size):
    bounds = plan_boundaries(lengths, num_buckets, max_size=max_size)
    assert bounds[-1] == max_size
    clipped = np.minimum(lengths, max_size)
    assert padded_total(clipped, bounds) == brute_force(lengths, num_buckets, max_size)


@settings(max_examples=100, deadline=2000)
@given(lengths=lengths_st, max_buckets=st.integers(1, 4), max_size=st.none() | st.integers(1, 60))
def test_every_budget_at_once_matches_brute_force(lengths, max_buckets, max_size):
    per_budget = boundaries_per_budget(lengths, max_buckets, max_size=max_size)
    clipped = np.minimum(np.maximum(lengths, 1), max_size or 10**9)
    distinct = len(set(clipped.tolist()) | ({max_size} if max_size else set()))
    assert len(per_budget) == max_buckets
    for k, bounds in enumerate(per_budget, start=1):
        assert len(bounds) == min(k, distinct)
        assert padded_total(clipped, bounds) == brute_force(lengths, k, max_size)
        assert bounds == plan_boundaries(lengths, k, max_size=max_size)


@settings(max_examples=100, deadline=2000)
@given(lengths=lengths_st, num_buckets=st.integers(1, 10))
def test_respects_budget_and_covers_the_sample(lengths, num_buckets):
    bounds = plan_boundaries(lengths, num_buckets)
    assert 1 <= len(bounds) <= num_buckets
    assert list(bounds) == sorted(set(bounds))
    assert bounds[-1] == max(max(lengths), 1)
    bj.Bucketing(boundaries={"L": bounds})  # valid boundaries


def test_distinct_lengths_within_budget_pad_nothing():
    lengths = [3, 3, 7, 12, 12, 12]
    assert plan_boundaries(lengths, 8) == (3, 7, 12)
    assert padding_ratio(lengths, (3, 7, 12)) == 1.0


def test_padding_ratio_counts_padded_over_real():
    # 1 -> 4, 4 -> 4, 5 -> 8, 8 -> 8: padded 24, real 18.
    assert padding_ratio([1, 4, 5, 8], (4, 8)) == pytest.approx(24 / 18)
    # Longer than the last boundary: counted as the last boundary (truncated).
    assert padding_ratio([2, 20], (4,)) == pytest.approx((4 + 4) / (2 + 4))


def test_long_tailed_sample_plans_fast_and_beats_powers_of_two():
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(48), 1.0, 20_000)), 1, 512).astype(int)
    bounds = plan_boundaries(lengths, 8, max_size=512)
    assert len(bounds) == 8 and bounds[-1] == 512
    assert padding_ratio(lengths, bounds) < padding_ratio(lengths, (32, 64, 128, 256, 512))
    # More budget, less padding.
    assert padding_ratio(lengths, plan_boundaries(lengths, 16, max_size=512)) < padding_ratio(
        lengths, bounds
    )


def test_bucketing_from_sample():
    b = bj.Bucketing.from_sample(
        {"L": [1, 2, 2, 3, 9, 10, 10]}, num_buckets=2, batch_size=8, max_padded_size=64
    )
    assert b.boundaries == {"L": (3, 10)}
    assert b.batch_size == 8 and b.max_padded_size == 64
    b = bj.Bucketing.from_sample({"L": [5, 7]}, num_buckets=4, max_size={"L": 512})
    assert b.boundaries == {"L": (5, 7, 512)}


@pytest.mark.parametrize(
    "bad, match",
    [([], "non-empty"), ([1.5, 2], "integers"), ([-1, 3], "non-negative")],
)
def test_rejects_bad_samples(bad, match):
    with pytest.raises(bj.SpecError, match=match):
        plan_boundaries(bad, 2)


def test_rejects_bad_budget_and_bad_sample_container():
    with pytest.raises(bj.SpecError, match="num_buckets"):
        plan_boundaries([1, 2], 0)
    with pytest.raises(bj.SpecError, match="map ragged-axis names"):
        bj.Bucketing.from_sample([1, 2, 3])
