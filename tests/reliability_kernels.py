"""Kernels that fail on purpose: importable, so worker processes can load them."""

from __future__ import annotations

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np

import beam_jax as bj

VOCAB = 50
D = 4
POISON = 99.0  # an element holding this value exhausts memory even alone
CRASH = 77.0  # an element holding this value kills its worker process (once per marker)


def embed_params():
    rng = np.random.default_rng(0)
    return {"table": rng.standard_normal((VOCAB, D)).astype(np.float32)}


def embed_mean(params, element, lengths):
    """Mean of the embeddings of the real token ids, plus the dense features' mean."""
    ids = element["ids"]
    mask = bj.length_mask(lengths["L"], ids.shape[0]).astype(jnp.float32)
    emb = params["table"][ids] * mask[:, None]
    dense = element["dense"]["x"]
    return {
        "embedding": emb.sum(0) / lengths["L"].astype(jnp.float32),
        "dense": dense.sum(0) * element["dense"]["scale"],
    }


def _simulate_memory(x):
    # The whole batch is visible here (single device): more than 4 rows "do not fit".
    if x.shape[0] > 4 or np.any(x == POISON):
        raise RuntimeError(
            f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate {x.nbytes * 10**6} "
            "bytes (simulated)."
        )
    return x


def memory_hungry(params, element, lengths):
    x = jax.pure_callback(
        _simulate_memory,
        jax.ShapeDtypeStruct(element["x"].shape, element["x"].dtype),
        element["x"],
        vmap_method="broadcast_all",
    )
    mask = bj.length_mask(lengths["L"], x.shape[0]).astype(jnp.float32)
    return jnp.sum(x * mask[:, None], axis=0)


def divide_by_value(params, element, lengths):
    """1 / sum: an element summing to zero yields Inf."""
    mask = bj.length_mask(lengths["L"], element["x"].shape[0]).astype(jnp.float32)
    return jnp.float32(1.0) / jnp.sum(element["x"] * mask[:, None])


class Crasher:
    """A kernel that SIGKILLs its worker process on CRASH, once per ``marker`` file."""

    def __init__(self, marker: str):
        self.marker = marker

    def _check(self, x):
        if np.any(x == CRASH) and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return x

    def __call__(self, params, element, lengths):
        x = jax.pure_callback(
            self._check,
            jax.ShapeDtypeStruct(element["x"].shape, element["x"].dtype),
            element["x"],
            vmap_method="broadcast_all",
        )
        mask = bj.length_mask(lengths["L"], x.shape[0]).astype(jnp.float32)
        return jnp.sum(x * mask[:, None], axis=0)
