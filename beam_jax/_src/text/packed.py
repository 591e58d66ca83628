"""Several texts packed in one row, each embedded as if it were alone (Krell et al. 2021).

Attention is block-diagonal (a token sees only its own text's tokens), positions restart at
0 in every text, and each text is pooled over its own tokens, so a text's vector does not
depend on what else shares its row: the packed form equals the padded one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from beam_jax._src.text.config import BertConfig
from beam_jax._src.text.encoder import MASK_VALUE, encode_tokens, pool, unit
from beam_jax._src.text.params import Params

__all__ = ["embed_packed", "segment_attention_bias"]


def segment_attention_bias(segment_ids: jax.Array) -> jax.Array:
    """float32[L, L]: 0 where query and key are in the same segment, else masked.

    Empty slots (segment 0) are seen by no one.

    Example:
        >>> (segment_attention_bias(jnp.array([1, 1, 2, 0])) == 0).astype(int).tolist()
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    """
    same = (segment_ids[:, None] == segment_ids[None, :]) & (segment_ids[None, :] > 0)
    return jnp.where(same, jnp.float32(0), jnp.float32(MASK_VALUE))


def embed_packed(
    params: Params,
    input_ids: jax.Array,
    segment_ids: jax.Array,
    positions: jax.Array,
    num_segments: int,
    config: BertConfig,
    pooling: str = "mean",
    normalize: bool = True,
    kernel: str = "xla",
) -> jax.Array:
    """Embeds every text packed in one row: the vectors the padded form gives each alone.

    Args:
        params: The encoder's weights.
        input_ids: int32[L], the row's token ids (any id on empty slots).
        segment_ids: int[L], each slot's text, 1..num_segments; 0 on empty slots.
        positions: int[L], each slot's position within its text.
        num_segments: The most texts in a row: the number of vectors returned.
        config: The encoder's shape.
        pooling: ``mean``, ``cls`` or ``max``, per text.
        normalize: Scale each vector to unit length.
        kernel: ``"xla"`` or ``"pallas"`` (``encoder.encode_tokens``).

    Returns:
        float32[num_segments, hidden_size]; zeros for segments with no tokens.

    Raises:
        ValueError: The shapes disagree.
    """
    if input_ids.ndim != 1 or not input_ids.shape == segment_ids.shape == positions.shape:
        raise ValueError(
            f"embed_packed takes one row: input_ids, segment_ids and positions all [L], got "
            f"shapes {input_ids.shape}, {segment_ids.shape} and {positions.shape}; use "
            "jax.vmap for a batch of rows"
        )
    segment_ids = segment_ids.astype(jnp.int32)
    bias = segment_attention_bias(segment_ids)
    x = encode_tokens(params, input_ids, positions, bias, config, kernel)
    which = jnp.arange(1, num_segments + 1, dtype=jnp.int32)
    member = which[:, None] == segment_ids[None, :]  # [S, L]
    first = member & (positions.astype(jnp.int32) == 0)[None, :]
    pooled = pool(x, member.astype(jnp.float32), first.astype(jnp.float32), pooling)
    return unit(pooled) if normalize else pooled
