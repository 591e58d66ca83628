"""The bucketing rule: which bucket an element of given lengths goes to, and the defaults.

Every path (one element, Arrow columns, boundary planning, the CLI) assigns buckets through
``boundary_index``/``bucket_index`` here, so they agree by construction.
"""

from __future__ import annotations

import math

import numpy as np

from beam_jax._src.errors import SpecError

Bucket = tuple[int, ...]


def default_boundaries(max_size: int, *, smallest: int = 16) -> tuple[int, ...]:
    """Powers of two from ``smallest`` up to ``max_size``, ending exactly at ``max_size``.

    This is the documented default when a ragged axis is given only its largest size.

    Examples:
        >>> default_boundaries(384)
        (16, 32, 64, 128, 256, 384)
    """
    if max_size < 1:
        raise SpecError(f"max_size must be >= 1, got {max_size}.")
    out = []
    b = smallest
    while b < max_size:
        out.append(b)
        b *= 2
    out.append(max_size)
    return tuple(out)


def default_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """Powers of two below ``max_batch``, then ``max_batch`` itself.

    Examples:
        >>> default_batch_sizes(48)
        (1, 2, 4, 8, 16, 32, 48)
    """
    out = []
    b = 1
    while b < max_batch:
        out.append(b)
        b *= 2
    out.append(max_batch)
    return tuple(out)


def boundary_index(boundaries: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per length, the index of the smallest boundary that fits it: the one bucketing rule.

    ``len(boundaries)`` where no boundary fits. Every path (one element, Arrow columns,
    boundary planning) assigns buckets through this function.

    Examples:
        >>> boundary_index(np.array([4, 8]), np.array([1, 4, 5, 9])).tolist()
        [0, 0, 1, 2]
    """
    return np.searchsorted(boundaries, lengths, side="left")


def bucket_index(boundaries: tuple[np.ndarray, ...], lengths: np.ndarray) -> np.ndarray:
    """Per row of ``lengths`` (``int[n, num_axes]``), its bucket's flat index.

    Buckets are numbered in ``itertools.product(*boundaries)`` order. Lengths must fit the
    largest boundary of every axis (validation guarantees it).
    """
    lengths = np.asarray(lengths)
    if not boundaries:
        return np.zeros(len(lengths), np.int64)
    index = [boundary_index(b, lengths[:, k]) for k, b in enumerate(boundaries)]
    return np.ravel_multi_index(index, [len(b) for b in boundaries])


def round_up(n: int, multiple: int) -> int:
    return int(math.ceil(n / multiple) * multiple)


def check_positive_ints(**values: object) -> None:
    """Raise ``SpecError`` naming the first of ``values`` that is not an int >= 1 (a numpy
    integer counts; a bool does not): the planners' shared check of their limits."""
    for name, value in values.items():
        if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
            raise SpecError(f"{name} must be a positive int, got {value!r}.")
