"""Records staged for packing as columns (``ColumnRecords``) against one object per record.

The Arrow front end stages a decoded record batch's rows as flat values, starts and lengths;
these properties check that, for any records, every view of them (a record, a subset, a
union, a packed batch laid out, the batches a stage launches) equals what records staged one
at a time as ``Validated`` give.
"""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pyarrow as pa

import beam_jax as bj
from beam_jax._src.arrow.fill import ColumnRecords
from beam_jax._src.bucketing.packing import assign_rows, batch_rows
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.engine.packing import ItemRecords, PackedBuffer, PackedStage, _batches_of

PROPERTY = hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
SPEC = {"x": bj.ArraySpec(("L", 2), np.float32), "w": bj.ArraySpec((), np.int32)}
PACKING = bj.Packing(row_lengths=(4, 8), rows_per_batch=(1, 2), max_segments=3)


def _columns(lengths, seed, string_ids=False, first_id=0):
    """Records as ``ColumnRecords`` (values with gaps between rows, as decoding may leave)
    and as the per-record leaves they stand for."""
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, 2)).astype(np.float32) for n in lengths]
    ws = rng.integers(0, 100, len(lengths)).astype(np.int32)
    gaps = rng.integers(0, 3, len(lengths))
    x_values, x_starts, at = [], [], 0
    for x, gap in zip(xs, gaps, strict=True):
        x_values.append(np.full(2 * gap, -1, np.float32))
        x_starts.append(at + 2 * gap)
        x_values.append(x.reshape(-1))
        at += 2 * gap + x.size
    ids = [first_id + i for i in range(len(lengths))]
    keys = pa.array([f"id-{i}" for i in ids]) if string_ids else np.asarray(ids, np.int64)
    records = ColumnRecords(
        # In the layout's leaf order: "w", then "x".
        [ws, np.concatenate(x_values) if x_values else np.zeros(0, np.float32)],
        [np.arange(len(lengths), dtype=np.int64), np.asarray(x_starts, np.int64)],
        [(False, 1, ()), (True, 2, (2,))],
        np.asarray(lengths, np.int64),
        keys,
        np.arange(len(lengths), dtype=np.int64),
        np.zeros(len(lengths), np.int64),
        [lambda key, row: ("source", key, row)],
        pa.string() if string_ids else pa.int64(),
    )
    return records, [[np.asarray(w), x] for x, w in zip(xs, ws, strict=True)]


lengths_st = st.lists(st.integers(1, 8), min_size=1, max_size=30)


@PROPERTY
@hypothesis.given(lengths=lengths_st, seed=st.integers(0, 2**16), cut=st.integers(0, 30))
def test_records_take_and_concat_keep_every_record(lengths, seed, cut):
    records, leaves = _columns(lengths, seed, string_ids=bool(seed % 2))
    cut = min(cut, len(lengths))
    rest, _ = _columns(lengths[:cut] or [1], seed + 1, string_ids=bool(seed % 2), first_id=99)
    both = ColumnRecords.concat([records, rest])
    _, rest_leaves = _columns(lengths[:cut] or [1], seed + 1)
    assert len(both) == len(records) + len(rest)
    for i, want in enumerate(leaves + rest_leaves):
        for got, expected in zip(both[i], want, strict=True):
            np.testing.assert_array_equal(got, expected)
    index = np.random.default_rng(seed).permutation(len(both))[: max(1, len(both) // 2)]
    subset = both.take(index)
    for k, i in enumerate(index.tolist()):
        assert subset.key(k) == both.key(i)
        assert subset.source(k) == both.source(i)
        for got, expected in zip(subset[k], both[i], strict=True):
            np.testing.assert_array_equal(got, expected)
    # What a stage keeps between packs holds only its own records' values.
    kept = ColumnRecords.concat([subset, rest])
    assert len(kept.values[1]) == 2 * int(kept.lengths.sum())
    assert len(kept.values[0]) == len(kept)
    assert len(kept.describe) == len(set(subset.batch.tolist())) + 1
    for k in range(len(subset)):
        for got, expected in zip(kept[k], subset[k], strict=True):
            np.testing.assert_array_equal(got, expected)
        assert kept.source(k) == subset.source(k)
    ids = subset.id_array(np.arange(len(subset)))
    assert ids.type == both.id_type
    assert ids.to_pylist() == [both.key(i) for i in index.tolist()]


@PROPERTY
@hypothesis.given(lengths=lengths_st, seed=st.integers(0, 2**16))
def test_column_records_lay_out_as_records_one_by_one(lengths, seed):
    plan = PackedPlan(SPEC, PACKING)
    records, leaves = _columns(lengths, seed)
    rng = np.random.default_rng(seed)
    index = np.sort(rng.permutation(len(lengths))[: rng.integers(1, len(lengths) + 1)])
    # Rows of at most 8 slots and 3 segments, in index order: a valid layout.
    rows, row, used, count = [], 0, 0, 0
    for i in index.tolist():
        if used + lengths[i] > 8 or count == 3:
            row, used, count = row + 1, 0, 0
        rows.append(row)
        used, count = used + lengths[i], count + 1
    hypothesis.assume(row < 2)
    got = records.lay_out(plan, index, rows, 8)
    want = plan.packer.lay_out([leaves[i] for i in index.tolist()], rows, 8)
    for a, b in zip(got.leaves, want.leaves, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got.record_lengths, want.record_lengths)


class _Engine:
    """Records what a stage launches: per batch, its row length and records' keys by row."""

    def __init__(self, key):
        self.batches = []
        self._key = key

    def launch(self, buffer):
        packed = buffer.padded()
        keys = [self._key(buffer.records, i) for i in range(buffer.size)]
        self.batches.append((buffer.bucket, keys, packed.rows.tolist(), packed.segment.tolist()))
        np.testing.assert_array_equal(packed.record_lengths, buffer.records.lengths)
        return iter(())

    def reject(self, error, stage, sources):
        raise AssertionError(f"nothing is refused here: {error}")


@PROPERTY
@hypothesis.given(
    chunks=st.lists(lengths_st, min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
    buffer_size=st.sampled_from([None, 7, 20]),
)
def test_add_records_packs_exactly_as_add_one_by_one(chunks, seed, buffer_size):
    plan = PackedPlan(SPEC, PACKING)
    plan.buffer_size = buffer_size  # the planner's buffer, or none (pack by slots)
    by_column = _Engine(lambda records, i: records.key(i))
    by_record = _Engine(lambda records, i: records.items[i][0])
    column_stage = PackedStage(plan, by_column)
    record_stage = PackedStage(plan, by_record)
    first = 0
    for c, lengths in enumerate(chunks):
        records, leaves = _columns(lengths, seed + c, first_id=first)
        list(column_stage.add_records(records))
        for i, leaf in enumerate(leaves):
            list(record_stage.add(first + i, plan.validate({"w": leaf[0], "x": leaf[1]})))
        first += len(lengths)
    list(column_stage.drain())
    list(record_stage.drain())
    assert by_column.batches == by_record.batches
    placed = sorted(k for _, keys, _, _ in by_column.batches for k in keys)
    assert placed == list(range(first))


@PROPERTY
@hypothesis.given(lengths=lengths_st, carried=st.integers(0, 30))
def test_rows_of_records_held_back_go_in_full_batches_first(lengths, carried):
    # The first ``carried`` records are those a partial batch held back at the last pack:
    # within each row length, their rows come before the others, in the same batches.
    packing = bj.Packing(row_lengths=(4, 8), rows_per_batch=(1, 3), max_segments=3)
    assignment = assign_rows(lengths, packing)
    carried = min(carried, len(lengths))
    batches, batch, within = _batches_of(assignment, packing, carried)
    plain = batch_rows(assignment, packing)
    assert [(n, s, len(m)) for n, s, m in batches] == [(n, s, len(m)) for n, s, m in plain]
    held = np.zeros(len(assignment.row_lengths), bool)
    held[assignment.row[:carried]] = True
    for length in packing.row_lengths:
        rows = np.concatenate([m for n, _, m in batches if n == length] or [[]]).astype(int)
        assert rows.tolist() == sorted(rows.tolist(), key=lambda r: (not held[r], r))
    # Each record is in its row's batch, at its row's place there.
    for i, r in enumerate(assignment.row.tolist()):
        b = batch[i]
        assert batches[b][2][within[i]] == r


@PROPERTY
@hypothesis.given(
    counts=st.lists(st.integers(1, 4), max_size=12),
    picks=st.lists(st.integers(0, 10**6), max_size=20),
)
def test_a_packed_buffer_counts_the_batch_rows_its_records_take(counts, picks):
    """All records (rows non-decreasing, as packed) or any of them in any order."""
    rows = np.repeat(np.arange(len(counts)) * 2, counts)  # with gaps between row numbers
    plan = PackedPlan(SPEC, PACKING)
    buffer = PackedBuffer(plan, 8, np.arange(len(rows)), rows)
    assert plan.row_policy.units(buffer) == len(counts)
    subset = np.asarray([p % len(rows) for p in picks] if len(rows) else [], np.int64)
    assert plan.row_policy.units(buffer, subset) == len(set(rows[subset].tolist()))


def test_item_records_take_and_concat():
    plan = PackedPlan(SPEC, PACKING)
    items = [
        (i, plan.validate({"x": np.ones((n, 2), np.float32), "w": np.int32(i)}))
        for i, n in enumerate([3, 1, 4])
    ]
    records = ItemRecords.concat([ItemRecords(items[:1]), ItemRecords(items[1:])])
    assert records.lengths.tolist() == [3, 1, 4]
    taken = records.take(np.array([2, 0]))
    assert [taken.source(i) for i in range(len(taken))] == [2, 0]
    assert taken.lengths.tolist() == [4, 3]
