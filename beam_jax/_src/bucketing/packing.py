"""Sequence packing, the policy: several short records per fixed-length row (pure numpy).

Packing lays records end to end along their one ragged axis in rows of a fixed length, so a
row holds several records (segments) and little padding. ``assign_rows`` places a buffer's
records in rows from their lengths alone and ``batch_rows`` groups rows into batches; the
packer and the planner share both, so what the planner predicts is what the packer does.

Example:
    >>> a = assign_rows([5, 3, 2], Packing(row_lengths=8, rows_per_batch=2))
    >>> a.row.tolist(), a.offset.tolist(), a.used.tolist()
    ([0, 0, 1], [0, 5, 0], [8, 2])
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from beam_jax._src.errors import SpecError
from beam_jax._src.ragged import ragged_index

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

    Records are placed longest first into rows of the longest row length; each row is then
    cut to the shortest listed row length that holds it, and rows are grouped into batches
    of the listed sizes. The kernel sees only the shapes of :meth:`shapes`. With
    ``pack_lengths`` (length classes), short records fill short rows of their own (cheaper
    per slot where attention's cost grows with the row length).

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


@dataclasses.dataclass(frozen=True)
class _Placed:
    """What a placement gave: per run (records of one length placed together in one row)
    its row, records, first segment and first slot; per row its records and used slots."""

    runs: tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]]
    counts: Sequence[int]
    used: Sequence[int]


def _first_fit(groups, max_segments) -> _Placed:
    """Runs by first fit: each record, longest first, into the first row with room for it.

    Rows in the same state (room, records, used slots) are held as blocks of consecutive
    rows, split only where a length's count runs out inside one, so a length costs a step
    per block with room for it, not per row or record. Blocks are found by room.
    """
    blocks: dict[int, tuple[int, int, int, int]] = {}  # first row -> (rows, room, held, used)
    by_room: dict[int, list[int]] = {}  # room -> the first rows of the blocks with it
    rooms: list[int] = []  # the keys of by_room, sorted
    runs: list[tuple[int, int, int, int, int]] = []  # (first row, rows, take, held, used)
    total_rows = 0

    def put(first: int, n: int, room: int, held: int, used: int) -> None:
        blocks[first] = (n, room if held < max_segments else -1, held, used)
        if held < max_segments:
            firsts = by_room.get(room)
            if firsts is None:
                firsts = by_room[room] = []
                bisect.insort(rooms, room)
            firsts.append(first)

    def take_out(first: int, room: int) -> None:
        firsts = by_room[room]
        firsts.remove(first)
        if not firsts:
            del by_room[room]
            del rooms[bisect.bisect_left(rooms, room)]

    for need, left, capacity in groups:
        k = bisect.bisect_left(rooms, need)
        if k < len(rooms):
            for first in sorted(f for room in rooms[k:] for f in by_room[room]):
                n, room, held, used = blocks[first]
                take = max_segments - held
                if need and room // need < take:
                    take = room // need
                take_out(first, room)
                if take * n <= left:  # every row of the block takes as many
                    runs.append((first, n, take, held, used))
                    put(first, n, room - take * need, held + take, used + take * need)
                    left -= take * n
                    if not left:
                        break
                    continue
                full, rest = divmod(left, take)  # the count runs out in row first + full
                if full:
                    runs.append((first, full, take, held, used))
                    put(first, full, room - take * need, held + take, used + take * need)
                if rest:
                    runs.append((first + full, 1, rest, held, used))
                    put(first + full, 1, room - rest * need, held + rest, used + rest * need)
                after = full + (1 if rest else 0)
                if after < n:
                    put(first + after, n - after, room, held, used)
                left = 0
                break
        if left:  # new rows, each as full as the first, the last with the rest
            per_row = max_segments if need == 0 else min(capacity // need, max_segments)
            k = -(-left // per_row)
            last = left - per_row * (k - 1)
            if k > 1:
                runs.append((total_rows, k - 1, per_row, 0, 0))
                put(total_rows, k - 1, capacity - per_row * need, per_row, per_row * need)
            runs.append((total_rows + k - 1, 1, last, 0, 0))
            put(total_rows + k - 1, 1, capacity - last * need, last, last * need)
            total_rows += k
    if not runs:
        empty = np.zeros(0, np.int64)
        return _Placed((empty, empty, empty, empty), empty, empty)
    # Each run of a block is one run per row of it, in row order.
    run = np.array(runs, np.int64)
    run_row = ragged_index(run[:, 1], run[:, 0])
    columns = (run_row, *(np.repeat(run[:, j], run[:, 1]) for j in (2, 3, 4)))
    state = np.array([(first, *values) for first, values in blocks.items()], np.int64)
    rows = ragged_index(state[:, 1], state[:, 0])
    counts = np.empty(total_rows, np.int64)
    used = np.empty(total_rows, np.int64)
    counts[rows] = np.repeat(state[:, 3], state[:, 1])
    used[rows] = np.repeat(state[:, 4], state[:, 1])
    return _Placed(columns, counts, used)


def _best_fit(groups, max_segments) -> _Placed:
    """Runs by best fit: the open row with the least room that still holds the record.

    That row stays the least roomy one until it is spent, so a group's records are placed
    as one run per row. Open rows are kept by room (a heap of rows per room value, the room
    values in a short sorted list), in plain Python lists: numpy scalar indexing is slower.
    """
    room: list[int] = []  # per row
    counts: list[int] = []
    used: list[int] = []
    runs: tuple[list[int], ...] = ([], [], [], [])  # row, records, first segment, first slot
    by_room: dict[int, list[int]] = {}  # room -> heap of the open rows with that room
    rooms: list[int] = []  # the keys of by_room, sorted
    for need, left, capacity in groups:
        while left:
            k = bisect.bisect_left(rooms, need)
            if k < len(rooms):
                heap = by_room[rooms[k]]
                r = heapq.heappop(heap)
                if not heap:
                    del by_room[rooms.pop(k)]
            else:  # a new row
                r = len(room)
                room.append(capacity)
                counts.append(0)
                used.append(0)
            free = max_segments - counts[r]
            take = min(left, free if need == 0 else min(room[r] // need, free))
            for run, value in zip(runs, (r, take, counts[r], used[r]), strict=True):
                run.append(value)
            room[r] -= take * need
            used[r] += take * need
            counts[r] += take
            left -= take
            if counts[r] < max_segments:
                heap = by_room.get(room[r])
                if heap is None:
                    by_room[room[r]] = [r]
                    bisect.insort(rooms, room[r])
                else:
                    heapq.heappush(heap, r)
    return _Placed(runs, counts, used)


def assign_rows(lengths: Sequence[int] | np.ndarray, packing: Packing) -> Assignment:
    """Places the records of one buffer in rows, from their lengths alone.

    Records are taken longest first (ties in input order), each length class into rows of
    its own length after filling the room left in rows of longer classes; a row's segments
    are laid end to end from slot 0 in placement order.

    Example:
        >>> a = assign_rows([5, 3, 2, 9], Packing(row_lengths=8))
        >>> a.row.tolist(), a.segment.tolist(), a.offset.tolist(), a.refused.tolist()
        ([0, 0, 1, -1], [0, 1, 0, -1], [0, 5, 0, -1], [3])

    Args:
        lengths: each record's length along the packed axis.
        packing: the policy.

    Returns:
        The assignment; records longer than ``packing.max_row_length`` are in ``refused``.

    Raises:
        SpecError: If a length is negative.
    """
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    if len(lengths) and lengths.min() < 0:
        raise SpecError(
            f"record lengths must be >= 0, got {int(lengths.min())} (record "
            f"{int(lengths.argmin())}); pass each record's length along the packed axis."
        )
    n = len(lengths)
    fits = lengths <= packing.max_row_length
    # Longest first; a stable sort keeps equal lengths in input order. Records of one
    # length are placed together, one run per row they land in.
    order = np.argsort(-lengths, kind="stable")
    order = order[fits[order]]
    by_length = lengths[order]
    starts = np.flatnonzero(np.r_[True, by_length[1:] != by_length[:-1]]) if len(order) else []
    bounds = np.r_[starts, len(order)].astype(np.int64)
    # Each record to its class (the shortest class length that holds it). Longest first is
    # also longest class first: a record fills the room left in the rows of longer classes
    # (slots run anyway) before it opens a row of its own class's length.
    classes = np.asarray(packing.pack_lengths, np.int64)
    needs = by_length[bounds[:-1]]
    capacities = classes[np.searchsorted(classes, needs, side="left")]
    groups = zip(needs.tolist(), np.diff(bounds).tolist(), capacities.tolist(), strict=True)
    place = _best_fit if packing.algorithm == "best_fit" else _first_fit
    rows = place(groups, packing.max_segments)
    run_row, run_take, run_segment, run_slot = (np.asarray(x, np.int64) for x in rows.runs)
    # The runs cover the records in placement order (``order``): the k-th record of a run
    # is its row's segment ``first + k``, at slot ``first slot + k * length``.
    within = np.arange(len(order)) - np.repeat(np.cumsum(run_take) - run_take, run_take)
    row = np.full(n, -1, np.int64)
    segment = np.full(n, -1, np.int64)
    offset = np.full(n, -1, np.int64)
    row[order] = np.repeat(run_row, run_take)
    segment[order] = np.repeat(run_segment, run_take) + within
    offset[order] = np.repeat(run_slot, run_take) + within * by_length
    num_rows = len(rows.counts)
    used = np.asarray(rows.used, np.int64)
    counts = np.asarray(rows.counts, np.int64)
    allowed = np.asarray(packing.row_lengths, np.int64)
    cut = allowed[np.searchsorted(allowed, used, side="left")] if num_rows else used
    return Assignment(row, segment, offset, cut, used, counts, np.flatnonzero(~fits))


def batch_rows(
    assignment: Assignment, packing: Packing, first: np.ndarray | None = None
) -> list[tuple[int, int, np.ndarray]]:
    """Groups an assignment's rows into batches: ``(row length, rows, row indices)`` each.

    Rows of each length fill batches of the largest listed size; the remainder goes in the
    smallest size that holds it. With ``first`` (``bool`` per row), the rows it marks come
    first among their length, so they fill the full batches before the remainder does.
    """
    out = []
    for length in packing.row_lengths:
        members = np.flatnonzero(assignment.row_lengths == length)
        if first is not None:
            members = members[np.argsort(~first[members], kind="stable")]
        sizes = packing.sizes_for(length)
        start = 0
        while start < len(members):
            left = len(members) - start
            size = sizes[-1] if left >= sizes[-1] else sizes[bisect.bisect_left(sizes, left)]
            take = min(size, left)
            out.append((int(length), int(size), members[start : start + take]))
            start += take
    return out
