"""all-MiniLM-L6-v2 for the flagship's modules, in the names they use: a thin layer over
:mod:`beam_jax.text`, where the encoder, tokenizer and manifest check live.

New code should use ``beam_jax.text.SentenceEncoder`` directly.

Example:
    >>> import jax.numpy as jnp
    >>> params, tokenizer = load_params(), Tokenizer()
    >>> ids = tokenizer.encode("A cat sat on the mat.")
    >>> vector = embed(params, jnp.asarray(ids), jnp.ones(ids.shape, bool))
    >>> vector.shape
    (384,)
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax

from beam_jax import text
from beam_jax.text import ModelFileMismatchError, file_sha256, segment_attention_bias

__all__ = [
    "MANIFEST",
    "MiniLMConfig",
    "ModelFileMismatchError",
    "Tokenizer",
    "embed",
    "embed_element",
    "embed_packed",
    "embed_packed_element",
    "encode_tokens",
    "file_sha256",
    "load_config",
    "load_params",
    "model_dir",
    "segment_attention_bias",
    "verify_model_dir",
]

MANIFEST = text.MINILM_MANIFEST
model_dir = text.packaged_model_dir
Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class MiniLMConfig(text.BertConfig):
    """A :class:`beam_jax.text.BertConfig` with sentence-transformers' ``max_seq_length``."""

    max_seq_length: int = 256


_MINILM = text.SentenceEncoder(path=None, config=text.BertConfig())
embed_element = _MINILM.element_fn
embed_packed_element = _MINILM.packed_fn


def verify_model_dir(
    path: str | pathlib.Path | None = None, manifest: str | pathlib.Path = MANIFEST
) -> None:
    """``beam_jax.text.verify_model_dir``, against all-MiniLM-L6-v2's manifest by default."""
    text.verify_model_dir(path, manifest)


def load_config(path: str | pathlib.Path | None = None) -> MiniLMConfig:
    """The encoder's shape and ``max_seq_length`` read from a model directory."""
    model = text.read_model_dir(path if path is not None else model_dir())
    fields = dataclasses.asdict(model.config)
    return MiniLMConfig(**fields, max_seq_length=model.max_length)


def load_params(
    path: str | pathlib.Path | None = None, *, manifest: str | pathlib.Path | None = MANIFEST
) -> Params:
    """The weights of the model directory (default: the package), checked against
    ``manifest`` first (``None`` skips the check)."""
    path = pathlib.Path(path) if path is not None else model_dir()
    if manifest is not None:
        text.verify_model_dir(path, manifest)
    model = text.read_model_dir(path)
    return text.read_weights(model.transformer / "model.safetensors", model.config)


def Tokenizer(  # noqa: N802 - the class name its callers use
    path: str | pathlib.Path | None = None, *, max_length: int | None = None
) -> text.Tokenizer:
    """The model directory's tokenizer (default: the package's), truncating at
    ``max_length`` tokens (default: the model's ``max_seq_length``)."""
    model = text.read_model_dir(path if path is not None else model_dir())
    return text.Tokenizer(
        model.transformer / "tokenizer.json",
        max_length=model.max_length if max_length is None else max_length,
        lowercase=model.lowercase,
    )


def encode_tokens(
    params: Params,
    input_ids: jax.Array,
    positions: jax.Array,
    attention_bias: jax.Array,
    config: text.BertConfig | None = None,
) -> jax.Array:
    """``beam_jax.text.encode_tokens`` with all-MiniLM-L6-v2's shape by default."""
    return text.encode_tokens(
        params, input_ids, positions, attention_bias, config or text.BertConfig()
    )


def embed(
    params: Params, input_ids: jax.Array, mask: jax.Array, config: text.BertConfig | None = None
) -> jax.Array:
    """One padded text's unit vector: mean pooling and L2 norm, as all-MiniLM-L6-v2."""
    return text.embed(params, input_ids, mask, config or text.BertConfig())


def embed_packed(
    params: Params,
    input_ids: jax.Array,
    segment_ids: jax.Array,
    positions: jax.Array,
    num_segments: int,
    config: text.BertConfig | None = None,
) -> jax.Array:
    """Every packed text's unit vector, as :func:`embed` gives each alone."""
    return text.embed_packed(
        params, input_ids, segment_ids, positions, num_segments, config or text.BertConfig()
    )
