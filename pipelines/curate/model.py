"""The curation job's classifier, its kernels and its optimizer (pure JAX and numpy).

Hashed word-piece embeddings, a masked mean, a linear layer (docs/curate.md, "The model").

Example:
    >>> params = init_params(ModelConfig(num_classes=3, hash_bits=4, dim=2), seed=0)
    >>> tokens = np.array([7, 7, 9, 0], np.int32)  # 3 real tokens, 1 padding
    >>> float(example_loss(params, tokens, np.int32(3), np.int32(1))) > 0
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import beam_jax as bj

# Knuth's multiplicative hash: the top bits of id * 2654435761 (mod 2**32).
_HASH_MULTIPLIER = 2654435761


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Output classes (>= 2), ``2**hash_bits`` embedding rows (1 to 24), width, init scale."""

    num_classes: int
    hash_bits: int = 10
    dim: int = 32
    init_scale: float = 0.1

    def __post_init__(self):
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {self.num_classes}.")
        if not 1 <= self.hash_bits <= 24:
            raise ValueError(f"hash_bits must be within [1, 24], got {self.hash_bits}.")
        if self.dim < 1:
            raise ValueError(f"dim must be positive, got {self.dim}.")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {self.init_scale}.")


def init_params(config: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Seeded random float32 parameters: ``embed [2**hash_bits, dim]``, ``w``, ``b``."""
    rng = np.random.default_rng(seed)
    s = config.init_scale
    return {
        "embed": (rng.standard_normal((1 << config.hash_bits, config.dim)) * s).astype(np.float32),
        "w": (rng.standard_normal((config.dim, config.num_classes)) * s).astype(np.float32),
        "b": np.zeros(config.num_classes, np.float32),
    }


def hash_tokens(tokens: jax.Array, table_rows: int) -> jax.Array:
    """Row of the embedding table for each token id (``table_rows`` a power of two)."""
    bits = table_rows.bit_length() - 1
    if 1 << bits != table_rows:
        raise ValueError(f"the embedding table needs a power-of-two row count, got {table_rows}.")
    hashed = tokens.astype(jnp.uint32) * jnp.uint32(_HASH_MULTIPLIER)
    return (hashed >> jnp.uint32(32 - bits)).astype(jnp.int32)


def example_logits(params: Any, tokens: jax.Array, length: jax.Array) -> jax.Array:
    """Logits of one record: ``tokens`` int32[L_padded] of which the first ``length`` are real."""
    embed = jnp.asarray(params["embed"])
    rows = embed[hash_tokens(tokens, embed.shape[0])]
    mask = bj.length_mask(length, tokens.shape[0]).astype(embed.dtype)
    # max(., 1): a padded batch row has length 0; its (unused) output stays finite.
    mean = (mask @ rows) / jnp.maximum(length, 1).astype(embed.dtype)
    return mean @ params["w"] + params["b"]


def example_loss(params: Any, tokens: jax.Array, length: jax.Array, label: jax.Array) -> jax.Array:
    """Cross-entropy of one record against its (observed) label."""
    return -jax.nn.log_softmax(example_logits(params, tokens, length))[label]


def gradient_kernel(params: Any, element: dict, lengths: dict) -> dict:
    """One record's loss gradient, loss and correctness; ``ReduceKernel`` sums them (a
    batch of ``B`` builds ``B`` full gradients first: why the default table is small)."""
    tokens, label = element["tokens"], element["label"]

    def loss_and_logits(p):
        logits = example_logits(p, tokens, lengths["L"])
        return -jax.nn.log_softmax(logits)[label], logits

    (loss, logits), grad = jax.value_and_grad(loss_and_logits, has_aux=True)(params)
    correct = (jnp.argmax(logits) == label).astype(jnp.float32)
    return {"grad": grad, "loss": loss, "correct": correct}


def score_kernel(params: Any, element: dict, lengths: dict) -> dict:
    """Per row of a padded batch: ``grand`` (the norm of the record's loss gradient, by
    ``vmap(grad(...))``), ``el2n`` (the norm of ``softmax - one_hot``), ``loss``, ``predicted``."""
    tokens, label, length = element["tokens"], element["label"], lengths["L"]
    grads = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0, 0))(params, tokens, length, label)
    squares = [jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in jax.tree.leaves(grads)]
    logits = jax.vmap(example_logits, in_axes=(None, 0, 0))(params, tokens, length)
    logp = jax.nn.log_softmax(logits)
    one_hot = jax.nn.one_hot(label, logits.shape[-1], dtype=logits.dtype)
    return {
        "grand": jnp.sqrt(sum(squares)),
        "el2n": jnp.linalg.norm(jnp.exp(logp) - one_hot, axis=-1),
        "loss": -jnp.sum(logp * one_hot, axis=-1),
        "predicted": jnp.argmax(logits, axis=-1).astype(jnp.int32),
    }


@dataclasses.dataclass(frozen=True)
class Adam:
    """Adam (Kingma and Ba, 2015) on the driver, one step per full-batch gradient (why Adam:
    docs/curate.md).

    Example:
        >>> opt = Adam(learning_rate=0.1)
        >>> state = opt.init({"w": np.zeros(2, np.float32)})
        >>> params, state = opt.update({"w": np.ones(2)}, state, {"w": np.zeros(2, np.float32)})
        >>> [round(float(x), 3) for x in params["w"]]
        [-0.1, -0.1]
    """

    learning_rate: float = 0.05
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}.")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            raise ValueError(f"b1 and b2 must be within [0, 1), got {self.b1}, {self.b2}.")

    def init(self, params: dict) -> dict:
        """The optimizer's state: step count and two float64 moments per parameter."""
        zeros = {k: np.zeros(np.shape(v), np.float64) for k, v in params.items()}
        return {"step": 0, "m": zeros, "v": {k: z.copy() for k, z in zeros.items()}}

    def update(self, grad: dict, state: dict, params: dict) -> tuple[dict, dict]:
        """One step: returns the new float32 parameters and state."""
        t = state["step"] + 1
        m = {k: self.b1 * state["m"][k] + (1 - self.b1) * np.asarray(g) for k, g in grad.items()}
        v = {k: self.b2 * state["v"][k] + (1 - self.b2) * np.square(g) for k, g in grad.items()}
        new = {}
        for k, p in params.items():
            step = self.learning_rate * (m[k] / (1 - self.b1**t))
            step = step / (np.sqrt(v[k] / (1 - self.b2**t)) + self.eps)
            new[k] = (np.asarray(p, np.float64) - step).astype(np.float32)
        return new, {"step": t, "m": m, "v": v}
