"""Index arithmetic over ragged runs (pure numpy), shared by every layer."""

from __future__ import annotations

import numpy as np

__all__ = ["ragged_index"]


def ragged_index(steps: np.ndarray, base: np.ndarray) -> np.ndarray:
    """``base[i] + t`` for every row ``i`` and ``t < steps[i]``, concatenated.

    Example:
        >>> ragged_index(np.array([2, 0, 3]), np.array([10, 5, 20])).tolist()
        [10, 11, 20, 21, 22]
    """
    total = int(steps.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    begin = np.cumsum(steps) - steps
    # base[i] + t = (base[i] - begin[i]) + (begin[i] + t): a shift per row, plus a count.
    out = np.repeat(np.asarray(base, np.int64) - begin, steps)
    out += np.arange(total, dtype=np.int64)
    return out
