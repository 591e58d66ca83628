"""The dtype of the encoder's dense matmuls: float32, or bfloat16 inputs with float32 sums.

Where a device multiplies bfloat16 much faster than float32 (Intel AMX, GPU tensor cores,
TPUs), the dense layers' weights and inputs can be rounded to bfloat16 and multiplied with
float32 accumulation, as TPUs do for float32 matmuls by default. Everything else (the
attention scores, softmax, layer norms, residuals, pooling) stays float32. On
all-MiniLM-L6-v2 the embeddings keep a cosine of at least 0.99997 with sentence-transformers'
float32 ones (the reference corpora, ``tests/test_text_model.py``).

``"auto"`` measures both on the process's default device once and takes bfloat16 only where
it runs the model's dense shapes at least :data:`AUTO_SPEEDUP` times as fast; elsewhere (a
CPU without AMX, where XLA's bfloat16 is slower) it stays float32.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import numpy as np

__all__ = ["AUTO_SPEEDUP", "MATMULS", "bfloat16_speedup", "cast_dense", "resolve"]

MATMULS = ("float32", "bfloat16", "auto")
"""The choices: exact float32; bfloat16 inputs with float32 sums; whichever is faster here
(bfloat16 only when :func:`bfloat16_speedup` is at least :data:`AUTO_SPEEDUP`)."""
AUTO_SPEEDUP = 1.5
_DENSE = ("query", "key", "value", "attention_out", "intermediate", "output")
_log = logging.getLogger(__name__)


def resolve(matmuls: str, shape: tuple[int, int, int] = (1024, 384, 1536)) -> str:
    """``"float32"`` or ``"bfloat16"``: ``matmuls`` itself, or for ``"auto"`` the faster on
    this process's default device for an ``m x k`` by ``k x n`` matmul (measured once per
    process and shape)."""
    if matmuls not in MATMULS:
        raise ValueError(f"matmuls must be one of {MATMULS}, got {matmuls!r}")
    if matmuls != "auto":
        return matmuls
    speedup = bfloat16_speedup(shape)
    chosen = "bfloat16" if speedup >= AUTO_SPEEDUP else "float32"
    _log.info("matmuls='auto': bfloat16 runs %.2fx float32 here; using %s", speedup, chosen)
    return chosen


@functools.cache
def bfloat16_speedup(shape: tuple[int, int, int] = (1024, 384, 1536)) -> float:
    """How many times faster the default device multiplies ``m x k`` by ``k x n`` with
    bfloat16 inputs and float32 sums than in float32 (best of a few alternated runs)."""
    import jax
    import jax.numpy as jnp

    m, k, n = shape
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((k, n), dtype=np.float32))
    exact = jax.jit(lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST))
    fast = jax.jit(
        lambda a, b: jnp.matmul(
            a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32
        )
    )
    wb = w.astype(jnp.bfloat16)
    best = {exact: float("inf"), fast: float("inf")}
    for fn, weights in ((exact, w), (fast, wb)):
        fn(x, weights).block_until_ready()  # compile and first touch
    for _ in range(5):
        for fn, weights in ((exact, w), (fast, wb)):
            start = time.perf_counter()
            for _ in range(3):
                out = fn(x, weights)
            out.block_until_ready()
            best[fn] = min(best[fn], time.perf_counter() - start)
    return best[exact] / best[fast]


def cast_dense(params: dict[str, Any], matmuls: str) -> dict[str, Any]:
    """``params`` with every dense layer's weight matrix in bfloat16 when ``matmuls`` is
    ``"bfloat16"`` (the encoder multiplies in the weights' dtype); unchanged for float32."""
    if matmuls == "float32":
        return params
    if matmuls != "bfloat16":
        raise ValueError(f"cast_dense takes 'float32' or 'bfloat16', got {matmuls!r}")
    import ml_dtypes

    def layer(p: dict[str, Any]) -> dict[str, Any]:
        return {
            name: dict(value, w=np.asarray(value["w"]).astype(ml_dtypes.bfloat16))
            if name in _DENSE
            else value
            for name, value in p.items()
        }

    return dict(params, layers=[layer(p) for p in params["layers"]])
