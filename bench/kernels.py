"""The two benchmark kernels, per element, masked so padding never changes the answer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import beam_jax as bj

DIM = 64
HIDDEN = 256


def load_params(seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "wq": w(DIM, DIM),
        "wk": w(DIM, DIM),
        "wv": w(DIM, DIM),
        "wo": w(DIM, DIM),
        "w1": w(DIM, HIDDEN),
        "w2": w(HIDDEN, DIM),
        "proj": w(DIM, DIM),
    }


def _masked_mean(h, mask, length):
    total = jnp.sum(jnp.where(mask[:, None], h, 0.0), axis=0)
    return total / jnp.maximum(length, 1).astype(jnp.float32)


def heavy(params, element, lengths):
    """Masked single-head self-attention + MLP (64 -> 256 -> 64) + masked mean-pool."""
    x = element["x"]
    mask = bj.length_mask(lengths["L"], x.shape[0])
    q, k, v = x @ params["wq"], x @ params["wk"], x @ params["wv"]
    scores = (q @ k.T) / jnp.float32(np.sqrt(DIM))
    scores = jnp.where(mask[None, :], scores, jnp.float32(-1e9))
    h = x + jax.nn.softmax(scores, axis=-1) @ v @ params["wo"]
    h = h + jax.nn.gelu(h @ params["w1"]) @ params["w2"]
    return _masked_mean(h, mask, lengths["L"])


def light(params, element, lengths):
    """Masked mean-pool + one (64, 64) matmul."""
    x = element["x"]
    mask = bj.length_mask(lengths["L"], x.shape[0])
    return _masked_mean(x, mask, lengths["L"]) @ params["proj"]


KERNELS = {"heavy": heavy, "light": light}


def model_flops(kernel: str, lengths: np.ndarray) -> float:
    """Useful floating-point operations over records of these lengths (padding excluded).

    Matmuls count ``2 m n k``; the element-wise work (softmax, gelu, pooling) is left out
    for ``heavy``, where it is under 2% of the total. ``tests/test_bench.py`` checks these
    counts against XLA's own cost analysis of the unpadded kernel.
    """
    n = np.asarray(lengths, np.float64)
    if kernel == "heavy":
        # q, k, v, wo: 4 x (2 L 64 64); scores and attention: 2 x (2 L L 64); MLP: 2 x (2 L 64 256)
        return float(np.sum(8 * DIM * DIM * n + 4 * DIM * n * n + 4 * DIM * HIDDEN * n))
    if kernel == "light":
        return float(np.sum(DIM * n + 2 * DIM * DIM))  # the pooling adds and one matvec
    raise ValueError(f"unknown kernel {kernel!r}; expected one of {sorted(KERNELS)}")
