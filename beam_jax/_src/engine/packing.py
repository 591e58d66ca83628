"""Packing in the engine: records of all lengths staged, packed into rows, run as batches.

A ``PackedStage`` stages validated records; once they fill a few batches (or a
``plan_packing`` buffer) it places them in rows (``assign_rows``, as the planner simulates)
and groups the rows into batches (``batch_rows``). Each full batch becomes a
``PackedBuffer`` the ``BatchEngine`` runs like any other; the rest stay staged, and the
next pack puts their rows in its full batches first. At the end of a bundle all staged runs.
``padded(rows)`` lays a subset out again in at most the same batch rows, so bisection halves
a failed batch's records within the engine's bound.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from beam_jax._src.bucketing.packing import assign_rows, batch_rows
from beam_jax._src.core.dead_letter import VALIDATION
from beam_jax._src.core.messages import too_long_to_pack
from beam_jax._src.core.packed_batch import PackedBatch
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.core.validation import Validated
from beam_jax._src.engine.batching import RowBuffer


class ItemRecords:
    """Staged records as ``(tag, Validated)`` pairs (the element front end's records).

    They answer what columnar records (the Arrow front end's ``ColumnRecords``) do: how
    many, their lengths, ``take``, ``concat``, a record's ``source``, and ``lay_out``.
    """

    def __init__(self, items: list[tuple[Any, Validated]], lengths: Any = None):
        self.items = items
        if lengths is None:
            lengths = [item.lengths[0] for _, item in items]
        self.lengths = np.asarray(lengths, np.int64).reshape(-1)

    def __len__(self) -> int:
        return len(self.items)

    def take(self, index: np.ndarray) -> ItemRecords:
        return ItemRecords([self.items[i] for i in index.tolist()], self.lengths[index])

    @staticmethod
    def concat(parts: list[ItemRecords]) -> ItemRecords:
        if len(parts) == 1:
            return parts[0]
        items = [item for part in parts for item in part.items]
        return ItemRecords(items, np.concatenate([part.lengths for part in parts]))

    def source(self, i: int) -> Any:
        """Record ``i``'s tag (what the front end describes it by)."""
        return self.items[i][0]

    def lay_out(self, plan: PackedPlan, index: np.ndarray | None, rows, row_length: int):
        chosen = self.items if index is None else [self.items[i] for i in index.tolist()]
        return plan.lay_out([item for _, item in chosen], rows, row_length)


class PackedBuffer:
    """One packed batch's records for the engine, in its batch rows.

    Args:
        plan: the worker's ``PackedPlan``.
        row_length: the batch's row length (its ``bucket`` is ``(row_length,)``).
        records: the records, ordered by batch row then segment: ``ItemRecords``, or a
            front end's columnar records.
        rows: per record, its batch row (non-decreasing): ``row_of``, which the plan's
            ``SharedRows`` counts batch rows by.
        slot: the engine's slot (``None``: packed batches may mix windows).
    """

    def __init__(
        self, plan: PackedPlan, row_length: int, records: Any, rows: Any, slot: Any = None
    ):
        if isinstance(records, list):
            records = ItemRecords(records)
        self.bucket = (row_length,)
        self.slot = slot
        self.records = records
        self.row_of = np.asarray(rows, np.int64)
        self._plan = plan

    @property
    def items(self) -> list:
        """The ``(tag, Validated)`` pairs of ``ItemRecords``."""
        return self.records.items

    @property
    def size(self) -> int:
        return len(self.records)

    def source(self, i: int) -> Any:
        """Record ``i``'s dead-letter source."""
        return self.records.source(i)

    def id_array(self, rows: np.ndarray) -> Any:
        """The ids of records ``rows`` (columnar records with an id column)."""
        return self.records.id_array(rows)

    def padded(self, rows: np.ndarray | None = None) -> PackedBatch:
        """All records, or ``rows`` of them, laid out as one packed batch."""
        if rows is None:
            return self.records.lay_out(self._plan, None, self.row_of, self.bucket[0])
        return self.records.lay_out(self._plan, rows, self.row_of[rows], self.bucket[0])


def _batches_of(
    assignment: Any, packing: Any, carried: int = 0
) -> tuple[list, np.ndarray, np.ndarray]:
    """The batches of an assignment and, per record, its batch (-1: refused) and its row in
    that batch; ``batch_rows``' batches, found for all records at once. The rows holding
    one of the first ``carried`` records (those a partial batch held back before) go in
    full batches first."""
    num_rows = len(assignment.row_lengths)
    first = None
    if carried:
        first = np.zeros(num_rows, bool)
        rows = assignment.row[:carried]
        first[rows[rows >= 0]] = True
    batches = batch_rows(assignment, packing, first)
    batch_of_row = np.full(num_rows, -1, np.int64)
    row_in_batch = np.full(num_rows, -1, np.int64)
    for b, (_, _, members) in enumerate(batches):
        batch_of_row[members] = b
        row_in_batch[members] = np.arange(len(members))
    placed = assignment.row >= 0
    row = np.maximum(assignment.row, 0)
    batch = np.where(placed, batch_of_row[row] if num_rows else -1, -1)
    within = np.where(placed, row_in_batch[row] if num_rows else -1, -1)
    return batches, batch, within


class PackedStage:
    """The packing policy of a front end: stage records, run full packed batches.

    Records come one at a time (``add``: a ``Validated`` with its tag) or many at once
    (``add_records``: a front end's columnar records, e.g. a whole Arrow record batch).

    Args:
        plan: the worker's ``PackedPlan``.
        engine: the front end's ``BatchEngine``.
        per_window: batches keep slots (windows) apart: one stage per slot.
    """

    def __init__(self, plan: PackedPlan, engine: Any, per_window: bool = False):
        self._plan = plan
        self._engine = engine
        self._per_window = per_window
        # Per slot: the staged record sets (records added one at a time go to a trailing
        # list of ``(tag, Validated)`` pairs).
        self._staged: dict[Any, list[Any]] = {}
        # Per slot, ``[slots, records]`` staged since the last pack: what was left over then
        # does not trigger the next pack.
        self._fresh: dict[Any, list[int]] = {}
        # Per slot: how many of the first staged records a partial batch held back at the
        # last pack; the next pack puts their rows in full batches first.
        self._carried: dict[Any, int] = {}
        packing = plan.packing
        # Pack once the staged records fill the planner's buffer (what its prediction
        # packed together) or, without one, two batches of the largest shape.
        self._min_slots = 2 * max(n * s for (n,), s in plan.shapes())
        self._min_records = plan.buffer_size or 0
        self._full = {n: packing.sizes_for(n)[-1] for n in packing.row_lengths}

    def _slot(self, slot: Any) -> tuple[Any, list[Any], list[int]]:
        slot = slot if self._per_window else None
        staged = self._staged.get(slot)
        if staged is None:
            staged = self._staged[slot] = []
            self._fresh[slot] = [0, 0]
        return slot, staged, self._fresh[slot]

    def add(self, tag: Any, item: Validated, slot: Any = None) -> Iterator[Any]:
        """Stage one validated record; pack and run the full batches once enough wait."""
        slot, staged, fresh = self._slot(slot)
        if not staged or not isinstance(staged[-1], list):
            staged.append([])
        staged[-1].append((tag, item))
        fresh[0] += item.lengths[0]
        fresh[1] += 1
        if self._is_full(fresh):
            yield from self._pack(slot, final=False)

    def add_many(self, items: Sequence[tuple[Any, Validated]], slot: Any = None) -> Iterator[Any]:
        """``add`` of each ``(tag, Validated)`` pair, in order."""
        for tag, item in items:
            yield from self.add(tag, item, slot)

    def add_records(self, records: Any, slot: Any = None) -> Iterator[Any]:
        """Stage many records at once (``ItemRecords`` or a front end's columnar records);
        pack and run the full batches whenever enough wait, exactly where ``add`` record
        by record would."""
        lengths = records.lengths
        done = 0
        while done < len(lengths):
            slot_, staged, fresh = self._slot(slot)
            rest = lengths[done:]
            if self._min_records:
                need = max(1, self._min_records - fresh[1])
            else:  # the first record at which the staged slots reach the threshold
                need = int(np.searchsorted(np.cumsum(rest), self._min_slots - fresh[0])) + 1
            take = min(need, len(rest))
            part = records if take == len(lengths) else records.take(np.arange(done, done + take))
            staged.append(part)
            fresh[0] += int(rest[:take].sum())
            fresh[1] += take
            done += take
            if self._is_full(fresh):
                yield from self._pack(slot_, final=False)

    def _is_full(self, fresh: list[int]) -> bool:
        if self._min_records:
            return fresh[1] >= self._min_records
        return fresh[0] >= self._min_slots

    def drain(self) -> Iterator[Any]:
        """Pack and run everything staged (the end of a bundle)."""
        for slot in list(self._staged):
            yield from self._pack(slot, final=True)

    def run_now(self, bucket: Any, slot: Any, items: list) -> Iterator[Any]:
        """Pack ``(tag, Validated)`` pairs and run every batch they fill (a cross-bundle
        flush; the bucket is the plan's one packed key)."""
        yield from self.add_many(items, slot)
        yield from self.drain()

    def _pack(self, slot: Any, final: bool) -> Iterator[Any]:
        parts = [ItemRecords(p) if isinstance(p, list) else p for p in self._staged.pop(slot)]
        self._fresh.pop(slot, None)
        carried = self._carried.pop(slot, 0)
        if not parts:
            return
        records = type(parts[0]).concat(parts)
        lengths = records.lengths
        assignment = assign_rows(lengths, self._plan.packing)
        if len(assignment.refused):  # validation refuses these first; kept for safety
            top = self._plan.packing.max_row_length
            for i in assignment.refused:
                error = too_long_to_pack(self._plan.axis, int(lengths[i]), "a staged record", top)
                yield from self._engine.reject(error, VALIDATION, [records.source(int(i))])
        batches, batch, within = _batches_of(assignment, self._plan.packing, carried)
        # Every placed record, ordered by batch, then row in it, then segment.
        placed = np.flatnonzero(batch >= 0)
        placed = placed[np.lexsort((assignment.segment[placed], within[placed], batch[placed]))]
        ends = np.searchsorted(batch[placed], np.arange(len(batches)), side="right")
        keep: list[np.ndarray] = []
        begin = 0
        for b, (length, _, members) in enumerate(batches):
            order = placed[begin : ends[b]]
            begin = ends[b]
            if not final and len(members) < self._full[length]:
                keep.append(order)  # a partial batch waits for more records
                continue
            buffer = PackedBuffer(self._plan, length, records.take(order), within[order], slot)
            yield from self._engine.launch(buffer)
        if keep:
            left = np.sort(np.concatenate(keep))
            self._staged[slot] = [records.take(left)]
            self._fresh[slot] = [0, 0]
            self._carried[slot] = len(left)


class BucketStage:
    """The bucketing policy of an ``ElementFrontEnd``: each record to its bucket's buffer,
    a full buffer runs at once.

    Args:
        plan: the worker's ``Plan``.
        engine: the front end's ``BatchEngine``.
        per_window: buffers keep windows (slots) apart.
    """

    def __init__(self, plan: Any, engine: Any, per_window: bool):
        self._plan = plan
        self._engine = engine
        self._per_window = per_window

    def add(self, tag: Any, item: Validated, slot: Any = None) -> Iterator[Any]:
        bucket = self._plan.bucket_for(item.lengths)
        buffer = self._engine.buffer(bucket, slot if self._per_window else None)
        buffer.items.append((tag, item))
        yield from self._engine.added(buffer)

    def add_many(self, items: Sequence[tuple[Any, Validated]], slot: Any = None) -> Iterator[Any]:
        """``add`` of each ``(tag, Validated)`` pair, a buffer's room at a time: each bucket's
        pairs in their order, the buckets in the order they first appear."""
        slot = slot if self._per_window else None
        groups: dict[Any, list[tuple[Any, Validated]]] = {}
        bucket_for = self._plan.bucket_for
        for pair in items:
            groups.setdefault(bucket_for(pair[1].lengths), []).append(pair)
        for bucket, group in groups.items():

            def put(buffer, start, stop, group=group):
                buffer.items.extend(group[start:stop])

            yield from self._engine.fill(bucket, slot, len(group), put)

    def drain(self) -> Iterator[Any]:
        return iter(())

    def run_now(self, bucket: Any, slot: Any, items: list) -> Iterator[Any]:
        """Run ``(tag, Validated)`` pairs of ``bucket`` now, as one batch (a cross-bundle
        flush; the engine runs it in chunks if it exceeds the bucket's limit)."""
        buffer = RowBuffer(self._plan, bucket, slot)
        buffer.items.extend(items)
        if buffer.size:
            yield from self._engine.launch(buffer)
