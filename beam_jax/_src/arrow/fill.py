"""Padded batches filled straight from decoded Arrow values (vectorised numpy).

Rows of one bucket are copied once from a decoded record batch's flat values into the
bucket's padded buffer (one gather per record batch, bucket and leaf, or one slice copy per
long row), so memory is bounded by one buffer per bucket. For packing, ``ColumnRecords``
stages a record batch's rows as they are and lays a packed batch out with one gather per leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from beam_jax._src.arrow.decode import DecodedBatch
from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.core.packed_batch import PackedBatch
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.core.plan import PaddedBatch, Plan, aligned_full
from beam_jax._src.ragged import ragged_index


class BucketFill:
    """The padded batch of one bucket, filled by row ranges, run, then reused.

    The buffers are allocated once per bucket and reused for every batch (fresh multi-MB
    buffers would cost more in page faults than the copy). Each row remembers how many
    leading steps hold data, so reuse re-pads only what the previous batch wrote beyond
    the new row's length. Rows of at least ``row_copy_values`` padded values are copied row
    by row, their real values only; shorter ones by one gather of whole padded rows.

    Args:
        plan: the batching plan.
        bucket: one boundary per ragged axis.
        capacity: the most rows the batch holds.
    """

    row_copy_values = 2048  # values per padded row from which rows are copied one by one

    def __init__(self, plan: Plan, bucket: Bucket, capacity: int):
        self.plan = plan
        self.bucket = bucket
        self.capacity = capacity
        sizes = dict(zip(plan.layout.axis_names, bucket, strict=True))
        self.leaves = [
            aligned_full((capacity, *spec.resolve(sizes)), spec.pad_value, spec.dtype)
            for spec in plan.layout.specs
        ]
        # Per leaf: steps along the first axis, and per row how many may hold data.
        self._steps = [(leaf.shape[1] if leaf.ndim > 1 else 1) for leaf in self.leaves]
        self._dirty = [np.zeros(capacity, np.int64) for _ in self.leaves]
        self.lengths = aligned_full((capacity, len(bucket)), 0, np.int32)
        # Ids of the filled rows, a part per add: numpy for numeric id columns (a gather,
        # not an Arrow take per add), else Arrow arrays; one Arrow array when asked for.
        self.ids: list[pa.Array | np.ndarray] = []
        self._id_type: pa.DataType | None = None
        # Per row, its record batch (an index into ``_describe``) and its row there.
        self._describe: list[Callable[[Any, int], Any] | None] = []
        self._batch = np.zeros(capacity, np.int64)
        self._rows = np.zeros(capacity, np.int64)
        self.size = 0
        self.slot: Any = None  # set by the front end: the window this batch belongs to

    @property
    def free(self) -> int:
        return self.capacity - self.size

    def _clean(self, j: int, at: int, keep: np.ndarray) -> None:
        """Re-pad rows ``at..at+len(keep)`` of leaf ``j`` beyond ``keep`` steps."""
        rows = np.arange(at, at + len(keep), dtype=np.int64)
        dirty = self._dirty[j][rows]
        extra = np.maximum(dirty - keep, 0)
        if extra.any():
            steps = self._steps[j]
            index = ragged_index(extra, rows * steps + np.minimum(keep, dirty))
            leaf = self.leaves[j]
            leaf.reshape(len(leaf) * steps, -1)[index] = self.plan.layout.specs[j].pad_value
        self._dirty[j][rows] = keep

    def add(
        self,
        decoded: DecodedBatch,
        rows: np.ndarray,
        describe: Callable[[Any, int], Any] | None = None,
    ) -> None:
        """Copy ``rows`` of ``decoded`` (at most ``free``) into the next batch rows;
        ``describe(key, row)`` makes a row's dead-letter source from its id and its row in
        ``decoded`` (``source``), as ``ColumnRecords``' does.
        """
        k = len(rows)
        at = self.size
        names = self.plan.layout.axis_names
        lengths = decoded.lengths[rows]
        for j, (spec, leaf, buf) in enumerate(
            zip(self.plan.layout.specs, decoded.leaves, self.leaves, strict=True)
        ):
            per_row = self._steps[j]
            start = leaf.start[rows]
            block = buf[at : at + k]
            if not spec.ragged_axes:
                steps = np.full(k, per_row, np.int64)
                _gather_rows(block, leaf, start, steps, per_row, spec.pad_value, ragged=False)
            else:
                steps = lengths[:, names.index(spec.shape[0])].astype(np.int64)
                if per_row * leaf.item >= self.row_copy_values:
                    dirty = self._dirty[j][at : at + k]
                    _copy_rows(block, leaf, start, steps, dirty, spec.pad_value)
                else:
                    _gather_rows(block, leaf, start, steps, per_row, spec.pad_value, ragged=True)
            self._dirty[j][at : at + k] = steps
        self.lengths[at : at + k] = lengths
        if not self._describe or self._describe[-1] is not describe:
            self._describe.append(describe)
        self._batch[at : at + k] = len(self._describe) - 1
        self._rows[at : at + k] = rows
        if decoded.ids is not None:
            self.ids.append(decoded.ids_of(rows))
            self._id_type = decoded.ids.type
        self.size += k

    def padded(self, rows: np.ndarray | None = None) -> PaddedBatch:
        """The filled rows, or ``rows`` of them, as one padded batch.

        The batch dimension is padded to the smallest allowed size for the row count.
        """
        n = self.size if rows is None else len(rows)
        size = self.plan.padded_batch_size(self.bucket, n)
        if rows is None and size <= self.capacity:
            for j in range(len(self.leaves)):
                self._clean(j, n, np.zeros(size - n, np.int64))
            self.lengths[n:size] = 0
            leaves = [leaf[:size] for leaf in self.leaves]
            lengths = self.lengths[:size]
        else:
            rows = np.arange(self.size) if rows is None else rows
            leaves = []
            for spec, leaf in zip(self.plan.layout.specs, self.leaves, strict=True):
                out = np.full((size, *leaf.shape[1:]), spec.pad_value, spec.dtype)
                out[:n] = leaf[rows]
                leaves.append(out)
            lengths = np.zeros((size, self.lengths.shape[1]), np.int32)
            lengths[:n] = self.lengths[rows]
        named = {
            name: np.ascontiguousarray(lengths[:, k])
            for k, name in enumerate(self.plan.layout.axis_names)
        }
        return PaddedBatch(self.bucket, tuple(leaves), named, n, size)

    def reset(self) -> None:
        """Empty the batch, keeping the buffers for the next one."""
        self.ids = []
        self._describe = []
        self.size = 0

    def source(self, row: int) -> Any:
        """Filled row ``row``'s dead-letter source (``None`` without ``add``'s ``describe``)."""
        describe = self._describe[int(self._batch[row])]
        ids = self.id_column()
        key = None if ids is None else ids[row].as_py()
        return None if describe is None else describe(key, int(self._rows[row]))

    def id_array(self, rows: np.ndarray) -> pa.Array | None:
        """The ids of filled rows ``rows`` (``None`` without an id column)."""
        ids = self.id_column()
        if ids is None or (len(rows) == len(ids) and (rows == np.arange(len(ids))).all()):
            return ids
        return ids.take(pa.array(rows))

    def id_column(self) -> pa.Array | None:
        """The ids of the filled rows (``None`` without an id column)."""
        if not self.ids:
            return None
        if len(self.ids) > 1 or isinstance(self.ids[0], np.ndarray):
            self.ids = [_arrow_ids(self.ids, self._id_type)]
        return self.ids[0]


def _arrow_ids(parts: Sequence[pa.Array | np.ndarray], id_type: pa.DataType | None) -> pa.Array:
    """Parts of an id column (numpy or Arrow arrays) as one Arrow array."""
    if all(isinstance(part, np.ndarray) for part in parts):
        return pa.array(np.concatenate(parts), type=id_type)
    arrays = [pa.array(p, type=id_type) if isinstance(p, np.ndarray) else p for p in parts]
    return pa.concat_arrays(arrays)


def _gather_rows(block, leaf, start, steps, per_row, pad_value, *, ragged: bool) -> None:
    """Write whole padded rows into ``block`` with one ``take`` from the flat values: a
    row's padding reads whatever follows it (clipped to the values), then is overwritten
    with ``pad_value`` (``ragged``: beyond each row's ``steps``)."""
    k, q, values = len(block), leaf.item, leaf.values
    if q == 1 or (not (start % q).any() and len(values) % q == 0):
        source = values.reshape(-1, q)  # whole steps, contiguous
        first, stride = start // q, 1
    else:  # rows start mid-step (after malformed rows): overlapping windows
        source = np.lib.stride_tricks.sliding_window_view(values, q)
        first, stride = start, q
    position = np.arange(per_row, dtype=np.int64)
    index = first[:, None] + position[None, :] * stride
    source.take(index.reshape(-1), axis=0, out=block.reshape(k * per_row, q), mode="clip")
    if ragged:
        pad = position[None, :] >= steps[:, None]
        if pad.any():
            block[pad] = pad_value


def _copy_rows(block, leaf, start, steps, dirty, pad_value) -> None:
    """Copy each row's real values into ``block`` (a row's values are contiguous from its
    start, aligned or not) and re-pad only ``steps..dirty``: what the buffer's previous
    batch wrote beyond the new row (past ``dirty`` it already holds the pad value)."""
    values, shape = leaf.values, block.shape[2:]
    q = leaf.item
    rows = zip(start.tolist(), steps.tolist(), dirty.tolist(), strict=True)
    for i, (first, n, held) in enumerate(rows):
        block[i, :n] = values[first : first + n * q].reshape(n, *shape)
        if held > n:
            block[i, n:held] = pad_value


class ColumnRecords:
    """Records staged for packing as the columns they were decoded from: no per-row objects.

    A record's dead-letter description is made only when needed, by its batch's
    ``describe(key, row)``. ``take`` and ``concat`` make subsets and unions (for the engine's
    ``PackedStage``); ``lay_out`` copies a packed batch's values with one gather per leaf.

    Args:
        values: per leaf, its values, flat.
        starts: per leaf, ``int64[records]``: the index in its values of each record's first.
        sizes: per leaf ``(ragged, size, shape)``: whether its first axis is the packed
            one, and the values and shape of one step along it (of the whole leaf, without).
        lengths: ``int64[records]``: each record's length along the packed axis.
        keys: each record's id (numpy, or an Arrow array), or ``None``.
        rows: ``int64[records]``: each record's row in its record batch.
        batch: ``int64[records]``: each record's record batch, an index into ``describe``.
        describe: per record batch, ``describe(key, row)``: a record's dead-letter source.
        id_type: the Arrow type of the ids (``id_array``'s).
    """

    def __init__(
        self,
        values: Sequence[np.ndarray],
        starts: Sequence[np.ndarray],
        sizes: Sequence[tuple[bool, int, tuple[int, ...]]],
        lengths: np.ndarray,
        keys: np.ndarray | pa.Array | None,
        rows: np.ndarray,
        batch: np.ndarray,
        describe: Sequence[Callable[[Any, int], Any]],
        id_type: pa.DataType | None = None,
    ):
        self.values = tuple(values)
        self.starts = tuple(starts)
        self.sizes = tuple(sizes)
        self.lengths = lengths
        self.keys = keys
        self.rows = rows
        self.batch = batch
        self.describe = list(describe)
        self.id_type = id_type

    @classmethod
    def from_decoded(
        cls,
        decoded: DecodedBatch,
        rows: np.ndarray,
        ragged: Sequence[bool],
        shapes: Sequence[tuple[int, ...]],
        describe: Callable[[Any, int], Any],
    ) -> ColumnRecords:
        """Rows ``rows`` of a decoded record batch; per leaf, whether its first axis is the
        packed one, and its shape past that axis (its whole shape without it)."""
        return cls(
            [leaf.values for leaf in decoded.leaves],
            [leaf.start[rows] for leaf in decoded.leaves],
            [
                (bool(r), int(np.prod(shape, dtype=np.int64)), tuple(shape))
                for r, shape in zip(ragged, shapes, strict=True)
            ],
            decoded.lengths[rows, 0].astype(np.int64),
            decoded.ids_of(rows),
            np.asarray(rows, np.int64),
            np.zeros(len(rows), np.int64),
            [describe],
            None if decoded.ids is None else decoded.ids.type,
        )

    def __len__(self) -> int:
        return len(self.lengths)

    def take(self, index: np.ndarray) -> ColumnRecords:
        index = np.asarray(index, np.int64)
        keys = self.keys
        if isinstance(keys, np.ndarray):
            keys = keys[index]
        elif keys is not None:
            keys = keys.take(pa.array(index))
        return ColumnRecords(
            self.values, [s[index] for s in self.starts], self.sizes, self.lengths[index],
            keys, self.rows[index], self.batch[index], self.describe, self.id_type,
        )  # fmt: skip

    @staticmethod
    def concat(parts: Sequence[ColumnRecords]) -> ColumnRecords:
        """The records of ``parts``, in order. The values are copied compactly (only the
        records' own), so what a stage keeps between packs never holds the values of
        records already run."""
        if len(parts) == 1:
            return parts[0]
        values, starts = [], []
        for j, (ragged, size, _) in enumerate(parts[0].sizes):
            pieces, firsts, at = [], [], 0
            for p in parts:
                counts = p.lengths * size if ragged else np.full(len(p), size, np.int64)
                pieces.append(p.values[j][ragged_index(counts, p.starts[j])])
                firsts.append(at + np.cumsum(counts) - counts)
                at += int(counts.sum())
            values.append(np.concatenate(pieces))
            starts.append(np.concatenate(firsts))
        keys = [p.keys for p in parts]
        if keys[0] is None:
            keys = None
        elif all(isinstance(k, np.ndarray) for k in keys):
            keys = np.concatenate(keys)
        else:
            keys = _arrow_ids(keys, parts[0].id_type)
        # Only the record batches still referenced keep their description.
        shift = np.cumsum([0] + [len(p.describe) for p in parts[:-1]])
        batch = np.concatenate([p.batch + k for p, k in zip(parts, shift, strict=True)])
        describe = [d for p in parts for d in p.describe]
        used, batch = np.unique(batch, return_inverse=True)
        return ColumnRecords(
            values, starts, parts[0].sizes, np.concatenate([p.lengths for p in parts]), keys,
            np.concatenate([p.rows for p in parts]), batch.reshape(-1).astype(np.int64),
            [describe[i] for i in used.tolist()], parts[0].id_type,
        )  # fmt: skip

    def key(self, i: int) -> Any:
        """Record ``i``'s id as a Python value (``None`` without ids)."""
        if self.keys is None:
            return None
        return self.keys[i].item() if isinstance(self.keys, np.ndarray) else self.keys[i].as_py()

    def id_array(self, index: np.ndarray) -> pa.Array | None:
        """The ids of records ``index``, as an Arrow array (``None`` without ids)."""
        if self.keys is None:
            return None
        if isinstance(self.keys, np.ndarray):
            return pa.array(self.keys[index], type=self.id_type)
        return self.keys.take(pa.array(np.asarray(index, np.int64)))

    def source(self, i: int) -> Any:
        """Record ``i``'s dead-letter source."""
        return self.describe[int(self.batch[i])](self.key(i), int(self.rows[i]))

    def __getitem__(self, i: int) -> list[np.ndarray]:
        """Record ``i``'s leaves (views of the values)."""
        out = []
        for values, starts, (ragged, size, shape) in zip(
            self.values, self.starts, self.sizes, strict=True
        ):
            begin = int(starts[i])
            if ragged:
                n = int(self.lengths[i])
                out.append(values[begin : begin + n * size].reshape(n, *shape))
            else:
                out.append(values[begin : begin + size].reshape(shape))
        return out

    def gather(self, j: int, index: np.ndarray) -> np.ndarray:
        """Leaf ``j`` of records ``index``: along the packed axis laid end to end
        (``[total length, *step]``), or stacked for a leaf without it (``[n, *shape]``)."""
        ragged, size, shape = self.sizes[j]
        starts = self.starts[j][index]
        if ragged:
            counts = self.lengths[index] * size
            return self.values[j][ragged_index(counts, starts)].reshape(-1, *shape)
        flat = starts[:, None] + np.arange(size, dtype=np.int64)[None, :]
        return self.values[j][flat].reshape(len(index), *shape)

    def lay_out(
        self, plan: PackedPlan, index: np.ndarray | None, rows, row_length: int
    ) -> PackedBatch:
        """Records ``index`` (all by default) as one packed batch, in the batch rows given."""
        chosen = self if index is None else self.take(index)
        return plan.packer.lay_out(chosen, rows, row_length, chosen.lengths)
