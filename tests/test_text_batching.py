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
    assert isinstance(packed.policy, bj.PackingChoice) and set(packed.flops) == {"packed"}
    assert packed.reason == "--batching packed"
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
    assert empty.describe()["length_classes"] is None


def test_short_texts_get_rows_of_their_own_when_short_rows_cost_less_per_token():
    encoder = SentenceEncoder.from_dir()
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(8, 60, 2000), rng.integers(130, 256, 60)])
    rng.shuffle(lengths)
    flops_only = plan_batching(lengths, encoder, batching="packed", attention_time=1.0)
    assert flops_only.plan.packing.pack_lengths == (256,)
    timed = plan_batching(lengths, encoder, batching="packed")  # attention's measured time
    classes = timed.plan.packing.pack_lengths
    assert len(classes) >= 2 and classes[-1] == 256 and timed.shapes <= 4
    assert timed.reason == "--batching packed" and timed.padding_ratio < 1.06
    assert timed.describe()["length_classes"] == list(classes)
    # Measured times per slot: rows of 64 and 128 as dear per token as 256 -> one class.
    flat = plan_batching(
        lengths, encoder, batching="packed", slot_costs={64: 1.0, 128: 1.0, 256: 1.0}
    )
    assert flat.plan.packing.pack_lengths == (256,)
    cheap = plan_batching(
        lengths, encoder, batching="packed", slot_costs={64: 0.7, 128: 0.8, 256: 1.0}
    )
    assert len(cheap.plan.packing.pack_lengths) >= 2
    auto = plan_batching(lengths, encoder, slot_costs={64: 0.7, 128: 0.8, 256: 1.0})
    assert auto.batching == "packed" and "; length classes: rows of 64" in auto.reason


def test_bad_arguments_say_what_was_given():
    with pytest.raises(
        bj.SpecError, match="batching must be one of auto, packed, buckets, got 'x'"
    ):
        plan_batching([4], Encoder(), batching="x")
    with pytest.raises(TypeError, match="got dict"):
        BatchingChoice(plan={}, flops={}, reason="")
    with pytest.raises(bj.SpecError, match="attention_time must be positive, got 0"):
        plan_batching([4], Encoder(), attention_time=0)
    with pytest.raises(bj.SpecError, match=r"for each packed row length \[32, 64, 128\]"):
        plan_batching([4], Encoder(), slot_costs={128: 1.0})
