"""Padded batches filled straight from decoded Arrow values (vectorised numpy).

Rows of one bucket are copied once, from a decoded record batch's flat values into the
bucket's padded buffer, with one vectorised gather per (record batch, bucket, leaf); the
record batch can then be dropped, so memory is bounded by one buffer per bucket.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from beam_jax._src.arrow.decode import DecodedBatch
from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.core.plan import PaddedBatch, Plan, aligned_full


def ragged_index(steps: np.ndarray, base: np.ndarray) -> np.ndarray:
    """``base[i] + t`` for every row ``i`` and ``t < steps[i]``, concatenated."""
    total = int(steps.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    begin = np.cumsum(steps) - steps
    within = np.arange(total, dtype=np.int64) - np.repeat(begin, steps)
    return np.repeat(base, steps) + within


class BucketFill:
    """The padded batch of one bucket, filled by row ranges, run, then reused.

    The buffers are allocated once per bucket and reused for every batch (fresh multi-MB
    buffers per batch would cost more in page faults than the copy itself). Each row
    remembers how many leading steps hold data, so reuse re-pads only what the previous
    batch wrote beyond the new row's length.

    Args:
        plan: the batching plan.
        bucket: one boundary per ragged axis.
        capacity: the most rows the batch holds.
    """

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
        # Per row, the file it was read from and its row there (None and -1: not known).
        self._files = np.full(capacity, None, object)
        self._file_rows = np.full(capacity, -1, np.int64)
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
        origin: tuple[str | None, int | None] = (None, None),
    ) -> None:
        """Copy ``rows`` of ``decoded`` (at most ``free``) into the next batch rows;
        ``origin`` is the batch's file and the file row of its first row, when known.

        One ``take`` per leaf writes the rows' whole padded block straight from the Arrow
        values (padding positions read whatever follows the row, clipped to the values, and
        are then overwritten with the pad value), so no per-row work and no temporary
        copies.
        """
        k = len(rows)
        at = self.size
        names = self.plan.layout.axis_names
        lengths = decoded.lengths[rows]
        for j, (spec, leaf, buf) in enumerate(
            zip(self.plan.layout.specs, decoded.leaves, self.leaves, strict=True)
        ):
            q, per_row = leaf.item, self._steps[j]
            start = leaf.start[rows]
            values = leaf.values
            if q == 1 or (not (start % q).any() and len(values) % q == 0):
                source = values.reshape(-1, q)  # whole steps, contiguous
                first, stride = start // q, 1
            else:  # rows start mid-step (after malformed rows): overlapping windows
                source = np.lib.stride_tricks.sliding_window_view(values, q)
                first, stride = start, q
            position = np.arange(per_row, dtype=np.int64)
            index = first[:, None] + position[None, :] * stride
            block = buf[at : at + k]
            source.take(index.reshape(-1), axis=0, out=block.reshape(k * per_row, q), mode="clip")
            if spec.ragged_axes:
                steps = lengths[:, names.index(spec.shape[0])].astype(np.int64)
                pad = position[None, :] >= steps[:, None]
                if pad.any():
                    block[pad] = spec.pad_value
            else:
                steps = np.full(k, per_row, np.int64)
            self._dirty[j][at : at + k] = steps
        self.lengths[at : at + k] = lengths
        path, first = origin
        self._files[at : at + k] = path
        self._file_rows[at : at + k] = -1 if first is None else first + np.asarray(rows)
        if decoded.ids is not None:
            numeric = decoded.id_values()
            self.ids.append(decoded.ids.take(pa.array(rows)) if numeric is None else numeric[rows])
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
        self.size = 0

    def origin(self, row: int) -> tuple[str | None, int | None]:
        """``(file, row in that file)`` of filled row ``row``, where known."""
        file_row = int(self._file_rows[row])
        return self._files[row], None if file_row < 0 else file_row

    def id_column(self) -> pa.Array | None:
        """The ids of the filled rows (``None`` without an id column)."""
        if not self.ids:
            return None
        if len(self.ids) > 1 or isinstance(self.ids[0], np.ndarray):
            parts = self.ids
            if all(isinstance(part, np.ndarray) for part in parts):
                whole = pa.array(np.concatenate(parts), type=self._id_type)
            else:
                whole = pa.concat_arrays(
                    [
                        pa.array(part, type=self._id_type) if isinstance(part, np.ndarray) else part
                        for part in parts
                    ]
                )
            self.ids = [whole]
        return self.ids[0]
