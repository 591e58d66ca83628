"""Packing in the engine: records of all lengths staged, packed into rows, run as batches.

The element front end hands a ``PackedStage`` its validated records instead of bucket
buffers. Once the staged records fill a few batches (or a ``plan_packing`` buffer), the
stage places them in rows (``assign_rows``, the policy the planner simulates) and groups
the rows into batches (``batch_rows``); each full batch becomes a ``PackedBuffer`` the
``BatchEngine`` runs like any other, and the rest stay staged for the next records. At the
end of a bundle everything staged runs.

A ``PackedBuffer``'s rows (for the engine) are its records, ordered by batch row then
segment; ``padded(rows)`` lays a subset out again in at most the same batch rows
(``PackPlan.lay_out``), so bisection halves a failed batch's records, each half one kernel
call: within ``1 + 2 k ceil(log2 n)`` calls for ``k`` failing records among ``n``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from beam_jax._src.bucketing.packing import assign_rows, batch_rows
from beam_jax._src.core.dead_letter import VALIDATION
from beam_jax._src.core.packed_plan import PackedPlan, PackedRows
from beam_jax._src.core.validation import Validated
from beam_jax._src.engine.batching import RowBuffer
from beam_jax._src.errors import ElementTooLargeError


class PackedBuffer:
    """One packed batch's records for the engine: ``items`` (``(tag, Validated)`` pairs,
    ordered by batch row then segment) and each record's batch row.

    Args:
        plan: the worker's ``PackedPlan``.
        row_length: the batch's row length (its ``bucket`` is ``(row_length,)``).
        items: the records.
        rows: per record, its batch row (non-decreasing).
        slot: the engine's slot (``None``: packed batches may mix windows).
    """

    def __init__(self, plan: PackedPlan, row_length: int, items: list, rows: Any, slot: Any = None):
        self.bucket = (row_length,)
        self.slot = slot
        self.items = items
        self._rows = np.asarray(rows, np.int64)
        self._plan = plan

    @property
    def size(self) -> int:
        return len(self.items)

    def units(self, rows: np.ndarray | None = None) -> int:
        """Batch rows the records ``rows`` (all by default) take."""
        chosen = self._rows if rows is None else self._rows[rows]
        return len(np.unique(chosen))

    def take(self, rows: np.ndarray, limit: int) -> int:
        """How many leading ``rows`` (records) fit in a batch of ``limit`` batch rows."""
        chosen = self._rows[rows]
        new = np.ones(len(chosen), bool)
        new[1:] = chosen[1:] != chosen[:-1]
        # Records are ordered by row, so a row's records are adjacent: cut after `limit` rows.
        return max(1, int(np.searchsorted(np.cumsum(new), limit, side="right")))

    def padded(self, rows: np.ndarray | None = None) -> PackedRows:
        """All records, or ``rows`` of them, laid out as one packed batch."""
        if rows is None:
            items = [item for _, item in self.items]
            return self._plan.lay_out(items, self._rows, self.bucket[0])
        items = [self.items[r][1] for r in rows.tolist()]
        return self._plan.lay_out(items, self._rows[rows], self.bucket[0])


class PackedStage:
    """The packing policy of an ``ElementFrontEnd``: stage records, run full packed batches.

    Args:
        plan: the worker's ``PackedPlan``.
        engine: the front end's ``BatchEngine``.
        per_window: batches keep slots (windows) apart: one stage per slot.
    """

    def __init__(self, plan: PackedPlan, engine: Any, per_window: bool = False):
        self._plan = plan
        self._engine = engine
        self._per_window = per_window
        # Per slot: the staged ``(tag, Validated)`` pairs and their lengths.
        self._items: dict[Any, list[tuple[Any, Validated]]] = {}
        self._lengths: dict[Any, list[int]] = {}
        # Slots and records staged since the last pack, per slot: what was left over then
        # (at most one partial batch per row length) does not trigger the next pack.
        self._fresh: dict[Any, list[int]] = {}
        packing = plan.packing
        # Pack once the staged records fill the planner's buffer (what its prediction
        # packed together) or, without one, two batches of the largest shape: enough for
        # the rows to fill well, few repacks of the rest.
        self._min_slots = 2 * max(n * s for (n,), s in plan.shapes())
        self._min_records = plan.buffer_size or 0
        self._full = {n: packing.sizes_for(n)[-1] for n in packing.row_lengths}

    def add(self, tag: Any, item: Validated, slot: Any = None) -> Iterator[Any]:
        """Stage one validated record; pack and run the full batches once enough wait."""
        slot = slot if self._per_window else None
        items = self._items.get(slot)
        if items is None:
            items = self._items[slot] = []
            self._lengths[slot] = []
            self._fresh[slot] = [0, 0]
        length = item.lengths[0]
        items.append((tag, item))
        self._lengths[slot].append(length)
        fresh = self._fresh[slot]
        fresh[0] += length
        fresh[1] += 1
        # A planner's buffer is what its prediction packed together: keep to it; without
        # one, pack once the staged records fill two batches of the largest shape.
        full = fresh[1] >= self._min_records if self._min_records else fresh[0] >= self._min_slots
        if full:
            yield from self._pack(slot, final=False)

    def drain(self) -> Iterator[Any]:
        """Pack and run everything staged (the end of a bundle)."""
        for slot in list(self._items):
            yield from self._pack(slot, final=True)

    def run_now(self, bucket: Any, slot: Any, items: list) -> Iterator[Any]:
        """Pack ``(tag, Validated)`` pairs and run every batch they fill (a cross-bundle
        flush; the bucket is the plan's one packed key)."""
        for tag, item in items:
            yield from self.add(tag, item, slot)
        yield from self.drain()

    def _pack(self, slot: Any, final: bool) -> Iterator[Any]:
        items = self._items.pop(slot)
        lengths = np.asarray(self._lengths.pop(slot), np.int64)
        self._fresh.pop(slot, None)
        assignment = assign_rows(lengths, self._plan.packing)
        if len(assignment.refused):  # validation refuses these first; kept for safety
            top = self._plan.packing.max_row_length
            for i in assignment.refused:
                error = ElementTooLargeError(
                    f"record of length {int(lengths[i])} is longer than the longest row ({top})."
                )
                yield from self._engine.reject(error, VALIDATION, [items[int(i)][0]])
        keep: list[np.ndarray] = []
        for length, _, members in batch_rows(assignment, self._plan.packing):
            where = np.full(len(assignment.row_lengths), -1, np.int64)
            where[members] = np.arange(len(members))
            batch_row = np.where(assignment.row >= 0, where[np.maximum(assignment.row, 0)], -1)
            records = np.flatnonzero(batch_row >= 0)
            if not final and len(members) < self._full[length]:
                keep.append(records)  # a partial batch waits for more records
                continue
            order = records[np.lexsort((assignment.segment[records], batch_row[records]))]
            buffer = PackedBuffer(
                self._plan, length, [items[i] for i in order.tolist()], batch_row[order], slot
            )
            yield from self._engine.launch(buffer)
        if keep:
            left = np.sort(np.concatenate(keep))
            self._items[slot] = [items[i] for i in left.tolist()]
            self._lengths[slot] = lengths[left].tolist()
            self._fresh[slot] = [0, 0]


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

    def drain(self) -> Iterator[Any]:
        return iter(())

    def run_now(self, bucket: Any, slot: Any, items: list) -> Iterator[Any]:
        """Run ``(tag, Validated)`` pairs of ``bucket`` now, as one batch (a cross-bundle
        flush; the engine runs it in chunks if it exceeds the bucket's limit)."""
        buffer = RowBuffer(self._plan, bucket, slot)
        buffer.items.extend(items)
        if buffer.size:
            yield from self._engine.launch(buffer)
