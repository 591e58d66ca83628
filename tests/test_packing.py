"""Sequence packing (pure numpy): the policy, packing and unpacking, and its planner."""

from __future__ import annotations

import re

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

import beam_jax as bj
from beam_jax._src.bucketing.packing import assign_rows, batch_rows
from beam_jax._src.bucketing.packing_choice import simulate_packing
from beam_jax._src.core.packed_batch import SegmentInfo
from beam_jax.internal import Packer

PROPERTY = hypothesis.settings(max_examples=150, deadline=2000, derandomize=True)

lengths_st = st.lists(st.integers(0, 40), min_size=0, max_size=120)


def _packing(top, shorter, sizes, segments, algorithm, classes):
    lengths = tuple(sorted({top, *[s for s in shorter if s < top]}))
    return bj.Packing(
        row_lengths=lengths,
        rows_per_batch=tuple(sorted(set(sizes))),
        max_segments=segments,
        algorithm=algorithm,
        # Length classes: none, or a subset of the shorter rows with the longest.
        pack_lengths=None if classes is None else (*[n for n in lengths[:-1] if classes], top),
    )


packing_st = st.builds(
    _packing,
    top=st.integers(8, 48),
    shorter=st.lists(st.integers(1, 47), max_size=2),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    segments=st.none() | st.integers(1, 12),
    algorithm=st.sampled_from(["first_fit_decreasing", "best_fit"]),
    classes=st.none() | st.booleans(),
)


def segment_sums(batch):
    """The kernel of the properties: per row, the sum of each segment's values."""
    x, ids = batch.leaves[0], batch.segment_ids
    out = np.zeros((batch.size, batch.max_segments + 1), np.int64)
    np.add.at(out, (np.arange(batch.size)[:, None].repeat(ids.shape[1], 1), ids), x)
    return out[:, 1:]


def records_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(-1000, 1000, n).astype(np.int32) for n in lengths]


# --- the policy ---------------------------------------------------------------------


def test_packing_normalises_and_lists_its_shapes():
    p = bj.Packing(row_lengths=(256, 128), rows_per_batch=(32, 8))
    assert p.row_lengths == (128, 256) and p.max_row_length == 256 and p.max_segments == 256
    assert p.shapes() == [(128, 8), (128, 32), (256, 8), (256, 32)]
    q = bj.Packing(row_lengths=64, rows_per_batch={64: 4}, max_segments=16, algorithm="best_fit")
    assert q.shapes() == [(64, 4)] and q.sizes_for(64) == (4,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"row_lengths": 0}, "row_lengths must be a positive int or a non-empty sequence"),
        ({"row_lengths": ()}, "got ()"),
        ({"row_lengths": (8, 8)}, "must not repeat"),
        ({"row_lengths": 8, "rows_per_batch": 0}, "rows_per_batch must be a positive int"),
        ({"row_lengths": 8, "rows_per_batch": {16: 4}}, "exactly the row lengths (8,)"),
        ({"row_lengths": 8, "max_segments": 0}, "max_segments must be a positive int, got 0"),
        ({"row_lengths": 8, "algorithm": "next_fit"}, "algorithm must be one of"),
        ({"row_lengths": (8, 16), "pack_lengths": (8,)}, "include the longest (16), got (8,)"),
        ({"row_lengths": (8, 16), "pack_lengths": (4, 16)}, "among row_lengths (8, 16)"),
    ],
)
def test_packing_rejects_bad_values(kwargs, message):
    with pytest.raises(bj.SpecError, match=re.escape(message)):
        bj.Packing(**kwargs)


@pytest.mark.parametrize(
    "spec, message",
    [
        (bj.ArraySpec((4,), np.float32), "no ragged axis, so there is nothing to pack"),
        (
            {"a": bj.ArraySpec(("L",)), "b": bj.ArraySpec(("M",))},
            "several ragged axes ['L', 'M']",
        ),
        (bj.ArraySpec(("L", "L")), "has the ragged axis 'L' 2 times"),
    ],
)
def test_specs_that_cannot_be_packed_are_refused_at_construction(spec, message):
    with pytest.raises(bj.SpecError, match=re.escape(message)):
        Packer(spec, bj.Packing(row_lengths=8))


# --- packing ------------------------------------------------------------------------


def test_first_fit_and_best_fit_place_records_as_documented():
    lengths = [6, 5, 3, 2, 2]
    ffd = assign_rows(lengths, bj.Packing(row_lengths=8))
    # 6 -> row 0; 5 -> row 1; 3 -> row 1; 2 -> row 0 (first with room); 2 -> none: row 2
    assert ffd.row.tolist() == [0, 1, 1, 0, 2]
    # 8 -> row 0 (room 2); 6 -> row 1 (room 4); 3 -> row 1 (room 1); then 1 goes to the
    # first row with room (row 0) or to the one it leaves least room in (row 1).
    first = assign_rows([8, 6, 3, 1], bj.Packing(row_lengths=10))
    best = assign_rows([8, 6, 3, 1], bj.Packing(row_lengths=10, algorithm="best_fit"))
    assert first.row.tolist() == [0, 1, 1, 0] and best.row.tolist() == [0, 1, 1, 1]
    assert first.offset.tolist() == [0, 0, 6, 8] and best.segment.tolist() == [0, 0, 1, 2]


def test_rows_are_cut_to_the_shortest_row_length_that_holds_them():
    a = assign_rows([16, 16, 3], bj.Packing(row_lengths=(4, 8, 32)))
    assert a.used.tolist() == [32, 3] and a.row_lengths.tolist() == [32, 4]


def test_length_classes_pack_short_records_into_short_rows_of_their_own():
    packing = bj.Packing(row_lengths=(4, 8, 16), pack_lengths=(8, 16), rows_per_batch=2)
    a = assign_rows([3, 10, 5, 2, 9, 7, 1, 6, 20], packing)
    # 10 and 9 (class 16) open rows of 16; the shorter records fill their room first (those
    # slots run anyway), then open rows of 8 (the last cut to 4).
    assert a.row.tolist() == [2, 0, 2, 3, 1, 1, 3, 0, -1]
    assert a.row_lengths.tolist() == [16, 16, 8, 4] and a.used.tolist() == [16, 16, 8, 3]
    assert a.offset.tolist() == [5, 0, 0, 0, 0, 9, 2, 10, -1]
    assert a.refused.tolist() == [8]
    assert [(n, s, m.tolist()) for n, s, m in batch_rows(a, packing)] == [
        (4, 2, [3]),
        (8, 2, [2]),
        (16, 2, [0, 1]),
    ]
    # One class (the default): every row is opened at 16.
    one = assign_rows([3, 10, 5, 2, 9, 7, 1, 6], bj.Packing(row_lengths=(4, 8, 16)))
    assert one.row_lengths.tolist() == [16, 16, 16]


def test_max_segments_caps_records_per_row():
    a = assign_rows([1] * 10, bj.Packing(row_lengths=100, max_segments=4))
    assert a.counts.tolist() == [4, 4, 2]


def test_rows_fill_the_largest_batch_then_the_smallest_that_holds_the_rest():
    a = assign_rows([8] * 11, bj.Packing(row_lengths=8, rows_per_batch=(2, 4)))
    assert [(n, s, len(m)) for n, s, m in batch_rows(a, bj.Packing(row_lengths=8,
            rows_per_batch=(2, 4)))] == [(8, 4, 4), (8, 4, 4), (8, 4, 3)]  # fmt: skip
    p = bj.Packing(row_lengths=8, rows_per_batch=(1, 2, 4))
    assert [s for _, s, _ in batch_rows(assign_rows([8] * 6, p), p)] == [4, 2]


def test_a_record_longer_than_the_longest_row_is_refused_alone():
    plan = Packer(bj.ArraySpec(("L",), np.int32), bj.Packing(row_lengths=8))
    result = plan.pack(records_of([3, 9, 8]))
    assert [r.index for r in result.refused] == [1]
    error = result.refused[0].error
    assert isinstance(error, bj.ElementTooLargeError)
    assert "has length 9 at record 1" in str(error) and "longest packed row (8)" in str(error)
    assert sorted(i for b in result.batches for i in b.indices) == [0, 2]
    outputs = plan.unpack(result, [segment_sums(b) for b in result.batches])
    assert outputs[1] is None and outputs[0] is not None


def test_a_record_that_breaks_the_spec_is_refused_alone():
    spec = {"ids": bj.ArraySpec(("L",), np.int32), "w": bj.ArraySpec(("L", 2), np.float32)}
    plan = Packer(spec, bj.Packing(row_lengths=8))
    good = {"ids": np.ones(3, np.int32), "w": np.ones((3, 2), np.float32)}
    uneven = {"ids": np.ones(3, np.int32), "w": np.ones((4, 2), np.float32)}
    wrong = {"ids": np.ones(3, np.int32), "w": np.ones((3, 5), np.float32)}
    result = plan.pack([good, uneven, wrong, {"ids": np.ones(3, np.int32)}, good])
    assert [r.index for r in result.refused] == [1, 2, 3]
    assert "leaves sharing an axis name must agree" in str(result.refused[0].error)
    assert "expected ('L', 2)" in str(result.refused[1].error)
    assert "record 3 does not have the spec's structure" in str(result.refused[2].error)
    assert all(isinstance(r.error, bj.InvalidElementError) for r in result.refused)
    assert sorted(i for b in result.batches for i in b.indices) == [0, 4]
    assert "record 0 has 1 leaves, expected 2" in str(
        plan.pack_leaves([[good["ids"]]]).refused[0].error
    )


def test_segment_info_positions_and_non_ragged_leaves():
    spec = {
        "x": bj.ArraySpec((2, "L"), np.float32, pad_value=-1),  # ragged axis not first
        "tag": bj.ArraySpec((), np.int32, pad_value=-7),  # carried per segment
    }
    plan = Packer(spec, bj.Packing(row_lengths=6, rows_per_batch=2, max_segments=3))
    records = [
        {"x": np.arange(8, dtype=np.float32).reshape(2, 4), "tag": np.int32(10)},
        {"x": np.full((2, 2), 5, np.float32), "tag": np.int32(20)},
        {"x": np.full((2, 3), 9, np.float32), "tag": np.int32(30)},
    ]
    (batch,) = plan.pack(records).batches
    assert batch.segment_ids.tolist() == [[1, 1, 1, 1, 2, 2], [1, 1, 1, 0, 0, 0]]
    assert batch.positions.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 0, 0]]
    assert batch.segment_counts.tolist() == [2, 1]
    assert batch.segments.lengths.tolist() == [[4, 2, 0], [3, 0, 0]]
    assert isinstance(batch.segments, SegmentInfo)
    tag, x = batch.element_leaves  # leaves in the spec's (sorted-key) order
    assert batch.leaves == (tag, x, *batch.segments)  # what the kernel receives
    assert x.shape == (2, 2, 6) and x[1, 0].tolist() == [9, 9, 9, -1, -1, -1]
    assert tag.tolist() == [[10, 20, -7], [30, -7, -7]]
    assert (batch.empty_slots, batch.empty_rows, batch.padded_volume) == (3, 0, 12)
    assert [(s, d) for s, d in plan.leaf_shapes(6, 2)] == [
        ((2, 3), np.int32),
        ((2, 2, 6), np.float32),
    ]
    back = plan.unpack_inputs(batch)
    for i, leaves in zip(batch.indices, back, strict=True):
        assert leaves[0] == records[i]["tag"]
        np.testing.assert_array_equal(leaves[1], records[i]["x"])


def test_unpack_refuses_outputs_that_are_not_per_segment():
    packing = bj.Packing(row_lengths=8, rows_per_batch=1, max_segments=4)
    plan = Packer(bj.ArraySpec(("L",), np.int32), packing)
    result = plan.pack(records_of([3, 4]))
    with pytest.raises(bj.KernelError, match=re.escape("[rows, max_segments, ...] = [1, 4")):
        plan.unpack(result, [np.zeros((1, 8))])
    with pytest.raises(bj.KernelError, match="outputs for 2 batches, expected 1"):
        plan.unpack(result, [np.zeros((1, 4)), np.zeros((1, 4))])


def test_unpack_keeps_output_pytrees():
    plan = Packer(bj.ArraySpec(("L",), np.int32), bj.Packing(row_lengths=8, max_segments=2))
    result = plan.pack(records_of([3, 4, 8]))
    outputs = [
        {"sum": segment_sums(b), "pair": (segment_sums(b) * 2, np.ones((b.size, 2, 3)))}
        for b in result.batches
    ]
    got = plan.unpack(result, outputs)
    for record, out in zip(records_of([3, 4, 8]), got, strict=True):
        assert out["sum"] == record.sum() and out["pair"][0] == 2 * record.sum()
        assert out["pair"][1].shape == (3,)


# --- properties ---------------------------------------------------------------------


@PROPERTY
@hypothesis.given(lengths=lengths_st, packing=packing_st, seed=st.integers(0, 2**16))
def test_segment_sums_unpack_to_each_records_own_sum(lengths, packing, seed):
    records = records_of(lengths, seed)
    plan = Packer(bj.ArraySpec(("L",), np.int32), packing)
    result = plan.pack(records)
    got = plan.unpack(result, [segment_sums(b) for b in result.batches])
    refused = {r.index for r in result.refused}
    assert refused == {i for i, n in enumerate(lengths) if n > packing.max_row_length}
    for i, (record, out) in enumerate(zip(records, got, strict=True)):
        if i in refused:
            assert out is None
        else:
            assert int(out) == int(record.sum())


@PROPERTY
@hypothesis.given(lengths=lengths_st, packing=packing_st, marks=st.lists(st.booleans()))
def test_rows_marked_first_fill_the_full_batches_first_in_the_same_batches(lengths, packing, marks):
    a = assign_rows(lengths, packing)
    first = np.zeros(len(a.row_lengths), bool)
    first[: len(marks)] = marks[: len(first)]
    plain, marked = batch_rows(a, packing), batch_rows(a, packing, first)
    # The same batches (row length and size, in order) of the same rows.
    assert [(n, s, len(m)) for n, s, m in marked] == [(n, s, len(m)) for n, s, m in plain]
    assert sorted(np.concatenate([m for *_, m in marked] or [[]]).tolist()) == list(
        range(len(a.row_lengths))
    )
    for length in packing.row_lengths:
        rows = np.concatenate([m for n, _, m in marked if n == length] or [[]]).astype(int)
        # Marked rows first, each group in row order.
        assert rows.tolist() == sorted(rows.tolist(), key=lambda r: (not first[r], r))


@PROPERTY
@hypothesis.given(lengths=lengths_st, packing=packing_st)
def test_every_record_once_no_segment_crosses_a_row_and_round_trip(lengths, packing):
    records = records_of(lengths)
    plan = Packer(bj.ArraySpec(("L",), np.int32), packing)
    result = plan.pack(records)
    seen = [int(i) for b in result.batches for i in b.indices]
    refused = [r.index for r in result.refused]
    assert sorted(seen + refused) == list(range(len(records)))  # every record exactly once
    for b in result.batches:
        assert (b.row_length, b.size) in packing.shapes()
        assert b.leaves[0].shape == (b.size, b.row_length)
        assert np.all(b.offsets + b.record_lengths <= b.row_length)  # no segment crosses a row
        assert np.all(b.segment < packing.max_segments)
        for r in range(b.size):
            ids = b.segment_ids[r]
            mine = b.rows == r
            assert b.segment_counts[r] == mine.sum()
            # Slots of each segment are contiguous and exactly its record's length.
            runs = zip(b.segment[mine], b.offsets[mine], b.record_lengths[mine], strict=True)
            for s, o, n in runs:
                assert np.all(ids[o : o + n] == s + 1)
                assert b.positions[r, o : o + n].tolist() == list(range(n))
            assert (ids > 0).sum() == b.record_lengths[mine].sum()
        assert b.num_rows == len(set(b.rows.tolist()))
        for i, leaves in zip(b.indices, plan.unpack_inputs(b), strict=True):
            np.testing.assert_array_equal(leaves[0], records[i])


@PROPERTY
@hypothesis.given(
    lengths=st.lists(st.integers(0, 48), min_size=1, max_size=150),
    packing=packing_st,
    buffer_size=st.none() | st.integers(1, 60),
)
def test_simulated_padding_equals_the_batches_packed(lengths, packing, buffer_size):
    lengths = [min(n, packing.max_row_length) for n in lengths]
    stats = simulate_packing(lengths, packing, buffer_size=buffer_size)
    plan = Packer(bj.ArraySpec(("L",), np.int32), packing)
    step = buffer_size or len(lengths)
    padded = real = empty_rows = batches = 0
    for start in range(0, len(lengths), step):
        result = plan.pack(records_of(lengths[start : start + step]))
        padded += result.padded_volume
        real += result.real_volume
        empty_rows += result.empty_rows
        batches += len(result.batches)
    assert (stats.padded, stats.real, stats.empty_rows, stats.batches) == (
        padded,
        real,
        empty_rows,
        batches,
    )
    assert real == sum(lengths)


# --- planning -----------------------------------------------------------------------


@hypothesis.settings(max_examples=150, deadline=5000, derandomize=True)
@hypothesis.given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=200),
    budget=st.integers(1, 5),
    buffer_size=st.none() | st.integers(5, 80),
    max_rows=st.integers(1, 16),
)
def test_planned_padding_is_what_packing_the_sample_gives(lengths, budget, buffer_size, max_rows):
    plan = bj.plan_packing(
        lengths,
        max_size=64,
        compile_budget=budget,
        buffer_size=buffer_size,
        max_rows_per_batch=max_rows,
    )
    assert plan.shapes == len(plan.packing.shapes()) <= budget
    assert plan.packing.max_row_length >= 64
    assert all(s <= max_rows for n in plan.packing.row_lengths for s in plan.packing.sizes_for(n))
    packer = Packer(bj.ArraySpec(("L",), np.int32), plan.packing)
    step = buffer_size or len(lengths)
    padded = real = 0
    for start in range(0, len(lengths), step):
        result = packer.pack(records_of(lengths[start : start + step]))
        assert not result.refused
        padded += result.padded_volume
        real += result.real_volume
    assert plan.padding_ratio == padded / real  # predicted == packed, exactly
    assert plan.stats.max_segments <= plan.packing.max_segments


def test_plan_packing_small_example_and_its_choices():
    sample = [30, 12, 7, 100, 64, 3] * 20
    # Buffers of 60 texts hold 2,160 tokens: 16.9 rows of 128. One shape pads the 17th
    # row and a batch row; a second shape lets the 17th row be a row of 64.
    one = bj.plan_packing(sample, max_size=128, buffer_size=60, compile_budget=1)
    assert one.packing.shapes() == [(128, 18)] and one.padding_ratio == 18 * 128 / 2160
    two = bj.plan_packing(sample, max_size=128, buffer_size=60, compile_budget=4)
    assert two.packing.shapes() == [(64, 1), (128, 17)]
    assert two.padding_ratio == (17 * 128 + 64) / 2160
    assert two.stats.max_segments == 7 and two.packing.max_segments == 8


def _priced(lengths, plan, slot_costs, shape_cost, buffer_size=None):
    """What a plan costs on the sample: its batches' slots at their row length's price."""
    lengths = np.asarray(lengths)
    step = buffer_size or len(lengths)
    cost = shape_cost * plan.shapes
    for start in range(0, len(lengths), step):
        a = assign_rows(lengths[start : start + step], plan.packing)
        cost += sum(n * size * slot_costs[n] for n, size, _ in batch_rows(a, plan.packing))
    return cost


@hypothesis.settings(max_examples=80, deadline=None, derandomize=True)
@hypothesis.given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=200),
    budget=st.integers(1, 4),
    buffer_size=st.none() | st.integers(5, 80),
    short_cost=st.floats(0.3, 1.2),
)
def test_length_classes_are_chosen_only_when_priced_lower(lengths, budget, buffer_size, short_cost):
    costs = {16: short_cost, 32: (1 + short_cost) / 2, 64: 1.0}
    common = dict(max_size=64, compile_budget=budget, buffer_size=buffer_size, shape_cost=50.0)
    plan = bj.plan_packing(lengths, slot_costs=costs, **common)
    flat = bj.plan_packing(lengths, slot_costs=costs, length_classes=False, **common)
    assert flat.packing.pack_lengths == (flat.packing.max_row_length,)
    assert plan.shapes <= budget and set(plan.packing.pack_lengths) <= set(plan.packing.row_lengths)
    price = _priced(lengths, plan, costs, 50.0, buffer_size)
    flat_price = _priced(lengths, flat, costs, 50.0, buffer_size)
    assert price <= flat_price + 1e-6
    if len(plan.packing.pack_lengths) > 1:
        assert price < flat_price  # classes only when strictly cheaper
    # The padding predicted is the padding the packer gives, classes or not.
    packer = Packer(bj.ArraySpec(("L",), np.int32), plan.packing)
    step = buffer_size or len(lengths)
    padded = sum(
        packer.pack(records_of(lengths[i : i + step])).padded_volume
        for i in range(0, len(lengths), step)
    )
    assert plan.padding_ratio == padded / sum(lengths)


def test_cheaper_short_rows_give_short_records_a_class_of_their_own():
    rng = np.random.default_rng(0)
    sample = np.concatenate([rng.integers(8, 60, 2000), rng.integers(130, 256, 40)])
    rng.shuffle(sample)
    costs = {64: 0.75, 128: 0.85, 256: 1.0}
    plan = bj.plan_packing(sample, max_size=256, slot_costs=costs, shape_cost=2000)
    assert plan.packing.pack_lengths[-1] == 256 and len(plan.packing.pack_lengths) >= 2
    flat = bj.plan_packing(sample, max_size=256, slot_costs={n: 1.0 for n in costs})
    assert flat.packing.pack_lengths == (256,)  # equal prices: one class packs tighter


def test_attention_cost_prefers_shorter_rows():
    rng = np.random.default_rng(0)
    sample = np.clip(rng.lognormal(3, 1, 2000), 2, 256).astype(int)
    cheap = bj.plan_packing(sample, max_size=256, row_lengths=(256, 512, 1024))
    costly = bj.plan_packing(
        sample, max_size=256, row_lengths=(256, 512, 1024), attention_cost=1 / (6 * 384)
    )
    assert cheap.packing.max_row_length >= costly.packing.max_row_length == 256
    assert cheap.padding_ratio <= costly.padding_ratio


def test_plan_packing_truncates_long_samples_and_respects_token_budgets():
    plan = bj.plan_packing(
        [300, 20, 20, 5] * 50, max_size=64, max_tokens_per_batch=256, num_devices=2
    )
    for n in plan.packing.row_lengths:
        assert all(s * n <= 256 and s % 2 == 0 for s in plan.packing.sizes_for(n))
    assert plan.stats.real == (64 + 20 + 20 + 5) * 50


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lengths": []}, "non-empty 1-D"),
        ({"lengths": [1.5]}, "integers"),
        ({"lengths": [-1]}, "non-negative"),
        ({"compile_budget": 0}, "compile_budget must be a positive int, got 0"),
        ({"row_lengths": (8, 16)}, "one at least max_size (32)"),
        ({"buffer_size": 0}, "buffer_size must be a positive int"),
        ({"algorithm": "x"}, "algorithm must be one of"),
        ({"attention_cost": -1.0}, "must be >= 0"),
        ({"slot_costs": {8: 1.0, 16: 1.0}}, "missing [32]"),
        ({"slot_costs": {8: 1.0, 16: 0.0, 32: 1.0}}, "not positive {16: 0.0}"),
        ({"slot_costs": {8: 1, 16: 1, 32: 1}, "attention_cost": 0.1}, "not both"),
    ],
)
def test_plan_packing_rejects_bad_arguments(kwargs, message):
    args = {"lengths": [3, 4], "max_size": 32, **kwargs}
    with pytest.raises(bj.SpecError, match=re.escape(message)):
        bj.plan_packing(args.pop("lengths"), **args)


def test_simulate_packing_refuses_lengths_past_the_longest_row():
    with pytest.raises(bj.SpecError, match="exceeds the longest row"):
        simulate_packing([9], bj.Packing(row_lengths=8))


MIXED_SPEC = {
    "ids": bj.ArraySpec(("L",), np.int32),
    "w": bj.ArraySpec(("L", 2), np.int32, pad_value=-5),
    "t": bj.ArraySpec((3, "L"), np.int32),
    "tag": bj.ArraySpec((), np.int32, pad_value=-1),
}


@PROPERTY
@hypothesis.given(lengths=lengths_st, packing=packing_st, seed=st.integers(0, 2**16))
def test_pytrees_of_mixed_leaves_round_trip_and_unpack_per_segment(lengths, packing, seed):
    rng = np.random.default_rng(seed)
    records = [
        {
            "ids": rng.integers(0, 100, n).astype(np.int32),
            "w": rng.integers(-9, 9, (n, 2)).astype(np.int32),
            "t": rng.integers(-9, 9, (3, n)).astype(np.int32),
            "tag": np.int32(i),
        }
        for i, n in enumerate(lengths)
    ]
    plan = Packer(MIXED_SPEC, packing)
    result = plan.pack(records)
    names = plan.layout.names
    outputs = []
    for b in result.batches:
        leaves = dict(zip(names, b.element_leaves, strict=True))
        w, t, ids = leaves["['w']"], leaves["['t']"], b.segment_ids
        sums = np.zeros((b.size, b.max_segments + 1), np.int64)
        rows = np.arange(b.size)[:, None].repeat(ids.shape[1], 1)
        np.add.at(sums, (rows, ids), w.sum(-1) + t.sum(1))
        outputs.append({"sum": sums[:, 1:], "tag": leaves["['tag']"]})
    got = plan.unpack(result, outputs)
    for record, out in zip(records, got, strict=True):
        if out is None:
            assert len(record["ids"]) > packing.max_row_length
            continue
        assert out["tag"] == record["tag"]
        assert out["sum"] == record["w"].sum() + record["t"].sum()
    for b in result.batches:
        for i, leaves in zip(b.indices, plan.unpack_inputs(b), strict=True):
            for name, leaf in zip(names, leaves, strict=True):
                np.testing.assert_array_equal(leaf, records[i][name[2:-2]])


def _first_fit_reference(lengths, capacity, max_segments):
    """First fit decreasing by a plain scan of the open rows: (row, segment) per record."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    room, counts, placed = [], [], {}
    for i in order:
        if lengths[i] > capacity:
            continue
        r = next(
            (r for r in range(len(room)) if room[r] >= lengths[i] and counts[r] < max_segments),
            None,
        )
        if r is None:
            r = len(room)
            room.append(capacity)
            counts.append(0)
        placed[i] = (r, counts[r])
        room[r] -= lengths[i]
        counts[r] += 1
    return placed


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    lengths=st.lists(st.integers(1, 40), min_size=0, max_size=120),
    max_segments=st.integers(1, 6),
)
def test_first_fit_matches_a_plain_scan_of_open_rows(lengths, max_segments):
    a = assign_rows(lengths, bj.Packing(row_lengths=32, max_segments=max_segments))
    placed = _first_fit_reference(lengths, 32, max_segments)
    got = {i: (int(a.row[i]), int(a.segment[i])) for i in range(len(lengths)) if a.row[i] >= 0}
    assert got == placed
    assert sorted(a.refused.tolist()) == [i for i, n in enumerate(lengths) if n > 32]


def test_lay_out_refuses_a_row_past_its_slots_or_segments():
    plan = Packer(
        bj.ArraySpec(("L",), np.float32),
        bj.Packing(row_lengths=64, rows_per_batch=8, max_segments=8),
    )
    nine = [[np.ones(1, np.float32)] for _ in range(9)]
    with pytest.raises(bj.SpecError, match="9 segments \\(max_segments 8\\)"):
        plan.lay_out(nine, [0] * 9, 64)
    long = [[np.ones(40, np.float32)] for _ in range(2)]
    with pytest.raises(bj.SpecError, match="up to 80 slots"):
        plan.lay_out(long, [0, 0], 64)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    rows=st.lists(st.integers(0, 5), min_size=0, max_size=30),
    data=st.data(),
)
def test_lay_out_places_each_row_records_end_to_end_in_the_order_given(rows, data):
    # Rows of 256 slots and 32 segments: even all 30 records of 8 values in one row fit
    # (overflowing a row is refused, tested apart).
    plan = Packer(
        bj.ArraySpec(("L",), np.float32),
        bj.Packing(row_lengths=256, rows_per_batch=8, max_segments=32),
    )
    if data.draw(st.booleans()):
        rows = sorted(rows)  # each row's records adjacent, as the packer gives them
    lengths = [data.draw(st.integers(0, 8)) for _ in rows]  # an empty record takes no slot
    records = [[np.full(n, i + 1, np.float32)] for i, n in enumerate(lengths)]
    batch = plan.lay_out(records, rows, 256)
    given = plan.lay_out(records, rows, 256, lengths)
    numbered = {r: k for k, r in enumerate(dict.fromkeys(rows))}  # by first appearance
    used: dict[int, int] = {}
    for i, (r, n) in enumerate(zip(rows, lengths, strict=True)):
        row, start = numbered[r], used.get(numbered[r], 0)
        used[row] = start + n
        for b in (batch, given):
            assert b.rows[i] == row and b.offsets[i] == start
            assert b.leaves[0][row, start : start + n].tolist() == [i + 1] * n
            assert b.segment_ids[row, start : start + n].tolist() == [b.segment[i] + 1] * n
            assert b.positions[row, start : start + n].tolist() == list(range(n))
    for b in (batch, given):  # past each row's records: padding, in no segment
        for row in range(b.size):
            assert not b.segment_ids[row, used.get(row, 0) :].any()
            assert not b.positions[row, used.get(row, 0) :].any()
            assert not b.leaves[0][row, used.get(row, 0) :].any()
    for b in (batch, given):
        assert b.segment.tolist() == [
            sum(numbered[q] == numbered[r] for q in rows[:i]) for i, r in enumerate(rows)
        ]
        per_row = [sum(numbered[r] == k for r in rows) for k in range(len(numbered))]
        assert b.segment_counts[: len(numbered)].tolist() == per_row
        assert not b.segment_counts[len(numbered) :].any()
