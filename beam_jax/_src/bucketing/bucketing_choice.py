"""Buckets and batch sizes planned together from a sample, under a compile budget.

``plan_boundaries`` minimises the padding along the ragged axis alone; ``plan_bucketing``
also weighs the padded batch rows and a price per compiled ``(bucket, batch size)``, with at
most ``compile_budget`` shapes in all (pure numpy).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from beam_jax._src.bucketing.boundaries import boundaries_per_budget
from beam_jax._src.bucketing.buckets import Bucketing
from beam_jax._src.bucketing.rule import boundary_index, check_positive_ints, round_up
from beam_jax._src.errors import SpecError


@dataclasses.dataclass(frozen=True)
class BucketingChoice:
    """What ``plan_bucketing`` chose, and what it expects of it.

    Attributes:
        bucketing: the boundaries and per-bucket batch sizes, ready for a kernel transform.
        shapes: compiled shapes it allows: the sum over buckets of their batch sizes.
        padding_ratio: expected padded over real volume, batch rows included.
        counts: expected elements per bucket, in boundary order.
    """

    bucketing: Bucketing
    shapes: int
    padding_ratio: float
    counts: tuple[int, ...]


def _bucket_sizes(n: int, cap: int, num_devices: int, extra: bool) -> tuple[tuple[int, ...], int]:
    """Batch sizes for ``n`` expected elements with at most ``cap`` rows, and padded rows.

    ``q = ceil(n / cap)`` batches of ``ceil(n / q)`` rows carry fewer than ``q`` padded rows
    in all, with one compiled shape; ``extra`` adds the last batch's own size as a second.
    """
    cap = max(cap, num_devices)
    if n <= 0:
        return (round_up(1, num_devices),), 0
    q = math.ceil(n / cap)
    size = min(round_up(math.ceil(n / q), num_devices), round_up(cap, num_devices))
    q = math.ceil(n / size)
    last = n - (q - 1) * size
    last_size = round_up(last, num_devices)
    if extra and last_size < size:
        return (last_size, size), (q - 1) * size + last_size
    return (size,), q * size


def plan_bucketing(
    lengths: Sequence[int] | np.ndarray,
    *,
    max_size: int,
    compile_budget: int = 16,
    max_batch_size: int = 64,
    max_padded_size: int | None = None,
    total: int | None = None,
    shape_cost: float = 0.0,
    num_devices: int = 1,
    axis: str = "L",
    **kwargs: Any,
) -> BucketingChoice:
    """Boundaries and batch sizes that minimise expected padded volume, batch rows included.

    For each number of buckets up to the budget, ``plan_boundaries`` places the boundaries,
    the ``total`` elements are spread over them as the sample's are, and shapes left in the
    budget go to the buckets whose last batch pads the most. The plan with the least
    ``padded volume + shape_cost * shapes`` wins. Counts are expectations: an input unlike
    the sample pads more, never fails.

    Example:
        >>> plan = plan_bucketing([3, 3, 4, 9, 9, 10], max_size=16, compile_budget=3)
        >>> plan.bucketing.boundaries["L"], plan.shapes, round(plan.padding_ratio, 3)
        ((4, 10, 16), 3, 1.105)

    Args:
        lengths: a sample of the ragged axis's lengths (e.g. token counts of 10,000 texts).
        max_size: the last boundary: longer elements are truncated or dead-lettered there.
        compile_budget: the most compiled shapes (buckets x their batch sizes).
        max_batch_size: the most rows in a batch.
        max_padded_size: the most rows x boundary in a batch (e.g. padded tokens).
        total: how many elements the job has; default the sample's size.
        shape_cost: the price of one more compiled shape, in padded volume (e.g. tokens the
            device embeds in the time one shape compiles).
        num_devices: batch sizes are multiples of this (batches shard over the devices).
        axis: the ragged axis's name in the ``Bucketing``.
        **kwargs: other ``Bucketing`` fields (``oversize``).

    Returns:
        The plan, with its ``Bucketing`` and its expected padding.

    Raises:
        SpecError: ``lengths`` is empty or not integral, or a limit is below 1.
    """
    check_positive_ints(
        compile_budget=compile_budget,
        max_batch_size=max_batch_size,
        num_devices=num_devices,
        max_size=max_size,
    )
    if max_padded_size is not None and max_padded_size < max_size:
        raise SpecError(
            f"max_padded_size={max_padded_size} is below max_size={max_size}: one element of "
            f"the largest bucket would exceed it. Raise max_padded_size to at least {max_size}, "
            "or lower max_size."
        )
    if shape_cost < 0:
        raise SpecError(f"shape_cost must be >= 0, got {shape_cost!r}.")
    sample = np.minimum(np.maximum(np.asarray(lengths), 1), max_size)
    total = len(sample) if total is None else int(total)
    if total < 1:
        raise SpecError(f"total must be a positive int, got {total!r}.")
    real = float(sample.sum()) * total / len(sample)
    best = None
    per_budget = boundaries_per_budget(sample, compile_budget, max_size=max_size)
    for k in range(1, compile_budget + 1):
        bounds = per_budget[k - 1]
        if len(bounds) < k and best is not None:
            break  # fewer distinct lengths than buckets: more buckets change nothing
        candidate = _plan_for(bounds, sample, total, compile_budget, shape_cost, num_devices,
                              max_batch_size, max_padded_size)  # fmt: skip
        if candidate is None:
            break  # one shape per bucket no longer fits the budget
        cost = candidate[0] + shape_cost * candidate[1]
        if best is None or cost < best[0]:
            best = (cost, bounds, *candidate)
    _, bounds, volume, shapes, sizes, counts = best
    bucketing = Bucketing(
        boundaries={axis: bounds},
        batch_size={(b,): s[-1] for b, s in zip(bounds, sizes, strict=True)},
        batch_sizes={(b,): s for b, s in zip(bounds, sizes, strict=True)},
        **kwargs,
    )
    return BucketingChoice(bucketing, shapes, volume / real, tuple(counts))


def _plan_for(bounds, sample, total, budget, shape_cost, num_devices, max_batch, max_padded):
    """``(padded volume, shapes, sizes per bucket, counts)`` for ``bounds``, or None."""
    if len(bounds) > budget:
        return None
    index = boundary_index(np.asarray(bounds), sample)
    share = np.bincount(index, minlength=len(bounds)) / len(sample)
    counts = [int(round(f * total)) for f in share]
    caps = [
        max_batch if max_padded is None else max(1, min(max_batch, max_padded // b)) for b in bounds
    ]
    sizes, rows = [], []
    for n, cap in zip(counts, caps, strict=True):
        s, r = _bucket_sizes(n, cap, num_devices, extra=False)
        sizes.append(s)
        rows.append(r)
    shapes = len(bounds)
    # Spend the rest of the budget where a second size saves the most padded volume.
    gains = []
    for i, (n, cap) in enumerate(zip(counts, caps, strict=True)):
        s, r = _bucket_sizes(n, cap, num_devices, extra=True)
        saved = (rows[i] - r) * bounds[i]
        if len(s) > 1 and saved > shape_cost:
            gains.append((saved, i, s, r))
    for _, i, s, r in sorted(gains, reverse=True)[: budget - shapes]:
        sizes[i], rows[i] = s, r
        shapes += 1
    volume = float(sum(r * b for r, b in zip(rows, bounds, strict=True)))
    return volume, shapes, sizes, counts
