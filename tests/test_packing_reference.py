"""``assign_rows`` against a record-at-a-time reference: the same rows, segments, slots.

The library places the records of one length as runs (one per row they land in); the
reference below places them one at a time (first fit over a max-tree of the rows' room, best
fit over a sorted list of open rows), as ``assign_rows`` did before it placed runs. Both
must agree on every record and row, for every algorithm and option.
"""

from __future__ import annotations

import bisect
import math

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

import beam_jax as bj
from beam_jax._src.bucketing.packing import assign_rows


def _first_fit(order, lengths, capacity, max_segments, room, counts):
    size = 1 << max(1, math.ceil(math.log2(max(len(order) + len(room), 1) + 1)))
    tree = [-1] * (2 * size)
    for r, left in enumerate(room):
        tree[size + r] = left if counts[r] < max_segments else -1
    for node in range(size - 1, 0, -1):
        tree[node] = max(tree[2 * node], tree[2 * node + 1])
    rows, segments = {}, {}
    for i in order:
        need = int(lengths[i])
        if tree[1] >= need:
            node = 1
            while node < size:
                node <<= 1
                if tree[node] < need:
                    node += 1
            r = node - size
        else:
            r = len(room)
            room.append(capacity)
            counts.append(0)
        rows[i], segments[i] = r, counts[r]
        room[r] -= need
        counts[r] += 1
        node = r + size
        tree[node] = room[r] if counts[r] < max_segments else -1
        node >>= 1
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node >>= 1
    return rows, segments


def _best_fit(order, lengths, capacity, max_segments, room, counts):
    open_rows = sorted((left, r) for r, left in enumerate(room) if counts[r] < max_segments)
    rows, segments = {}, {}
    for i in order:
        need = int(lengths[i])
        k = bisect.bisect_left(open_rows, (need, -1))
        if k < len(open_rows):
            r = open_rows.pop(k)[1]
        else:
            r = len(room)
            room.append(capacity)
            counts.append(0)
        rows[i], segments[i] = r, counts[r]
        room[r] -= need
        counts[r] += 1
        if counts[r] < max_segments:
            bisect.insort(open_rows, (room[r], r))
    return rows, segments


def _reference(lengths, packing):
    """Record by record: longest first (ties in input order), longest class first."""
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    n = len(lengths)
    fits = lengths <= packing.max_row_length
    order = [i for i in np.argsort(-lengths, kind="stable").tolist() if fits[i]]
    place = _first_fit if packing.algorithm == "first_fit_decreasing" else _best_fit
    classes = packing.pack_lengths
    of = np.searchsorted(np.asarray(classes), lengths, side="left").tolist()
    rows, segments, room, counts = {}, {}, [], []
    for c in range(len(classes) - 1, -1, -1):
        members = [i for i in order if of[i] == c]
        r, g = place(members, lengths, classes[c], packing.max_segments, room, counts)
        rows.update(r)
        segments.update(g)
    row, segment, offset = [-1] * n, [-1] * n, [-1] * n
    used = [0] * len(counts)
    for i in order:
        row[i], segment[i], offset[i] = rows[i], segments[i], used[rows[i]]
        used[rows[i]] += int(lengths[i])
    allowed = list(packing.row_lengths)
    cut = [allowed[bisect.bisect_left(allowed, u)] for u in used]
    return {
        "row": row,
        "segment": segment,
        "offset": offset,
        "row_lengths": cut,
        "used": used,
        "counts": counts,
        "refused": np.flatnonzero(~fits).tolist(),
    }


@st.composite
def _cases(draw):
    row_lengths = sorted(draw(st.sets(st.integers(1, 48), min_size=1, max_size=4)))
    extra = draw(st.sets(st.sampled_from(row_lengths)))
    packing = bj.Packing(
        row_lengths=tuple(row_lengths),
        max_segments=draw(st.none() | st.integers(1, 8)),
        algorithm=draw(st.sampled_from(["first_fit_decreasing", "best_fit"])),
        pack_lengths=tuple(sorted(extra | {row_lengths[-1]})),
    )
    # Few distinct lengths in some cases (long runs of equal lengths), many in others.
    top = draw(st.sampled_from([3, 12, 60]))
    lengths = draw(st.lists(st.integers(0, top), max_size=150))
    return lengths, packing


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(case=_cases())
def test_assign_rows_matches_placing_records_one_at_a_time(case):
    lengths, packing = case
    got = assign_rows(lengths, packing)
    want = _reference(lengths, packing)
    for name, values in want.items():
        assert getattr(got, name).tolist() == values, name
        assert getattr(got, name).dtype == np.int64, name


@pytest.mark.parametrize("algorithm", ["first_fit_decreasing", "best_fit"])
def test_assign_rows_matches_the_reference_on_a_large_buffer(algorithm):
    rng = np.random.default_rng(7)
    lengths = np.minimum(rng.lognormal(3.3, 0.8, 20_000).astype(np.int64) + 1, 300)
    packing = bj.Packing(
        row_lengths=(64, 128, 256), pack_lengths=(64, 256), max_segments=12, algorithm=algorithm
    )
    got = assign_rows(lengths, packing)
    for name, values in _reference(lengths, packing).items():
        assert getattr(got, name).tolist() == values, name


def test_assign_rows_refuses_a_negative_length():
    with pytest.raises(bj.SpecError, match=r"must be >= 0, got -2 \(record 1\)"):
        assign_rows([3, -2], bj.Packing(row_lengths=8))
