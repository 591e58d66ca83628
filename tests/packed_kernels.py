"""Packed kernels for the tests: importable, so Beam pickles them by reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

SENTINEL = 13.0  # a record holding this value makes the failing kernels raise at run time
POISON = 99.0  # a record holding this value "exhausts memory" even alone
TRACED: list[tuple[int, ...]] = []  # element shapes the batched kernel was traced with


def _one_hot(segments):
    m = segments.lengths.shape[-1]
    return segments.ids[:, None] == jnp.arange(1, m + 1)[None, :]  # [row_length, m]


def segment_sum(params, element, segments):
    """Per segment: the sum of ``x`` over its slots times its weight ``w``: ``[m, D]``."""
    x = element["x"]  # [row_length, D]
    sums = jnp.einsum("ld,lm->md", x, _one_hot(segments).astype(x.dtype))
    return {"sum": sums * element["w"][:, None], "length": segments.lengths}


def bucketed_sum(params, element, lengths):
    """The unpacked counterpart of ``segment_sum``."""
    x = element["x"]
    mask = (jnp.arange(x.shape[0]) < lengths["L"]).astype(x.dtype)
    return {"sum": (x * mask[:, None]).sum(0) * element["w"], "length": lengths["L"]}


def _refuse(x, ids):
    if np.any((x == SENTINEL) & (ids > 0)):
        raise ValueError(f"kernel refuses the value {SENTINEL}")
    return x


def failing_sum(params, element, segments):
    """Like ``segment_sum`` of a 1-D ``x``; raises when a real slot holds SENTINEL."""
    x = jax.pure_callback(
        _refuse,
        jax.ShapeDtypeStruct(element.shape, element.dtype),
        element,
        segments.ids,
        vmap_method="broadcast_all",
    )
    return x @ _one_hot(segments).astype(x.dtype)


def inverse_sum(params, element, segments):
    """1 / (sum per segment): a record summing to zero gives Inf, its neighbours do not."""
    sums = element @ _one_hot(segments).astype(element.dtype)
    valid = jnp.arange(sums.shape[0]) < segments.counts
    return jnp.where(valid, 1.0 / sums, 0.0)


def _memory(x, ids):
    # The whole batch is visible here (one device): more than 2 rows "do not fit".
    if x.shape[0] > 2 or np.any((x == POISON) & (ids > 0)):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory (simulated).")
    return x


def memory_hungry(params, element, segments):
    x = jax.pure_callback(
        _memory,
        jax.ShapeDtypeStruct(element.shape, element.dtype),
        element,
        segments.ids,
        vmap_method="broadcast_all",
    )
    return x @ _one_hot(segments).astype(x.dtype)


def traced_batched(params, element, segments):
    """A batched packed kernel that records the shapes it is traced with."""
    TRACED.append(tuple(element.shape))
    m = segments.lengths.shape[-1]
    onehot = segments.ids[:, :, None] == jnp.arange(1, m + 1)[None, None, :]
    return jnp.einsum("rl,rlm->rm", element, onehot.astype(element.dtype))


def _refuse_rows(x, ids):
    if np.any((x == SENTINEL).any(-1) & (ids > 0)):
        raise ValueError(f"kernel refuses the value {SENTINEL}")
    return x


def failing_vector_sum(params, element, segments):
    """Per segment, the sum of ``element["x"]`` (``[row_length, D]``) over its slots:
    ``{"sum": [m, D]}``; raises when a real slot holds SENTINEL."""
    x = jax.pure_callback(
        _refuse_rows,
        jax.ShapeDtypeStruct(element["x"].shape, element["x"].dtype),
        element["x"],
        segments.ids,
        vmap_method="broadcast_all",
    )
    return {"sum": jnp.einsum("ld,lm->md", x, _one_hot(segments).astype(x.dtype))}


def segment_attention(params, element, segments):
    """Softmax attention within each segment over negative L1 distances, summed per segment:
    an ``[n, n, D]`` intermediate (memory grows with the row length squared), no matmul."""
    x = element["x"]  # [row_length, D]
    same = (segments.ids[:, None] == segments.ids[None, :]) & (segments.ids[None, :] > 0)
    scores = -jnp.sum(jnp.abs(x[:, None, :] - x[None, :, :]), axis=-1)
    w = jax.nn.softmax(jnp.where(same, scores, jnp.float32(-1e9)), axis=-1)
    mixed = jnp.sum(w[:, :, None] * x[None, :, :], axis=1)
    sums = jnp.einsum("ld,lm->md", mixed, _one_hot(segments).astype(x.dtype))
    return sums * element["w"][:, None]  # [m, D]


def bucketed_attention(params, element, lengths):
    """The unpacked counterpart of ``segment_attention``."""
    x = element["x"]
    n = x.shape[0]
    real = jnp.arange(n) < lengths["L"]
    scores = -jnp.sum(jnp.abs(x[:, None, :] - x[None, :, :]), axis=-1)
    w = jax.nn.softmax(jnp.where(real[None, :], scores, jnp.float32(-1e9)), axis=-1)
    mixed = jnp.sum(w[:, :, None] * x[None, :, :], axis=1)
    return jnp.sum(jnp.where(real[:, None], mixed, 0.0), axis=0) * element["w"]


def mixing_sum(params, element, segments):
    """Per segment, the sum of its slots as ``row @ one_hot``: a row's Inf reaches every
    segment of that row (0 * Inf = NaN), the way a kernel that mixes a row's segments lets a
    bad record spoil its row-mates. ``element`` is the 1-D row, or ``{"x": row}``."""
    x = element["x"] if isinstance(element, dict) else element
    return x @ _one_hot(segments).astype(x.dtype)
