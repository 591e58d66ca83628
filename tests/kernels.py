"""Kernels and loaders shared by the tests; a module so worker processes can import them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import beam_jax as bj

D = 8
SENTINEL = 13.0  # an input holding this value makes `failing_mean` raise at run time


def attention_params(seed: int = 0, d: int = D) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    return {"q": w(d, d), "k": w(d, d), "v": w(d, d), "o": w(d, d)}


def masked_attention_pool(params, element, lengths):
    """Self-attention over the real positions, then a masked mean-pool: float32[D]."""
    x = element["x"]
    mask = bj.length_mask(lengths["L"], x.shape[0])
    q, k, v = x @ params["q"], x @ params["k"], x @ params["v"]
    scores = (q @ k.T) / jnp.sqrt(jnp.float32(x.shape[1]))
    scores = jnp.where(mask[None, :], scores, jnp.float32(-1e30))
    h = jax.nn.softmax(scores, axis=-1) @ v @ params["o"]
    w = mask.astype(jnp.float32)[:, None]
    return jnp.sum(h * w, axis=0) / jnp.maximum(jnp.sum(w), jnp.float32(1))


def reference_attention_pool(params, x: np.ndarray) -> np.ndarray:
    """The same computation for one unpadded element, in float64 numpy."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    x = x.astype(np.float64)
    q, k, v = x @ p["q"], x @ p["k"], x @ p["v"]
    s = q @ k.T / np.sqrt(x.shape[1])
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    return (s @ v @ p["o"]).mean(axis=0)


def _check(x):
    if np.any(x == SENTINEL):
        raise ValueError(f"kernel refuses the value {SENTINEL}")
    return x


def failing_mean(params, element, lengths):
    """Masked mean times ``params``; raises at run time if the element holds SENTINEL."""
    x = jax.pure_callback(
        _check,
        jax.ShapeDtypeStruct(element["x"].shape, element["x"].dtype),
        element["x"],
        vmap_method="broadcast_all",
    )
    mask = bj.length_mask(lengths["L"], x.shape[0]).astype(jnp.float32)
    return {
        "mean": jnp.sum(x * mask[:, None], axis=0) / lengths["L"].astype(jnp.float32) * params,
        "scaled": x * params,
    }


def failing_sum(params, element, lengths):
    """The masked sum of ``x`` (``[L]``); raises at run time if the element holds SENTINEL."""
    x = jax.pure_callback(
        _check, jax.ShapeDtypeStruct(element["x"].shape, element["x"].dtype), element["x"],
        vmap_method="broadcast_all",
    )  # fmt: skip
    return jnp.where(bj.length_mask(lengths["L"], x.shape[0]), x, 0.0).sum()


def image_stats(params, element, lengths):
    """Two ragged axes: per-channel mean over the real H x W pixels, and the scaled image."""
    img = element["image"]
    mh = bj.length_mask(lengths["H"], img.shape[0])
    mw = bj.length_mask(lengths["W"], img.shape[1])
    m = (mh[:, None] & mw[None, :]).astype(jnp.float32)
    area = (lengths["H"] * lengths["W"]).astype(jnp.float32)
    mean = jnp.sum(img * m[:, :, None], axis=(0, 1)) / area
    return {"mean": mean + element["bias"], "scaled": img * params}


def regression_params(d: int = D) -> dict[str, np.ndarray]:
    return {"w": np.linspace(-1, 1, d, dtype=np.float32)}


def squared_error_grad(params, element, lengths):
    """Gradient of the squared error over the real positions of one ragged sequence."""

    def loss(p):
        mask = bj.length_mask(lengths["L"], element["x"].shape[0]).astype(jnp.float32)
        err = element["x"] @ p["w"] - element["y"]
        return jnp.sum(mask * err * err)

    return {"grad": jax.grad(loss)(params), "loss": loss(params)}
