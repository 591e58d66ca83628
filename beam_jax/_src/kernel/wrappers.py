"""Wrappers that turn a user's function into a variant the kernel runs (as Optax wraps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from beam_jax._src.kernel.compiled import BatchLengths, per_element


class SumRows:
    """``fn`` as a batched function returning its outputs summed over the real rows.

    Padded rows are masked out on the device before the sum, so the result is exact
    whatever the padding; the sum keeps a leading axis of 1 (a "batch" of one sum). This is
    how ``ReduceKernel`` turns a per-element function into a full-dataset reduction. On
    several devices each sums its own shard of the batch (``sums_per_shard``: one sum per
    device, added on the host), with no collective between devices.

    Examples:
        >>> import numpy as np
        >>> summed = SumRows(lambda p, x, lengths: x * 2.0)
        >>> lengths = BatchLengths({}, np.array([True, True, False]))
        >>> summed(None, np.array([1.0, 2.0, 100.0]), lengths).tolist()
        [6.0]

    Args:
        fn: ``fn(params, element, lengths)`` per element, or per batch if ``batched``.
        batched: ``fn`` already takes whole batches and returns per-row outputs.
    """

    sums_per_shard = True
    """Rows are summed independently of other rows: a shard's sum is a valid partial sum."""

    def __init__(self, fn: Callable[..., Any], *, batched: bool = False):
        self.fn = fn
        self.batched = batched
        self._rows = fn if batched else per_element(fn)

    def __call__(self, params: Any, element: Any, lengths: BatchLengths) -> Any:
        out = self._rows(params, element, lengths)
        valid = lengths.valid

        def row_sum(o):
            keep = valid.reshape((-1,) + (1,) * (o.ndim - 1))
            return jnp.sum(jnp.where(keep, o, jnp.zeros((), o.dtype)), axis=0, keepdims=True)

        return jax.tree_util.tree_map(row_sum, out)


class SegmentKernel:
    """A packed kernel ``fn(params, element, segments)`` as the kernel calls it.

    The compiled kernel passes ``(element, segments)`` as one argument (the packed row and
    its ``SegmentInfo``, both batched along rows) and no per-axis lengths; this unpacks the
    pair for ``fn``, per row (vmapped) or per batch when the transform is ``batched``.

    Examples:
        >>> import numpy as np
        >>> k = SegmentKernel(lambda p, x, segments: x + segments)
        >>> k(None, (np.ones(2), np.arange(2)), {}).tolist()
        [1.0, 2.0]

    Args:
        fn: ``fn(params, element, segments)``: one packed row (or a batch of them) and its
            ``SegmentInfo``; returns one output per segment, ``[max_segments, ...]``.
    """

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.sums_per_shard = getattr(fn, "sums_per_shard", False)

    def __call__(self, params: Any, packed: Any, lengths: Any) -> Any:
        element, segments = packed
        return self.fn(params, element, segments)


class SumSegments:
    """A packed ``fn`` as a batched function returning its outputs summed over the real
    segments (``ReduceKernel`` with packing): ``SumRows``' counterpart for packed rows.

    ``fn(params, row, segments)`` returns one output per segment, ``[max_segments, ...]``;
    segments past each row's count (and every segment of an empty row) are masked out
    before the sum, which keeps a leading axis of 1.

    Examples:
        >>> import numpy as np
        >>> from beam_jax._src.core.packed_batch import SegmentInfo
        >>> seg = SegmentInfo(None, None, np.array([2, 0]), np.zeros((2, 3), np.int32))
        >>> summed = SumSegments(lambda p, x, s: x)
        >>> summed(None, np.array([[1.0, 2.0, 50.0], [7.0, 7.0, 7.0]]), seg).tolist()
        [3.0]

    Args:
        fn: ``fn(params, row, segments)`` per packed row, or per batch if ``batched``.
        batched: ``fn`` already takes whole batches of rows.
    """

    sums_per_shard = True
    """Rows are summed independently of other rows: a shard's sum is a valid partial sum."""

    def __init__(self, fn: Callable[..., Any], *, batched: bool = False):
        self.fn = fn
        self.batched = batched
        self._rows = fn if batched else jax.vmap(fn, in_axes=(None, 0, 0))

    def __call__(self, params: Any, element: Any, segments: Any) -> Any:
        out = self._rows(params, element, segments)
        counts = jnp.asarray(segments.counts)
        m = segments.lengths.shape[-1]
        real = jnp.arange(m)[None, :] < counts[:, None]  # [rows, max_segments]

        def segment_sum(o):
            keep = real.reshape(real.shape + (1,) * (o.ndim - 2))
            kept = jnp.where(keep, o, jnp.zeros((), o.dtype))
            return jnp.sum(kept, axis=(0, 1))[None]

        return jax.tree_util.tree_map(segment_sum, out)
