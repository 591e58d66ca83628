"""Bucket planning: choose boundaries that minimise padded work for a compile budget."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from beam_jax._src.bucketing.rule import boundary_index
from beam_jax._src.errors import SpecError

# Rows of the DP's cost matrix computed at once; bounds memory to ~_CHUNK x distinct lengths.
_CHUNK = 256
_INF = np.int64(1) << 62


def _histogram(lengths: Sequence[int] | np.ndarray, max_size: int | None):
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0:
        raise SpecError(
            f"lengths must be a non-empty 1-D sequence of ints, got shape {lengths.shape}."
        )
    if lengths.dtype.kind not in "iu":
        if (
            lengths.dtype.kind == "f"
            and np.all(np.isfinite(lengths))
            and np.all(lengths == np.round(lengths))
        ):
            lengths = lengths.astype(np.int64)
        else:
            raise SpecError(f"lengths must be integers, got dtype {lengths.dtype}.")
    if lengths.min() < 0:
        raise SpecError(f"lengths must be non-negative, got {int(lengths.min())}.")
    # A length-0 element still occupies the first bucket; elements beyond max_size are
    # truncated (or dead-lettered) to max_size, so both are planned as the sizes they take.
    lengths = np.maximum(lengths.astype(np.int64), 1)
    if max_size is not None:
        if max_size < 1:
            raise SpecError(f"max_size must be >= 1, got {max_size}.")
        lengths = np.minimum(lengths, max_size)
    values, counts = np.unique(lengths, return_counts=True)
    if max_size is not None and values[-1] < max_size:
        values = np.append(values, max_size)
        counts = np.append(counts, 0)
    return values.astype(np.int64), counts.astype(np.int64)


def plan_boundaries(
    lengths: Sequence[int] | np.ndarray,
    num_buckets: int = 8,
    *,
    max_size: int | None = None,
) -> tuple[int, ...]:
    """Bucket boundaries that minimise the total padded length of a sample.

    Each element is padded to the smallest boundary that fits it, so the padded work of a
    sample is ``sum(boundary(length))``. An exact dynamic programme over the histogram of
    distinct lengths finds the boundaries (at most ``num_buckets``, the compile budget per
    axis) that minimise it. Time is ``O(num_buckets * distinct_lengths**2)``.

    Examples:
        >>> plan_boundaries([1, 2, 2, 3, 9, 10, 10], num_buckets=2)
        (3, 10)
        >>> plan_boundaries([5, 7], num_buckets=4, max_size=512)
        (5, 7, 512)

    Args:
        lengths: a sample of an axis's lengths (e.g. token counts of 10,000 records).
        num_buckets: the most boundaries to return.
        max_size: if given, the last boundary is exactly ``max_size``, so elements longer
            than any in the sample still fit; sample lengths above it count as ``max_size``.

    Returns:
        Strictly increasing boundaries, the last one ``max_size`` or the sample's maximum.

    Raises:
        SpecError: ``lengths`` is empty or not integral, or ``num_buckets < 1``.
    """
    return boundaries_per_budget(lengths, num_buckets, max_size=max_size)[-1]


def boundaries_per_budget(
    lengths: Sequence[int] | np.ndarray,
    max_buckets: int,
    *,
    max_size: int | None = None,
) -> list[tuple[int, ...]]:
    """:func:`plan_boundaries` for every budget ``1..max_buckets`` at once.

    The dynamic programme for ``k`` buckets computes those for fewer on its way, so one
    pass of ``max_buckets`` steps gives every budget's boundaries: ``max_buckets`` times
    less work than planning each budget on its own. Entry ``k - 1`` equals
    ``plan_boundaries(lengths, k, max_size=max_size)``: a budget above the number of
    distinct lengths repeats the boundaries of that many (more buckets change nothing).

    Example:
        >>> boundaries_per_budget([1, 2, 2, 3, 9, 10, 10], 3)
        [(10,), (3, 10), (2, 3, 10)]
        >>> boundaries_per_budget([4, 4, 7], 3)
        [(7,), (4, 7), (4, 7)]

    Raises:
        SpecError: ``lengths`` is empty or not integral, or ``max_buckets < 1``.
    """
    if not isinstance(max_buckets, int | np.integer) or max_buckets < 1:
        raise SpecError(f"num_buckets must be a positive int, got {max_buckets!r}.")
    values, counts = _histogram(lengths, max_size)
    m = len(values)
    k = min(int(max_buckets), m)
    # cum[i]: how many sample elements have one of the i smallest distinct lengths.
    cum = np.concatenate([[0], np.cumsum(counts)])
    # best[p]: least padded total of the p smallest distinct lengths using t buckets whose
    # largest boundary is values[p - 1]; choice[t][i] is the p that achieves best_t[i].
    best = np.full(m + 1, _INF, np.int64)
    best[0] = 0
    choices = []
    p_index = np.arange(m + 1)
    for _ in range(k):
        new = np.full(m + 1, _INF, np.int64)
        choice = np.zeros(m + 1, np.int64)
        for lo in range(1, m + 1, _CHUNK):
            hi = min(lo + _CHUNK, m + 1)
            i = np.arange(lo, hi)[:, None]
            v = values[i - 1]
            # cost[i, p] = best[p] + v_i * (cum[i] - cum[p]) for p < i: the last bucket
            # holds distinct lengths p..i-1, each padded to values[i - 1].
            cost = np.where(
                (p_index[None, :] < i) & (best[None, :] < _INF),
                best[None, :] + v * (cum[i] - cum[None, :]),
                _INF,
            )
            arg = np.argmin(cost, axis=1)
            new[lo:hi] = cost[np.arange(hi - lo), arg]
            choice[lo:hi] = arg
        best = new
        choices.append(choice)
    # With t <= distinct lengths, t buckets are never worse than fewer: for each t, walk
    # back from the whole histogram, one bucket per step, until no lengths are left.
    plans = []
    for t in range(1, k + 1):
        out = []
        i = m
        for choice in reversed(choices[:t]):
            out.append(int(values[i - 1]))
            i = int(choice[i])
        plans.append(tuple(sorted(out)))
    return plans + plans[-1:] * (int(max_buckets) - k)


def padded_total(lengths: Sequence[int] | np.ndarray, boundaries: Sequence[int]) -> int:
    """The sum over ``lengths`` of the boundary each is padded to (longer ones: the last)."""
    lengths = np.maximum(np.asarray(lengths, np.int64), 1)
    bounds = np.asarray(boundaries, np.int64)
    index = np.minimum(boundary_index(bounds, lengths), len(bounds) - 1)
    return int(bounds[index].sum())


def padding_ratio(lengths: Sequence[int] | np.ndarray, boundaries: Sequence[int]) -> float:
    """Padded over real length of a sample bucketed by ``boundaries`` (batch rows excluded).

    Examples:
        >>> padding_ratio([3, 4, 8], (4, 8))
        1.0666666666666667
    """
    lengths = np.asarray(lengths, np.int64)
    real = int(lengths.sum())
    if real == 0:
        raise SpecError("padding_ratio needs at least one non-empty length.")
    clipped = np.minimum(lengths, int(np.asarray(boundaries)[-1]))
    return padded_total(clipped, boundaries) / int(clipped.sum())
