"""Kernel outputs back to Arrow: a batched numpy output becomes one column, no per-row work."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from beam_jax._src.arrow.columns import leaf_key
from beam_jax._src.core.outputs import BatchOutputs
from beam_jax._src.errors import KernelError
from beam_jax._src.ragged import ragged_index


def _to_arrow_type_safe(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind in "biuf" and values.dtype.name != "bfloat16":
        return values
    return values.astype(np.float32)


def _nest(flat: np.ndarray, dims: Sequence[int]) -> pa.Array:
    array = pa.array(np.ascontiguousarray(flat).reshape(-1))
    for d in reversed(dims):
        array = pa.FixedSizeListArray.from_arrays(array, d)
    return array


def outputs_to_arrow(
    outputs: BatchOutputs, rows: np.ndarray, lengths: np.ndarray
) -> tuple[list[str], list[pa.Array]]:
    """Rows ``rows`` of checked batch outputs as Arrow columns.

    A leaf of shape ``(size, d1, ..., dk)`` becomes nested ``fixed_size_list`` columns; one
    whose first axis ``output_spec`` names as a ragged input axis becomes a ``list`` cut to
    each row's length. Columns are named by the leaf's path (``"output"`` for a bare array).

    Args:
        outputs: a batch's outputs, from ``check_outputs``.
        rows: the batch rows to convert, in output order.
        lengths: ``int[len(rows), num_axes]``, those rows' ragged lengths.

    Returns:
        ``(names, arrays)``, one Arrow array of ``len(rows)`` entries per output leaf.

    Raises:
        KernelError: an output's ragged axis is not its first (Arrow cannot carry it).
    """
    names, arrays = [], []
    n = len(rows)
    # Rows 0..n-1 (a whole batch): a view, not a gather.
    prefix = n == 0 or (rows[0] == 0 and rows[-1] == n - 1 and bool((np.diff(rows) == 1).all()))
    for path, leaf, cut in zip(outputs.paths, outputs.leaves, outputs.cuts, strict=True):
        name = leaf_key(path) or "output"
        leaf = _to_arrow_type_safe(leaf)
        if cut and (len(cut) > 1 or cut[0][0] != 0):
            raise KernelError(
                f"output {name!r} is ragged along axes {[a for a, _ in cut]}; Arrow outputs "
                "carry a ragged axis only as a leaf's first axis."
            )
        picked = leaf[:n] if prefix else leaf[rows]
        if cut:
            steps = lengths[:, cut[0][1]].astype(np.int64)
            width = leaf.shape[1]
            q = math.prod(leaf.shape[2:])
            index = ragged_index(steps, np.arange(n, dtype=np.int64) * width)
            flat = picked.reshape(n * width, q)[index]
            offsets = np.concatenate([[0], np.cumsum(steps)]).astype(np.int32)
            arrays.append(pa.ListArray.from_arrays(pa.array(offsets), _nest(flat, leaf.shape[2:])))
        else:
            arrays.append(_nest(picked, leaf.shape[1:]))
        names.append(name)
    return names, arrays
