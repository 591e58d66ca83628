"""beam_jax.text.plan_batching: packing or length buckets, chosen by predicted FLOPs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax.text import BatchingChoice, SentenceEncoder, plan_batching


@dataclasses.dataclass(frozen=True)
class Encoder:
    """A BERT's cost model: dense FLOPs per token, plus attention growing with the length."""

    max_length: int = 128
    hidden: int = 64

    def flops_per_token(self, length: int) -> int:
        return 2 * (24 * self.hidden**2 + 4 * self.hidden * length)


LENGTHS = st.lists(st.integers(2, 128), min_size=1, max_size=300)


@settings(max_examples=25, deadline=None)
@given(LENGTHS, st.integers(1, 8), st.sampled_from([0.0, 100.0, 1e6]))
def test_auto_takes_the_plan_with_the_lower_predicted_cost(lengths, budget, shape_cost):
    encoder = Encoder()
    choice = plan_batching(lengths, encoder, compile_budget=budget, shape_cost=shape_cost)
    both = {
        k: plan_batching(lengths, encoder, batching=k, compile_budget=budget,
                         shape_cost=shape_cost)
        for k in ("buckets", "packed")
    }  # fmt: skip
    assert set(choice.flops) == {"buckets", "packed"} and choice.shapes <= budget
    price = shape_cost * encoder.flops_per_token(max(1, int(np.mean(lengths))))
    cost = {k: choice.flops[k] * sum(lengths) + price * c.shapes for k, c in both.items()}
    assert choice.batching == ("packed" if cost["packed"] < cost["buckets"] else "buckets")
    assert choice.plan == both[choice.batching].plan
    assert choice.reason.startswith(
        f"{'packing' if choice.batching == 'packed' else 'buckets'} chosen"
    )


@given(LENGTHS)
def test_a_forced_policy_is_planned_alone_and_says_so(lengths):
    packed = plan_batching(lengths, Encoder(), batching="packed")
    assert isinstance(packed.policy, bj.PackingPlan) and set(packed.flops) == {"packed"}
    assert packed.reason == "--batching packed" and packed.padding_ratio >= 1.0
    buckets = plan_batching(lengths, Encoder(), batching="buckets")
    assert isinstance(buckets.policy, bj.Bucketing) and buckets.batching == "buckets"
    assert buckets.policy.boundaries["L"][-1] == 128  # every text fits
    assert buckets.describe()["flops_per_real_token"] == dict(buckets.flops)


def test_varied_short_texts_pack_with_the_packaged_model_and_equal_ones_bucket():
    encoder = SentenceEncoder.from_dir()
    varied = plan_batching(np.random.default_rng(0).integers(8, 40, 500), encoder)
    assert varied.batching == "packed" and varied.flops["packed"] < varied.flops["buckets"]
    same = plan_batching(np.full(400, 20), encoder)  # buckets fit exactly: nothing to pack
    assert same.batching == "buckets" and same.padding_ratio < 1.05  # batch rows only
    empty = plan_batching([], encoder, batching="buckets")
    assert empty.policy.boundaries["L"] == (encoder.max_length,)
    assert empty.describe()["shapes"] == empty.shapes


def test_bad_arguments_say_what_was_given():
    with pytest.raises(
        bj.SpecError, match="batching must be one of auto, packed, buckets, got 'x'"
    ):
        plan_batching([4], Encoder(), batching="x")
    with pytest.raises(TypeError, match="got dict"):
        BatchingChoice(plan={}, flops={}, reason="")
