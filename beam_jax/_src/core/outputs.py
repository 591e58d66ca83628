"""The kernel's output contract, checked once for every front end (pure numpy).

A per-row kernel returns a pytree whose every leaf has the batch as its leading axis and,
with an ``output_spec``, the declared structure; axes the spec names after ragged input
axes hold data only up to each row's length. ``check_outputs`` enforces the contract and
``nonfinite_rows`` finds rows whose real (unpadded) outputs hold NaN or Inf.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from beam_jax._src.core.dtypes import kind
from beam_jax._src.core.spec import Layout
from beam_jax._src.errors import KernelError


@dataclasses.dataclass(frozen=True)
class BatchOutputs:
    """A batch's outputs that passed the contract.

    Attributes:
        leaves: the output leaves as numpy arrays, each ``(size, ...)``.
        paths: each leaf's pytree path.
        treedef: the outputs' tree structure.
        cuts: per leaf, ``(output axis, index of the ragged input axis)`` pairs: the axes
            cut back to each row's own length.
    """

    leaves: tuple[np.ndarray, ...]
    paths: tuple[tuple, ...]
    treedef: Any
    cuts: tuple[tuple[tuple[int, int], ...], ...]


def check_outputs(
    outputs: Any, size: int, output_layout: Layout | None, axis_names: tuple[str, ...]
) -> BatchOutputs:
    """Check batched kernel outputs against the output contract.

    Args:
        outputs: the kernel's outputs for one batch (host arrays).
        size: the padded batch dimension.
        output_layout: the declared ``output_spec``, or ``None``.
        axis_names: the input's ragged axis names, in plan order.

    Raises:
        KernelError: the outputs hold no array, a leaf lacks the batch axis, or the
            structure differs from ``output_spec``.
    """
    with_path, treedef = jax.tree_util.tree_flatten_with_path(outputs)
    require_arrays(outputs, with_path)
    leaves = tuple(np.asarray(leaf) for _, leaf in with_path)
    for leaf in leaves:
        if leaf.ndim == 0 or leaf.shape[0] != size:
            raise KernelError(
                f"the kernel returned a leaf of shape {leaf.shape} for a batch of {size}; every "
                "output needs the batch as its leading axis. A kernel declared batched=True "
                "must keep it; a per-element kernel gets it from vmap."
            )
    cuts: list[tuple[tuple[int, int], ...]] = [() for _ in leaves]
    if output_layout is not None:
        if output_layout.treedef != treedef:
            raise KernelError(
                f"the kernel's output structure {treedef} does not match output_spec "
                f"{output_layout.treedef}."
            )
        index = {n: k for k, n in enumerate(axis_names)}
        for i, spec in enumerate(output_layout.specs):
            if leaves[i].ndim != len(spec.shape) + 1:
                raise KernelError(
                    f"output {jax.tree_util.keystr(with_path[i][0]) or '<output>'} has shape "
                    f"{leaves[i].shape[1:]} per row; output_spec declares {spec.shape}."
                )
            cuts[i] = tuple((a, index[name]) for a, name in spec.ragged_axes)
    return BatchOutputs(leaves, tuple(p for p, _ in with_path), treedef, tuple(cuts))


def require_arrays(outputs: Any, leaves: Any = None) -> None:
    """Refuse kernel outputs without a single array (``None``, ``{}``, ``()``): no element
    would get a result, and a sum of them would count elements it never summed.

    Raises:
        KernelError: ``outputs`` has no leaves (``leaves``, where the caller has them).
    """
    if not (leaves if leaves is not None else jax.tree_util.tree_leaves(outputs)):
        raise KernelError(
            f"the kernel returned {outputs!r}, which holds no array; expected an array or a "
            "pytree of arrays for each element. Return the result (a missing `return` "
            "gives None)."
        )


def real_positions(leaf: np.ndarray, cut, lengths: np.ndarray) -> np.ndarray | None:
    """``bool`` of ``leaf``'s first ``len(lengths)`` rows: True where data is real.

    ``None`` when the leaf has no cut axis (every position is real).
    """
    if not cut:
        return None
    n = len(lengths)
    mask = np.ones((n, *leaf.shape[1:]), bool)
    for axis, k in cut:
        at = axis + 1  # the batch axis comes first
        positions = np.arange(leaf.shape[at]).reshape([-1] + [1] * (leaf.ndim - at - 1))
        mask &= positions < lengths[:, k].reshape([n] + [1] * (leaf.ndim - 1))
    return mask


def nonfinite_rows(outputs: BatchOutputs, lengths: np.ndarray) -> np.ndarray:
    """``bool[n]``: rows whose real outputs hold NaN or Inf.

    Args:
        outputs: checked outputs of a batch.
        lengths: ``int[n, num_axes]``, the real rows' ragged lengths.
    """
    n = len(lengths)
    bad = np.zeros(n, bool)
    for leaf, cut in zip(outputs.leaves, outputs.cuts, strict=True):
        if kind(leaf.dtype) not in "fc":
            continue
        nonfinite = ~np.isfinite(leaf[:n])
        real = real_positions(leaf, cut, lengths)
        if real is not None:
            nonfinite &= real
        bad |= nonfinite.reshape(n, -1).any(axis=1)
    return bad


def all_finite(tree: Any) -> bool:
    """Whether every floating or complex leaf of ``tree`` holds only finite values."""
    return all(
        np.isfinite(leaf).all()
        for leaf in jax.tree_util.tree_leaves(tree)
        if kind(np.asarray(leaf).dtype) in "fc"
    )


def split_rows(
    outputs: BatchOutputs, rows: Any, items: Any = None, lengths: Any = None
) -> list[Any]:
    """Split checked batch outputs into one pytree for each of ``rows``.

    Output axes with a cut are cut to each element's own length (``item.lengths``, or its
    row of ``lengths``).

    Args:
        outputs: the batch's outputs, from ``check_outputs``.
        rows: which batch rows to return.
        items: the validated elements of those rows, in the same order.
        lengths: instead of ``items``, those rows' ragged lengths (``int[n, num_axes]``).
    """
    rows = np.asarray(rows, np.int64)
    # One writable host copy of each leaf's rows; elements get views into it.
    blocks = [np.array(leaf[rows]) for leaf in outputs.leaves]
    if not any(outputs.cuts) and all(block.ndim > 1 for block in blocks):
        # Nothing to cut: each element's rows as views, by numpy's own iteration.
        columns = [list(block) for block in blocks]
        if outputs.treedef.num_leaves == 1 and outputs.treedef.num_nodes == 1:
            return columns[0]  # a bare array per element (the treedef is a leaf)
        return [outputs.treedef.unflatten(per) for per in zip(*columns, strict=True)]
    if lengths is None:
        lengths = [item.lengths for item in items]
    else:
        lengths = np.asarray(lengths).tolist()
    result = []
    for i, own in enumerate(lengths):
        per = []
        for block, cut in zip(blocks, outputs.cuts, strict=True):
            row = block[i, ...]
            if cut:
                index = [slice(None)] * row.ndim
                for axis, k in cut:
                    index[axis] = slice(0, own[k])
                row = row[tuple(index)]
            per.append(row)
        result.append(outputs.treedef.unflatten(per))
    return result
