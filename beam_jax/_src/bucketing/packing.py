"""Sequence packing, the policy: several short records per fixed-length row (pure numpy).

Bucketing pads every record to its bucket's boundary; packing instead lays records end to
end along their one ragged axis in rows of a fixed length, so a row holds several records
(segments) and little padding. ``Packing`` is the policy; ``assign_rows`` places one
buffer's records in rows from their lengths alone, and ``batch_rows`` groups the rows into
batches of the listed sizes. Both are shared by the packer (``packed_batch.PackPlan``) and
the planner (``packing_plan``), so what the planner predicts is what the packer does.

Example:
    >>> a = assign_rows([5, 3, 2], Packing(row_lengths=8, rows_per_batch=2))
    >>> a.row.tolist(), a.offset.tolist(), a.used.tolist()
    ([0, 0, 1], [0, 5, 0], [8, 2])
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from beam_jax._src.errors import SpecError

Algorithm = Literal["first_fit_decreasing", "best_fit"]
ALGORITHMS = ("first_fit_decreasing", "best_fit")


def _positive_ints(name: str, value: Any) -> tuple[int, ...]:
    values = (value,) if isinstance(value, int | np.integer) else value
    try:
        out = tuple(values)
    except TypeError:
        out = ()
    ok = bool(out) and all(
        isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 1 for v in out
    )
    if not ok:
        raise SpecError(
            f"{name} must be a positive int or a non-empty sequence of them, got {value!r}."
        )
    if len(set(out)) != len(out):
        raise SpecError(f"{name} must not repeat a value, got {value!r}.")
    return tuple(sorted(int(v) for v in out))


@dataclasses.dataclass(frozen=True)
class Packing:
    """How records are packed into rows, and rows into batches: the packing policy.

    Records are placed longest first into rows of the longest row length (first-fit or
    best-fit); each row is then cut to the shortest listed row length that holds it, and the
    rows of each length are grouped into batches of a listed size (full batches of the
    largest size, the rest in the smallest size that holds it). The kernel sees only
    ``len(row_lengths) x len(rows_per_batch)`` shapes (:meth:`shapes`).

    With ``pack_lengths`` (length classes), a record is packed among the records of its
    class only, into rows of its class's length: the shortest of ``pack_lengths`` that
    holds it. Short records then fill short rows of their own (cheaper per slot where
    attention's cost grows with the row length) and only the longer ones use the long rows.

    Example:
        >>> Packing(row_lengths=(128, 256), rows_per_batch=(8, 32)).shapes()
        [(128, 8), (128, 32), (256, 8), (256, 32)]

    Args:
        row_lengths: the slots per row: one ``int`` or several; the longest bounds a record.
        rows_per_batch: rows in a batch: one ``int``, several, or a mapping from row length
            to its own sizes (as ``plan_packing`` gives).
        max_segments: the most records in one row, the kernel's per-row output count;
            default the longest row length (every record has at least one slot).
        algorithm: ``"first_fit_decreasing"`` (each record, longest first, into the first
            row with room) or ``"best_fit"`` (longest first, into the row it fills most).
        pack_lengths: the length classes: row lengths (among ``row_lengths``, the longest
            included) that records are packed into, each record into rows of the shortest
            that holds it; default the longest row length alone (one class).
    """

    row_lengths: int | tuple[int, ...]
    rows_per_batch: int | tuple[int, ...] | Mapping[int, Sequence[int]] = 32
    max_segments: int | None = None
    algorithm: Algorithm = "first_fit_decreasing"
    pack_lengths: int | tuple[int, ...] | None = None

    def __post_init__(self):
        lengths = _positive_ints("row_lengths", self.row_lengths)
        object.__setattr__(self, "row_lengths", lengths)
        if isinstance(self.rows_per_batch, Mapping):
            unknown = sorted(set(self.rows_per_batch) - set(lengths))
            missing = sorted(set(lengths) - set(self.rows_per_batch))
            if unknown or missing:
                raise SpecError(
                    f"rows_per_batch must give sizes for exactly the row lengths {lengths}, "
                    f"got sizes for {sorted(self.rows_per_batch)}."
                )
            sizes = {
                int(k): _positive_ints(f"rows_per_batch[{k}]", v)
                for k, v in sorted(self.rows_per_batch.items())
            }
        else:
            one = _positive_ints("rows_per_batch", self.rows_per_batch)
            sizes = {k: one for k in lengths}
        object.__setattr__(self, "rows_per_batch", sizes)
        if self.max_segments is None:
            object.__setattr__(self, "max_segments", lengths[-1])
        elif (
            not isinstance(self.max_segments, int | np.integer)
            or isinstance(self.max_segments, bool)
            or self.max_segments < 1
        ):
            raise SpecError(f"max_segments must be a positive int, got {self.max_segments!r}.")
        if self.algorithm not in ALGORITHMS:
            raise SpecError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}.")
        if self.pack_lengths is None:
            classes = (lengths[-1],)
        else:
            classes = _positive_ints("pack_lengths", self.pack_lengths)
            if not set(classes) <= set(lengths) or classes[-1] != lengths[-1]:
                raise SpecError(
                    f"pack_lengths must be among row_lengths {lengths} and include the longest "
                    f"({lengths[-1]}), got {self.pack_lengths!r}; add the missing row lengths."
                )
        object.__setattr__(self, "pack_lengths", classes)

    @property
    def max_row_length(self) -> int:
        """The longest row: the longest record that can be packed."""
        return self.row_lengths[-1]

    def sizes_for(self, row_length: int) -> tuple[int, ...]:
        """The batch sizes (rows) of ``row_length``, smallest first."""
        return self.rows_per_batch[row_length]

    def shapes(self) -> list[tuple[int, int]]:
        """Every ``(row length, rows)`` the kernel can see: the complete compile set."""
        return [(n, s) for n in self.row_lengths for s in self.rows_per_batch[n]]


@dataclasses.dataclass(frozen=True)
class Assignment:
    """Where each record of one buffer goes, from its length alone (see ``assign_rows``).

    Attributes:
        row: per record, its row (-1 for a refused record).
        segment: per record, its segment within the row, from 0 (-1 if refused).
        offset: per record, its first slot in the row (-1 if refused).
        row_lengths: per row, the row length it is cut to.
        used: per row, the slots its records fill.
        counts: per row, how many records it holds.
        refused: indices of records longer than the longest row.
    """

    row: np.ndarray
    segment: np.ndarray
    offset: np.ndarray
    row_lengths: np.ndarray
    used: np.ndarray
    counts: np.ndarray
    refused: np.ndarray


def _first_fit(order, lengths, capacity, max_segments, room=None, counts=None):
    """Rows by first fit: a max-tree over the rows' room finds the first row with room.

    New rows hold ``capacity``; ``room`` and ``counts`` (changed in place) are rows opened
    before, tried first. A tight loop over plain Python lists (numpy scalar indexing costs
    several times more per step); an update stops climbing where a node's maximum is
    unchanged.
    """
    room = [] if room is None else room
    counts = [] if counts is None else counts
    size = 1 << max(1, math.ceil(math.log2(max(len(order) + len(room), 1) + 1)))
    tree = [-1] * (2 * size)  # room per row; -1: no row, or a full one
    if room:  # rows opened before: their room, then the maxima above them
        for r, left in enumerate(room):
            tree[size + r] = left if counts[r] < max_segments else -1
        for node in range(size - 1, 0, -1):
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
    need_of = lengths.tolist()
    rows, segments = {}, {}
    for i in order:
        need = need_of[i]
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
            left, right = tree[2 * node], tree[2 * node + 1]
            top = left if left > right else right
            if tree[node] == top:
                break  # the ancestors' maxima are unchanged too
            tree[node] = top
            node >>= 1
    return rows, segments, counts


def _best_fit(order, lengths, capacity, max_segments, room=None, counts=None):
    """Rows by best fit: the open row with the least room that still holds the record.

    New rows hold ``capacity``; ``room`` and ``counts`` (changed in place) are rows opened
    before.
    """
    room = [] if room is None else room
    counts = [] if counts is None else counts
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
    return rows, segments, counts


def assign_rows(lengths: Sequence[int] | np.ndarray, packing: Packing) -> Assignment:
    """Places the records of one buffer in rows, from their lengths alone.

    Records are taken longest first (ties in input order), each class of
    ``packing.pack_lengths`` into rows of its own length (rows of shorter classes first);
    each row's segments are in placement order and laid end to end from slot 0.

    Example:
        >>> a = assign_rows([5, 3, 2, 9], Packing(row_lengths=8))
        >>> a.row.tolist(), a.segment.tolist(), a.offset.tolist(), a.refused.tolist()
        ([0, 0, 1, -1], [0, 1, 0, -1], [0, 5, 0, -1], [3])

    Args:
        lengths: each record's length along the packed axis.
        packing: the policy.

    Returns:
        The assignment; records longer than ``packing.max_row_length`` are in ``refused``.
    """
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    n = len(lengths)
    capacity = packing.max_row_length
    fits = lengths <= capacity
    # Longest first; a stable sort keeps equal lengths in input order.
    order = np.argsort(-lengths, kind="stable")
    order = order[fits[order]].tolist()
    place = _first_fit if packing.algorithm == "first_fit_decreasing" else _best_fit
    classes = packing.pack_lengths
    if len(classes) == 1:
        rows, segments, counts = place(order, lengths, capacity, packing.max_segments)
    else:
        # Each record to its class (the shortest class length that holds it), longest
        # class first: a record fills the room left in the rows of longer classes (slots
        # run anyway) before it opens a row of its own class's length.
        of = np.searchsorted(np.asarray(classes, np.int64), lengths, side="left").tolist()
        rows, segments, room, counts = {}, {}, [], []
        for c in range(len(classes) - 1, -1, -1):
            members = [i for i in order if of[i] == c]
            if members:
                r, g, _ = place(members, lengths, classes[c], packing.max_segments, room, counts)
                rows.update(r)
                segments.update(g)
    row_of, segment_of, offset_of = [-1] * n, [-1] * n, [-1] * n
    num_rows = len(counts)
    used_by = [0] * num_rows
    need_of = lengths.tolist()
    for i in order:  # in placement order, so offsets follow segment order
        r = rows[i]
        row_of[i], segment_of[i], offset_of[i] = r, segments[i], used_by[r]
        used_by[r] += need_of[i]
    row = np.asarray(row_of, np.int64)
    segment = np.asarray(segment_of, np.int64)
    offset = np.asarray(offset_of, np.int64)
    used = np.asarray(used_by, np.int64)
    allowed = np.asarray(packing.row_lengths, np.int64)
    cut = allowed[np.searchsorted(allowed, used, side="left")] if num_rows else used
    return Assignment(
        row, segment, offset, cut, used, np.asarray(counts, np.int64), np.flatnonzero(~fits)
    )


def batch_rows(assignment: Assignment, packing: Packing) -> list[tuple[int, int, np.ndarray]]:
    """Groups an assignment's rows into batches: ``(row length, rows, row indices)`` each.

    Rows of each length, in order, fill batches of the largest listed size; the remainder
    goes in the smallest listed size that holds it (its empty rows are padding).
    """
    out = []
    for length in packing.row_lengths:
        members = np.flatnonzero(assignment.row_lengths == length)
        sizes = packing.sizes_for(length)
        start = 0
        while start < len(members):
            left = len(members) - start
            size = sizes[-1] if left >= sizes[-1] else sizes[bisect.bisect_left(sizes, left)]
            take = min(size, left)
            out.append((int(length), int(size), members[start : start + take]))
            start += take
    return out
