"""Kernels for ``beam-jax plan --kernel tests.cli_kernels:NAME`` in the CLI tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import beam_jax as bj

WIDTH = 32


def _attend(params, element, lengths):
    """Softmax self-attention of one ``float32[L, WIDTH]`` element: ``L x L`` scores, so a
    bucket's bytes grow quadratically with its length."""
    x = element["x"]
    mask = jnp.arange(x.shape[0]) < lengths["L"]
    scores = jnp.where(mask[None, :], x @ x.T / np.sqrt(WIDTH), -jnp.inf)
    return jax.nn.softmax(scores, axis=-1) @ x


def attention() -> dict:
    """The kernel dict ``--kernel`` takes: ``fn`` and ``spec`` (no parameters)."""
    return {"fn": _attend, "spec": {"x": bj.ArraySpec(("L", WIDTH), np.float32)}}


def word_counts():
    """A ``--tokenizer`` factory: each text's count of whitespace-separated words."""
    return lambda texts: [len(t.split()) for t in texts]
