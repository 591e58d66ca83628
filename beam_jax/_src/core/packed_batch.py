"""Packed batches: records laid end to end in rows, with segment ids, and unpacking (pure numpy).

Bucketing pads every record to its bucket's boundary; packing instead lays records end to
end along their one ragged axis in rows of a fixed length, so a row holds several records
(segments) and little padding. The kernel receives each packed row with the segment id of
every slot (0 on empty slots, 1..S within a row), the position of every slot within its own
segment, and the number of segments in the row, and returns one output per segment,
``[rows, max_segments, ...]``; :meth:`Packer.unpack` turns those back into one result
per record, in input order.

A record longer than the longest row is refused on its own (a dead letter, never a whole
batch). A spec with no ragged axis, or with several, is refused at construction.

Leaves without the ragged axis (a per-record scalar, a fixed-size feature) are carried per
segment: the kernel sees them with a leading ``max_segments`` axis, row by row, empty
segments holding the leaf's pad value. A leaf with the ragged axis twice (a pairwise
``("L", "L")`` matrix) cannot be laid end to end and is refused.

Example:
    >>> import numpy as np
    >>> from beam_jax import ArraySpec, Packing
    >>> packer = Packer(ArraySpec(("L",), np.int32), Packing(row_lengths=8, rows_per_batch=2))
    >>> result = packer.pack([np.arange(5), np.arange(3), np.arange(2)])
    >>> [b.segment_ids.tolist() for b in result.batches]
    [[[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 0, 0, 0, 0, 0, 0]]]
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from beam_jax._src.bucketing.packing import Assignment, Packing, assign_rows, batch_rows
from beam_jax._src.core.messages import too_long_to_pack
from beam_jax._src.core.spec import as_layout
from beam_jax._src.errors import InvalidElementError, KernelError, SpecError


class SegmentInfo(NamedTuple):
    """What a packed kernel receives beside each row: where every record is.

    Attributes:
        ids: ``int32[..., row_length]``: the segment of each slot, 1..S; 0 on empty slots.
        positions: ``int32[..., row_length]``: each slot's position within its segment.
        counts: ``int32[...]``: how many segments each row holds.
        lengths: ``int32[..., max_segments]``: each segment's length (0 past ``counts``); its
            last axis gives a kernel its static number of outputs per row.
    """

    ids: Any
    positions: Any
    counts: Any
    lengths: Any


@dataclasses.dataclass(frozen=True, eq=False)
class PackedBatch:
    """One batch of packed rows, as the kernel runs it: packing's ``PaddedBatch``.

    Its ``bucket``, ``leaves``, ``lengths``, ``num_real``, ``size`` and volumes are what the
    engine asks of any batch; the rest says where each of its records sits.

    Attributes:
        row_length: slots per row.
        size: rows in the batch (the compiled batch dimension), empty rows included.
        max_segments: the kernel's outputs per row.
        element_leaves: the packed element's leaves: ragged ones ``[size, ...row_length...]``,
            others carried per segment ``[size, max_segments, ...]``.
        segments: segment ids, positions and counts of the batch (``SegmentInfo``).
        indices: the records in this batch, as indices into the packed buffer, ascending.
        rows: per record of ``indices``, its row in the batch.
        segment: per record of ``indices``, its segment in the row, from 0.
        offsets: per record of ``indices``, its first slot in the row.
        record_lengths: per record of ``indices``, its length.
        num_rows: rows that hold at least one record (the leading ones; the others are empty).
    """

    row_length: int
    size: int
    max_segments: int
    element_leaves: tuple[np.ndarray, ...]
    segments: SegmentInfo
    indices: np.ndarray
    rows: np.ndarray
    segment: np.ndarray
    offsets: np.ndarray
    record_lengths: np.ndarray
    num_rows: int

    @property
    def bucket(self) -> tuple[int]:
        return (self.row_length,)

    @property
    def leaves(self) -> tuple[np.ndarray, ...]:
        """The kernel's flat leaves: the packed element's, then ``SegmentInfo``'s."""
        return (*self.element_leaves, *self.segments)

    @property
    def lengths(self) -> dict[str, np.ndarray]:
        """No per-axis lengths: the segments say where each record is."""
        return {}

    @property
    def num_real(self) -> int:
        """Rows holding a record (the kernel's ``valid`` rows)."""
        return self.num_rows

    @property
    def num_records(self) -> int:
        return len(self.indices)

    def lengths_matrix(self, names: Sequence[str]) -> np.ndarray:
        """``int[records, 1]``: each record's length along the packed axis."""
        return self.record_lengths.reshape(-1, 1)

    @property
    def segment_ids(self) -> np.ndarray:
        return self.segments.ids

    @property
    def positions(self) -> np.ndarray:
        return self.segments.positions

    @property
    def segment_counts(self) -> np.ndarray:
        return self.segments.counts

    @property
    def padded_volume(self) -> int:
        """Slots the kernel runs over: rows times row length, empty rows included."""
        return self.size * self.row_length

    @property
    def real_volume(self) -> int:
        """Slots holding a record."""
        return int(self.record_lengths.sum())

    @property
    def empty_slots(self) -> int:
        """Padding: slots holding no record, those of empty rows included."""
        return self.padded_volume - self.real_volume

    @property
    def empty_rows(self) -> int:
        """Rows holding no record (padding of the batch dimension)."""
        return self.size - self.num_rows


@dataclasses.dataclass(frozen=True, eq=False)
class Refusal:
    """A record that was not packed, and why (its dead letter, stage ``validation``)."""

    index: int
    error: Exception


@dataclasses.dataclass(frozen=True, eq=False)
class PackResult:
    """The batches of one packed buffer, and the records refused.

    Attributes:
        batches: the packed batches.
        refused: one ``Refusal`` per record that could not be packed, by index.
        num_records: how many records were given.
    """

    batches: tuple[PackedBatch, ...]
    refused: tuple[Refusal, ...]
    num_records: int

    @property
    def padded_volume(self) -> int:
        return sum(b.padded_volume for b in self.batches)

    @property
    def real_volume(self) -> int:
        return sum(b.real_volume for b in self.batches)

    @property
    def empty_rows(self) -> int:
        return sum(b.empty_rows for b in self.batches)


def segment_outputs(outputs: Any, batch: PackedBatch) -> Any:
    """A packed kernel's outputs for ``batch`` (one per segment, every leaf
    ``[size, max_segments, ...]``) gathered per record of ``batch``: ``[records, ...]``.

    Raises:
        KernelError: an output leaf does not start with ``[size, max_segments]``.
    """
    expected = (batch.size, batch.max_segments)
    for leaf in jax.tree_util.tree_leaves(outputs):
        if tuple(np.shape(leaf)[:2]) != expected:
            raise KernelError(
                f"a packed kernel returns one output per segment: every leaf needs "
                f"[rows, max_segments, ...] = [{expected[0]}, {expected[1]}, ...] per batch "
                f"(per row [max_segments, ...]), got a leaf of shape {np.shape(leaf)}; index "
                "per-segment results by segment id - 1."
            )
    # One index into [rows * max_segments, ...]: np.take copies whole slots, faster
    # than indexing two axes (0.37 against 0.70 ms per 512-row batch of 8 x 384 floats).
    slots = batch.rows * batch.max_segments + batch.segment
    return jax.tree_util.tree_map(
        lambda leaf: np.take(np.asarray(leaf).reshape(-1, *np.shape(leaf)[2:]), slots, axis=0),
        outputs,
    )


class Packer:
    """Packs records of one element spec into rows, and cuts each record's output back out.

    The spec must have exactly one ragged axis name, which becomes the packed axis.

    Example:
        >>> import numpy as np
        >>> from beam_jax import ArraySpec, Packing
        >>> packer = Packer(ArraySpec(("L",), np.float32), Packing(row_lengths=8, max_segments=2))
        >>> result = packer.pack([np.full(3, 2.0), np.full(4, 1.0), np.full(6, 5.0)])
        >>> def segment_sums(x, ids):  # the kernel: [rows, max_segments]
        ...     return np.stack([np.bincount(i, w, minlength=3)[1:] for w, i in zip(x, ids)])
        >>> outputs = [segment_sums(b.leaves[0], b.segment_ids) for b in result.batches]
        >>> sums = [float(v) for v in packer.unpack(result, outputs)]
        >>> sums
        [6.0, 4.0, 30.0]

    Args:
        spec: the element spec (an ``ArraySpec`` or a pytree of them).
        packing: the policy.

    Raises:
        SpecError: the spec has no ragged axis or several, or a leaf repeats the axis.
    """

    def __init__(self, spec: Any, packing: Packing):
        self.layout = as_layout(spec)
        self.packing = packing
        names = self.layout.axis_names
        if len(names) != 1:
            why = (
                "no ragged axis, so there is nothing to pack; use Bucketing (one shape)"
                if not names
                else f"several ragged axes {list(names)}; a row packs records along one axis, "
                "so pack only specs whose leaves share one ragged axis name, or use Bucketing"
            )
            raise SpecError(f"Packing needs a spec with exactly one ragged axis, got {why}.")
        self.axis = names[0]
        self.ragged_axis: list[int | None] = []
        for name, spec_leaf in zip(self.layout.names, self.layout.specs, strict=True):
            axes = [a for a, _ in spec_leaf.ragged_axes]
            if len(axes) > 1:
                raise SpecError(
                    f"leaf {name} has the ragged axis {self.axis!r} {len(axes)} times (shape "
                    f"{spec_leaf.shape}); packing lays records end to end along one axis, so "
                    "a leaf may hold it once. Compute pairwise values inside the kernel."
                )
            self.ragged_axis.append(axes[0] if axes else None)

    def shapes(self) -> list[tuple[int, int]]:
        """Every ``(row length, rows)`` the kernel can see (``Packing.shapes``)."""
        return self.packing.shapes()

    def leaf_shapes(self, row_length: int, rows: int) -> list[tuple[tuple[int, ...], Any]]:
        """The packed shape and dtype of every leaf for one batch shape."""
        out = []
        for spec, axis in zip(self.layout.specs, self.ragged_axis, strict=True):
            inner = spec.resolve({self.axis: row_length})
            shape = (
                (rows, *inner) if axis is not None else (rows, self.packing.max_segments, *inner)
            )
            out.append((shape, spec.dtype))
        return out

    def lengths_of(self, leaves: Sequence[np.ndarray]) -> int:
        """One record's length along the packed axis, checked across its leaves.

        Raises:
            InvalidElementError: a leaf's rank or fixed sizes differ from the spec, or two
                leaves disagree on the length.
        """
        length = None
        for name, spec, axis, leaf in zip(
            self.layout.names, self.layout.specs, self.ragged_axis, leaves, strict=True
        ):
            shape = np.shape(leaf)
            fixed_ok = len(shape) == len(spec.shape) and all(
                isinstance(d, str) or d == s for d, s in zip(spec.shape, shape, strict=True)
            )
            if not fixed_ok:
                raise InvalidElementError(
                    f"leaf {name} has shape {shape}, expected {spec.shape} (named axes any "
                    "length); fix the record or the spec."
                )
            if axis is not None:
                if length is not None and shape[axis] != length:
                    raise InvalidElementError(
                        f"leaf {name} has length {shape[axis]} on axis {self.axis!r}, but an "
                        f"earlier leaf has {length}; leaves sharing an axis name must agree."
                    )
                length = shape[axis]
        return int(length)

    def pack(self, records: Sequence[Any]) -> PackResult:
        """Packs one buffer of records (pytrees matching the spec); see ``pack_leaves``."""
        flat, refused = [], {}
        for i, record in enumerate(records):
            try:
                flat.append(self.layout.treedef.flatten_up_to(record))
            except (TypeError, ValueError) as e:
                refused[i] = InvalidElementError(
                    f"record {i} does not have the spec's structure {self.layout.treedef}: "
                    f"{e}; give every record the spec's keys and nesting."
                )
                flat.append(None)
        return self._pack(flat, refused)

    def pack_leaves(self, records: Sequence[Sequence[np.ndarray]]) -> PackResult:
        """Packs one buffer of records given as flat leaves (in the layout's leaf order).

        Records should already be validated (cast to the spec's dtypes, as the engine's
        validation does); here only their shapes are checked. A record whose shapes do not
        match the spec, or longer than the longest row, is refused on its own; every other
        record lands in exactly one segment of one row.
        """
        return self._pack(list(records), {})

    def _pack(self, records: list, refused: dict[int, Exception]) -> PackResult:
        lengths = np.zeros(len(records), np.int64)
        for i, leaves in enumerate(records):
            if i in refused:
                continue
            try:
                if len(leaves) != len(self.layout.specs):
                    raise InvalidElementError(
                        f"record {i} has {len(leaves)} leaves, expected "
                        f"{len(self.layout.specs)} ({list(self.layout.names)})."
                    )
                lengths[i] = self.lengths_of(leaves)
            except InvalidElementError as e:
                refused[i] = e
        ok = np.asarray(sorted(set(range(len(records))) - set(refused)), np.int64)
        assignment = assign_rows(lengths[ok], self.packing)
        top = self.packing.max_row_length
        for k in assignment.refused:
            i = int(ok[k])
            refused[i] = too_long_to_pack(self.axis, int(lengths[i]), f"record {i}", top)
        batches = []
        for length, size, members in batch_rows(assignment, self.packing):
            batches.append(self._fill(assignment, ok, lengths, records, length, size, members))
        return PackResult(
            tuple(batches),
            tuple(Refusal(i, refused[i]) for i in sorted(refused)),
            len(records),
        )

    def lay_out(
        self,
        records: Sequence[Sequence[np.ndarray]],
        rows: Sequence[int],
        row_length: int,
        lengths: Sequence[int] | None = None,
    ) -> PackedBatch:
        """One batch of ``records`` (flat leaves, shapes already checked) in the rows given.

        Records sharing a value of ``rows`` share a row, laid end to end in the order given;
        rows are numbered by first appearance, and the batch has the smallest listed size
        of ``row_length`` that holds them. The engine uses it to run a subset of a packed
        batch's records (bisection, chunks after a lowered limit) in at most as many rows,
        of the same length, as the batch held. ``lengths``: the records' lengths where the
        caller knows them already (validated records), else read from the leaves.

        Raises:
            SpecError: a row overflows ``row_length`` or ``max_segments``, or there are more
                rows than the largest listed size of ``row_length``.
        """
        rows = np.asarray(rows, np.int64).reshape(-1)
        n = len(rows)
        if lengths is None:
            lengths = [self.lengths_of(r) for r in records]
        lengths = np.asarray(lengths, np.int64).reshape(-1)
        in_order = bool(n) and bool((rows[1:] >= rows[:-1]).all())
        if in_order:
            # Rows in order (a batch as the packer made it, or a run of one): each row's
            # records are adjacent, numbered by where its run starts.
            new = np.empty(n, bool)
            new[0] = True
            np.not_equal(rows[1:], rows[:-1], out=new[1:])
            starts = np.flatnonzero(new)
            num_rows = len(starts)
            row = np.cumsum(new) - 1
            counts = np.diff(np.append(starts, n))
            used = np.add.reduceat(lengths, starts)
            before = np.cumsum(lengths) - lengths  # lengths before, all rows
            segment = np.arange(n, dtype=np.int64) - np.repeat(starts, counts)
            offset = before - np.repeat(before[starts], counts)
        else:
            _, first, row = np.unique(rows, return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")  # rows numbered by first appearance
            row = np.argsort(order)[row.reshape(-1)] if n else row.reshape(-1)
            num_rows = len(first)
            # Each record's segment (its rank among its row's records, in the order given)
            # and offset (the lengths of its row's earlier records), without a loop.
            by_row = np.argsort(row, kind="stable")
            counts = np.bincount(row, minlength=num_rows).astype(np.int64)
            used = np.bincount(row, weights=lengths, minlength=num_rows).astype(np.int64)
            row_start = np.cumsum(counts) - counts  # first position of each row in by_row
            sorted_lengths = lengths[by_row]
            before = np.cumsum(sorted_lengths) - sorted_lengths  # lengths before, all rows
            segment = np.empty(n, np.int64)
            offset = np.empty(n, np.int64)
            sorted_row = row[by_row]
            segment[by_row] = np.arange(n, dtype=np.int64) - row_start[sorted_row]
            offset[by_row] = before - before[row_start[sorted_row]] if n else before
        sizes = self.packing.sizes_for(row_length)
        if num_rows and (
            used.max() > row_length
            or counts.max() > self.packing.max_segments
            or num_rows > sizes[-1]
        ):
            raise SpecError(
                f"cannot lay out {n} records in {num_rows} rows of length {row_length}: rows "
                f"use up to {int(used.max())} slots and {int(counts.max())} segments "
                f"(max_segments {self.packing.max_segments}), batches hold up to {sizes[-1]} "
                "rows."
            )
        size = sizes[bisect.bisect_left(sizes, num_rows)] if num_rows else sizes[0]
        assignment = Assignment(
            row, segment, offset, np.full(num_rows, row_length, np.int64), used, counts,
            np.zeros(0, np.int64),
        )  # fmt: skip
        records = records if hasattr(records, "gather") else list(records)
        return self._fill(
            assignment, np.arange(n), lengths, records, row_length, size, np.arange(num_rows),
            whole=True, in_order=in_order,
        )  # fmt: skip

    def _fill(
        self,
        assignment,
        ok,
        lengths,
        records,
        length,
        size,
        members,
        whole: bool = False,
        in_order: bool = False,
    ) -> PackedBatch:
        if whole:  # every record, in the batch's rows as numbered (``lay_out``)
            index, rows = ok, assignment.row
            segment, offsets = assignment.segment, assignment.offset
        else:
            where = np.full(len(assignment.row_lengths), -1, np.int64)
            where[members] = np.arange(len(members))
            row = assignment.row
            local = np.flatnonzero((row >= 0) & (where[np.maximum(row, 0)] >= 0))
            index = ok[local]
            rows = where[row[local]]
            segment = assignment.segment[local]
            offsets = assignment.offset[local]
        lens = lengths[index]
        total = int(lens.sum())
        # Each token's position in its record, in record order (int32: slots of one batch).
        first = (np.cumsum(lens) - lens).astype(np.int32)
        within = np.arange(total, dtype=np.int32) - np.repeat(first, lens)
        if in_order:
            # Each row's records adjacent and laid end to end from slot 0 (``lay_out``'s
            # rows in order): every row's slots in use are a prefix of the row, so the
            # tokens go to the slots a mask selects, in order; no index per token.
            used = np.zeros(size, np.int64)
            used[: len(assignment.used)] = assignment.used
            slots = (np.arange(length)[None, :] < used[:, None]).reshape(-1)
        else:  # flat slot indices of every record's tokens, in record order
            slots = np.repeat(rows * length + offsets, lens) + within
        ids = np.zeros(size * length, np.int32)
        ids[slots] = np.repeat((segment + 1).astype(np.int32), lens)
        positions = np.zeros(size * length, np.int32)
        positions[slots] = within
        counts = np.zeros(size, np.int32)
        counts[: len(members)] = assignment.counts[members]
        # Columnar records (``gather(leaf, index)``: the records' values of one leaf, laid
        # end to end along the first axis) are copied with one gather per leaf.
        gather = getattr(records, "gather", None)
        leaves = []
        for j, (spec, axis) in enumerate(zip(self.layout.specs, self.ragged_axis, strict=True)):
            inner = spec.resolve({self.axis: length})
            if axis is None:
                out = np.full((size, self.packing.max_segments, *inner), spec.pad_value, spec.dtype)
                if gather is not None:
                    out[rows, segment] = gather(j, index)
                else:
                    for i, r, s in zip(index, rows, segment, strict=True):
                        out[r, s] = records[i][j]
                leaves.append(out)
                continue
            moved = (inner[axis], *inner[:axis], *inner[axis + 1 :])
            flat = np.full((size * length, *moved[1:]), spec.pad_value, spec.dtype)
            if total:
                if gather is not None and axis == 0:
                    flat[slots] = gather(j, index)
                else:
                    parts = (
                        [records[i][j] for i in index]
                        if axis == 0
                        else [np.moveaxis(np.asarray(records[i][j]), axis, 0) for i in index]
                    )
                    flat[slots] = np.concatenate(parts, axis=0)
            out = flat.reshape(size, *moved)
            if axis:
                out = np.ascontiguousarray(np.moveaxis(out, 1, axis + 1))
            leaves.append(out)
        per_segment = np.zeros((size, self.packing.max_segments), np.int32)
        per_segment[rows, segment] = lens
        info = SegmentInfo(
            ids.reshape(size, length), positions.reshape(size, length), counts, per_segment
        )
        return PackedBatch(
            length, size, self.packing.max_segments, tuple(leaves), info, index, rows,
            segment, offsets, lens, len(members),
        )  # fmt: skip

    def unpack(self, result: PackResult, outputs: Sequence[Any]) -> list[Any]:
        """Per-record outputs in input order; ``None`` for refused records.

        Args:
            result: what :meth:`pack` returned.
            outputs: the kernel's outputs for each of ``result.batches``, in order.
        """
        if len(outputs) != len(result.batches):
            raise KernelError(
                f"got outputs for {len(outputs)} batches, expected {len(result.batches)}."
            )
        out: list[Any] = [None] * result.num_records
        for batch, batch_outputs in zip(result.batches, outputs, strict=True):
            gathered = segment_outputs(batch_outputs, batch)
            for k, i in enumerate(batch.indices.tolist()):
                out[i] = jax.tree_util.tree_map(lambda leaf, k=k: np.array(leaf[k]), gathered)
        return out

    def unpack_inputs(self, batch: PackedBatch) -> list[list[np.ndarray]]:
        """The records of ``batch`` cut back out of its packed leaves (``indices`` order)."""
        out = []
        for r, s, o, n in zip(
            batch.rows, batch.segment, batch.offsets, batch.record_lengths, strict=True
        ):
            leaves = []
            for leaf, axis in zip(batch.element_leaves, self.ragged_axis, strict=True):
                if axis is None:
                    leaves.append(leaf[r, s])
                else:
                    leaves.append(np.take(leaf[r], np.arange(o, o + n), axis=axis))
            out.append(leaves)
        return out
