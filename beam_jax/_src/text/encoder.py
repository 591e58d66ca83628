"""The BERT-family layer stack and sentence pooling for one padded element, in pure JAX.

BERT, RoBERTa / XLM-RoBERTa and MPNet run through the one stack; where they differ
(positions, token types, MPNet's relative-position bias) is read from the ``BertConfig``.

Padding never changes the answer: padded keys get no attention and padded positions are
left out of the pooling, so an element gives the same vector whatever length it is padded to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from beam_jax._src.text import fused
from beam_jax._src.text.config import BertConfig
from beam_jax._src.text.params import Params

__all__ = [
    "MASK_VALUE",
    "POOLING",
    "PRECISION",
    "embed",
    "encode_tokens",
    "pool",
    "relative_position_buckets",
    "unit",
]

# Added to the attention logits of keys a query may not see: exp() of it underflows to
# exactly 0 in float32, yet it stays finite, so no inf - inf = nan can appear.
MASK_VALUE = -1e30
# Full float32 matmuls. XLA's CPU default already is, but on GPU/TPU the default may use
# bf16/tf32 passes, which would lose the cosine >= 0.9999 agreement with torch.
PRECISION = jax.lax.Precision.HIGHEST
POOLING = ("mean", "cls", "max")
"""The pooling modes: the mean of a text's token vectors, its first ([CLS]) token's vector,
or their elementwise maximum (sentence-transformers' ``pooling_mode_*_token(s)``)."""


def _dense(x: jax.Array, p: Mapping[str, jax.Array]) -> jax.Array:
    """``x @ w + b`` in the weights' dtype: float32, or bfloat16 inputs summed in float32
    (weights cast by ``matmuls.cast_dense``); the output is float32 either way."""
    w = p["w"]
    if w.dtype == jnp.bfloat16:
        product = jnp.matmul(x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
    else:
        product = jnp.matmul(x, w, precision=PRECISION)
    return product + p["b"][None, :]


def _layer_norm(x: jax.Array, p: Mapping[str, jax.Array], eps: float) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    normed = (x - mean) * jax.lax.rsqrt(var + jnp.float32(eps))
    return normed * p["scale"][None, :] + p["bias"][None, :]


def _activation(x: jax.Array, name: str) -> jax.Array:
    if name == "gelu":  # the exact erf form BERT uses
        return jnp.float32(0.5) * x * (jnp.float32(1) + jax.lax.erf(x * jnp.float32(2**-0.5)))
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        inner = jnp.float32(math.sqrt(2 / math.pi)) * (x + jnp.float32(0.044715) * x**3)
        return jnp.float32(0.5) * x * (jnp.float32(1) + jnp.tanh(inner))
    if name == "relu":
        return jnp.maximum(x, jnp.float32(0))
    if name in ("silu", "swish"):
        return x * jax.nn.sigmoid(x)
    raise ValueError(f"unknown hidden_act {name!r}")  # BertConfig refuses it first


# MPNet's relative-position buckets reach this distance (Hugging Face's max_distance).
_MAX_DISTANCE = 128


def relative_position_buckets(distances: np.ndarray, num_buckets: int = 32) -> np.ndarray:
    """MPNet's bucket of each relative position ``key - query`` (T5-style: exact up to a
    quarter of the buckets each way, then logarithmic up to 128), in numpy.

    Computed on the host in float32 as torch does (``log(n / max_exact) / log(max_distance
    / max_exact) * ...``, truncated), so a distance on a bucket's edge lands where it lands
    in Hugging Face's MPNet.

    Example:
        >>> relative_position_buckets(np.array([-200, -9, -1, 0, 1, 9, 200])).tolist()
        [15, 8, 1, 0, 17, 24, 31]
    """
    n = -np.asarray(distances, np.int64)
    half = num_buckets // 2
    out = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    exact = half // 2
    with np.errstate(divide="ignore"):
        scaled = np.log(n.astype(np.float32) / np.float32(exact)).astype(np.float32)
    scaled = scaled / np.float32(math.log(_MAX_DISTANCE / exact)) * np.float32(half - exact)
    large = exact + np.where(n < exact, 0, scaled).astype(np.int64)
    large = np.minimum(large, half - 1)
    return out + np.where(n < exact, n, large)


def _relative_bias(positions: jax.Array, table: jax.Array, config: BertConfig) -> jax.Array:
    """float32[H, L, L]: each head's learned bias for the bucket of ``key - query``.

    ``positions`` restart in every text of a packed row; within a text their differences
    are the row's, and across texts attention is masked anyway. Every difference in an
    L-long row lies in ``[-(L-1), L-1]``, so the buckets are a constant table over that
    range, made on the host at trace time."""
    length = positions.shape[0]
    buckets = relative_position_buckets(
        np.arange(-(length - 1), length), config.relative_attention_num_buckets
    )
    positions = positions.astype(jnp.int32)
    distance = positions[None, :] - positions[:, None] + (length - 1)  # [q, k], >= 0
    bucket = jnp.take(jnp.asarray(buckets, jnp.int32), distance, axis=0)
    return jnp.transpose(jnp.take(table, bucket, axis=0), (2, 0, 1))


def _attention(x: jax.Array, bias: jax.Array, p: Params, config: BertConfig) -> jax.Array:
    length = x.shape[0]
    heads, head_dim = config.num_attention_heads, config.head_dim

    def split(y: jax.Array) -> jax.Array:  # [L, H*D] -> [H, L, D]
        return jnp.transpose(jnp.reshape(y, (length, heads, head_dim)), (1, 0, 2))

    q, k, v = split(_dense(x, p["query"])), split(_dense(x, p["key"])), split(_dense(x, p["value"]))
    q = q * jnp.float32(head_dim**-0.5)
    # With bfloat16 dense layers, rows of 128 tokens or more also multiply the attention's
    # inputs in bfloat16 (sums in float32): on a TPU v5e, 2.1x faster at 256 tokens with a
    # cosine of 0.999998 to the float32 attention; at 64 tokens the float32 form ran faster
    # (0.9x), so short rows keep it.
    low = p["query"]["w"].dtype == jnp.bfloat16 and length >= fused.BFLOAT16_ATTENTION_FROM
    cast = (lambda y: y.astype(jnp.bfloat16)) if low else (lambda y: y)
    products = {"preferred_element_type": jnp.float32} if low else {"precision": PRECISION}
    logits = jnp.einsum("hqd,hkd->hqk", cast(q), cast(k), **products)
    logits = logits + (bias if bias.ndim == 3 else bias[None, :, :])
    probs = jax.nn.softmax(logits, axis=-1)
    context = jnp.einsum("hqk,hkd->hqd", cast(probs), cast(v), **products)
    context = jnp.reshape(jnp.transpose(context, (1, 0, 2)), (length, heads * head_dim))
    return _dense(context, p["attention_out"])


def encode_tokens(
    params: Params,
    input_ids: jax.Array,
    positions: jax.Array,
    attention_bias: jax.Array,
    config: BertConfig,
    kernel: str = "xla",
) -> jax.Array:
    """The BERT-family layer stack, shared by the padded and the packed forward pass.

    Which keys a token may attend to is all that differs between a padded element and a
    packed row, so both hand this one function their own ``attention_bias``.

    Args:
        params: The encoder's weights (``SentenceEncoder.load_params``).
        input_ids: int32[L], token ids.
        positions: int[L], each token's place in its text (0 for the first); the row of
            the position table is this plus ``config.position_offset``.
        attention_bias: float32[L, L] or [1, L], added to every head's attention logits
            (query by key): 0 where a query may attend to a key, ``MASK_VALUE`` where not.
        config: The encoder's shape.
        kernel: One of ``fused.LAYER_KERNELS``: ``"pallas"`` runs each layer as one Pallas
            kernel where ``fused.unsupported`` finds nothing against it, else as XLA's ops;
            ``"auto"``, as ``fused.resolve`` picks for this backend.

    Returns:
        float32[L, hidden_size], the last layer's token vectors.
    """
    emb = params["embeddings"]
    rows = positions.astype(jnp.int32) + jnp.int32(config.position_offset)
    x = jnp.take(emb["word"], input_ids.astype(jnp.int32), axis=0) + jnp.take(
        emb["position"], rows, axis=0
    )
    if config.token_types:
        x = x + emb["token_type"][0][None, :]
    x = _layer_norm(x, emb["norm"], config.layer_norm_eps)
    bias = attention_bias
    if config.relative_attention:  # one bias for every layer, as MPNet computes it
        relative = _relative_bias(positions, params["relative_attention_bias"], config)
        bias = relative + attention_bias[None, :, :]
    kernel = fused.resolve(kernel)
    for layer in params["layers"]:
        if kernel == "pallas" and not fused.unsupported(config, x.shape[0]):
            x = fused.layer(x, bias, layer, config)
            continue
        attended = _attention(x, bias, layer, config)
        x = _layer_norm(x + attended, layer["attention_norm"], config.layer_norm_eps)
        hidden = _activation(_dense(x, layer["intermediate"]), config.hidden_act)
        output = _dense(hidden, layer["output"])
        x = _layer_norm(x + output, layer["output_norm"], config.layer_norm_eps)
    return x


def unit(v: jax.Array) -> jax.Array:
    """``v`` scaled to unit L2 norm along its last axis (zeros stay zeros)."""
    norm = jnp.sqrt(jnp.sum(jnp.square(v), axis=-1, keepdims=True))
    return v / jnp.maximum(norm, jnp.float32(1e-12))


def pool(x: jax.Array, members: jax.Array, first: jax.Array, pooling: str) -> jax.Array:
    """Sentence vectors from token vectors, one per group of tokens.

    Args:
        x: float32[L, H], token vectors.
        members: float32[S, L], 1 where token l belongs to sentence s, else 0.
        first: float32[S, L], 1 on each sentence's first token ([CLS]), else 0.
        pooling: ``mean`` (over the sentence's tokens), ``cls`` (its first token) or
            ``max`` (elementwise, over its tokens).

    Returns:
        float32[S, H]; zeros for a sentence with no tokens.
    """
    if pooling == "cls":
        return jnp.matmul(first, x, precision=PRECISION)
    count = jnp.sum(members, axis=1)
    if pooling == "mean":
        # Clamped like sentence-transformers, so an empty sentence gives 0 and not nan.
        total = jnp.matmul(members, x, precision=PRECISION)
        return total / jnp.maximum(count, jnp.float32(1e-9))[:, None]
    if pooling == "max":
        inside = members[:, :, None] > 0
        best = jnp.max(jnp.where(inside, x[None, :, :], jnp.float32(-jnp.inf)), axis=1)
        return jnp.where(count[:, None] > 0, best, jnp.float32(0))
    raise ValueError(f"pooling must be one of {POOLING}, got {pooling!r}")


def embed(
    params: Params,
    input_ids: jax.Array,
    mask: jax.Array,
    config: BertConfig,
    pooling: str = "mean",
    normalize: bool = True,
    kernel: str = "xla",
) -> jax.Array:
    """Embeds one tokenized text: BERT, pooling over its real tokens, optional L2 norm.

    Args:
        params: The encoder's weights.
        input_ids: int32[L], token ids padded to L with any id; L at most the position table.
        mask: bool[L], True on real tokens, which come first.
        config: The encoder's shape.
        pooling: One of :data:`POOLING`.
        normalize: Scale the vector to unit length.
        kernel: ``"xla"`` or ``"pallas"`` (:func:`encode_tokens`).

    Returns:
        float32[hidden_size].

    Raises:
        ValueError: The shapes disagree, or L exceeds the position table.
    """
    if input_ids.ndim != 1 or mask.shape != input_ids.shape:
        raise ValueError(
            f"embed takes one element: input_ids [L] and mask [L], got shapes "
            f"{input_ids.shape} and {mask.shape}; use jax.vmap for a batch"
        )
    length = input_ids.shape[0]
    table = params["embeddings"]["position"].shape[0] - config.position_offset
    if length > table:
        raise ValueError(
            f"padded length {length} exceeds the {table} positions the model knows; "
            "truncate the texts (the encoder's max_length) or pad them less"
        )
    mask = mask.astype(jnp.bool_)
    key_bias = jnp.where(mask, jnp.float32(0), jnp.float32(MASK_VALUE))
    positions = jnp.arange(length, dtype=jnp.int32)
    x = encode_tokens(params, input_ids, positions, key_bias[None, :], config, kernel)
    members = mask.astype(jnp.float32)[None, :]
    first = ((positions == 0) & mask).astype(jnp.float32)[None, :]
    pooled = pool(x, members, first, pooling)[0]
    return unit(pooled) if normalize else pooled
