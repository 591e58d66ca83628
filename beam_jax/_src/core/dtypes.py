"""Input dtype rules that treat JAX's extra float types (bfloat16, float8) as floats.

numpy files ml_dtypes' floats under kind ``"V"`` (void), beside record arrays, so a rule
written with ``dtype.kind`` would refuse them; ``kind`` says ``"f"`` for them instead.

Example:
    >>> import ml_dtypes
    >>> kind(np.dtype(ml_dtypes.bfloat16)), can_cast(np.float32, ml_dtypes.bfloat16, "safe")
    ('f', False)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

_SAME_KIND_ORDER = "buifc"  # a cast may go right along it under numpy's "same_kind"


@functools.cache
def kind(dtype: Any) -> str:
    """``dtype.kind``, but ``"f"`` for JAX's float types."""
    dtype = np.dtype(dtype)
    if dtype.kind == "V" and jax.dtypes.issubdtype(dtype, np.floating):
        return "f"
    return dtype.kind


@functools.cache
def can_cast(got: Any, want: Any, casting: str) -> bool:
    """``np.can_cast`` between numeric dtypes (False if either is not one).

    Under ``"same_kind"`` a cast to or from a JAX float type goes by kind, as numpy's own
    floats do: ml_dtypes lets complex numbers become bfloat16 (dropping the imaginary part)
    and refuses bfloat16 to float16.
    """
    got, want = np.dtype(got), np.dtype(want)
    g, w = kind(got), kind(want)
    if g not in _SAME_KIND_ORDER or w not in _SAME_KIND_ORDER:
        return False
    if casting == "same_kind" and "V" in (got.kind, want.kind):
        return _SAME_KIND_ORDER.index(g) <= _SAME_KIND_ORDER.index(w)
    return bool(np.can_cast(got, want, casting=casting))
