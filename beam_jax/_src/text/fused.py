"""One encoder layer as one Pallas kernel: a row's activations stay in on-chip memory (a
TPU's VMEM) from the query, key and value projection to the layer's last norm.

XLA fuses at most one matmul per fusion, so the per-layer path (``encoder.py``) writes every
matmul's output to memory and reads it back; at MiniLM's widths that traffic, not the
matrix units, bounds a layer. Here a layer reads its input rows and weights once and writes
its output once. Under ``jax.vmap`` (how the engine runs a row's kernel over a batch) the
rows run in blocks of up to 1,024 tokens, one program each: every dense matmul takes the
whole block, attention runs row by row within it.

Attention runs ``128 // head_dim`` heads in one 128-lane pass: the query is repeated once
per head with every other head's lanes zeroed and the copies stacked along rows, so one
``[heads·L, 128] x [128, L]`` product gives each head's scores in its own rows, softmax runs
along lanes, and one product with the values puts each head's context in its own lanes.
A 32-wide head thus fills the matrix unit as a 128-wide one would, where JAX's flash and
splash attention kernels fill a quarter of each 128-lane block.

Where the layer is not one this kernel takes (:func:`unsupported`), the caller keeps the
per-layer path. On devices other than a TPU the kernel runs in Pallas's interpreter: the
same arithmetic, far slower, for tests.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from beam_jax._src.text.config import BertConfig

__all__ = ["LAYER_KERNELS", "layer", "resolve", "unsupported"]

LAYER_KERNELS = ("auto", "xla", "pallas")
"""How the encoder's layers run: ``xla``, each as XLA's ops (every device); ``pallas``, each as
one Pallas kernel (:func:`layer`) where :func:`unsupported` finds nothing against it;
``auto``, ``pallas`` on a TPU and ``xla`` elsewhere (:func:`resolve`)."""

BFLOAT16_ATTENTION_FROM = 128
"""Rows at least this long multiply attention in bfloat16 when the dense layers do (both
paths); shorter rows keep it in float32."""
_LANES = 128
_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu")
_HIGHEST = jax.lax.Precision.HIGHEST
_BLOCK_TOKENS = 1024  # a program's rows, end to end


def _platform() -> str:
    """Where a program traced now runs: ``jax.default_device``'s platform where one is set
    (``with jax.default_device(cpu)`` on a TPU host), else JAX's default backend."""
    device = jax.config.jax_default_device
    if device is None:
        return jax.default_backend()
    return device if isinstance(device, str) else device.platform


def resolve(kernel: str) -> str:
    """``kernel`` with ``auto`` resolved for the platform a program traced now runs on:
    ``pallas`` on a TPU (faster there than XLA's layers: bench/RESULTS.md), ``xla`` elsewhere
    (a CPU would run the kernel in Pallas's interpreter)."""
    if kernel != "auto":
        return kernel
    return "pallas" if _platform() == "tpu" else "xla"


def unsupported(config: BertConfig, length: int) -> str | None:
    """Why a layer of ``config`` over rows of ``length`` cannot run as one kernel, or None.

    The kernel takes a hidden size and rows that are whole numbers of 128-lane groups (the
    packed rows and the longer buckets on a TPU), heads that divide 128 lanes, and the
    activations it implements. It is written for a TPU; a CPU runs it in Pallas's
    interpreter (for tests), and other backends (GPUs) keep XLA's layers.
    """
    backend = _platform()
    if backend not in ("tpu", "cpu"):
        return f"the {backend} backend (the kernel is written for a TPU)"
    if config.hidden_size % _LANES or _LANES % config.head_dim:
        return f"hidden size {config.hidden_size}, head size {config.head_dim}"
    if length % _LANES:
        return f"rows of {length} tokens (a multiple of {_LANES} is needed)"
    if config.hidden_act not in _ACTIVATIONS:
        return f"activation {config.hidden_act!r}"
    return None


def _erf(x: jax.Array) -> jax.Array:
    """erf from ``exp`` alone (Abramowitz and Stegun 7.1.26, absolute error <= 1.5e-7)."""
    a = jnp.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = (
        (((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592
    ) * t
    y = 1.0 - poly * jnp.exp(-a * a)
    return jnp.where(x < 0, -y, y)


def _activate(h: jax.Array, name: str) -> jax.Array:
    if name == "gelu":
        return 0.5 * h * (1.0 + _erf(h * (2**-0.5)))
    if name == "relu":
        return jnp.maximum(h, 0.0)
    return 0.5 * h * (1.0 + jnp.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h * h * h)))


def _norm(y: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    mean = jnp.mean(y, axis=-1, keepdims=True)
    centred = y - mean
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return centred * jax.lax.rsqrt(var + eps) * scale + bias


def _dot(a: jax.Array, w: jax.Array) -> jax.Array:
    """``a @ w`` as ``encoder._dense`` multiplies: in the weights' dtype, sums in float32."""
    if w.dtype == jnp.bfloat16:
        return jnp.dot(a.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
    return jnp.dot(a, w, preferred_element_type=jnp.float32, precision=_HIGHEST)


def _kernel(x_ref, bias_ref, *refs, config: BertConfig, length: int):
    wqkv, bqkv, wo, bo, g1, be1, w1, b1, w2, b2, g2, be2, out_ref, qkv_ref, ctx_ref = refs
    tokens, hidden = x_ref.shape
    head_dim = config.head_dim
    per_pass = _LANES // head_dim  # heads in one 128-lane group
    # The block's rows end to end: every dense matmul takes them all at once.
    qkv_ref[...] = _dot(x_ref[...], wqkv[...]) + bqkv[...]
    # As encoder._attention: bfloat16 inputs from BFLOAT16_ATTENTION_FROM tokens, else float32.
    low = wqkv.dtype == jnp.bfloat16 and length >= BFLOAT16_ATTENTION_FROM
    dtype = jnp.bfloat16 if low else jnp.float32
    exact = {"preferred_element_type": jnp.float32} | ({} if low else {"precision": _HIGHEST})
    lane = jax.lax.broadcasted_iota(jnp.int32, (length, _LANES), 1)
    head_of_lane = lane >> (head_dim.bit_length() - 1)  # head_dim divides 128: a power of 2

    def attend(r, carry):  # attention within row r of the block
        span = pl.ds(pl.multiple_of(r * length, length), length)
        bias = bias_ref[r]  # [L, L] for every head, or [heads·L, L]
        if bias.shape[0] == length:
            bias = jnp.concatenate([bias] * per_pass, axis=0)
        for g in range(hidden // _LANES):
            lanes = [pl.ds(part * hidden + g * _LANES, _LANES) for part in range(3)]
            q = qkv_ref[span, lanes[0]] * (head_dim**-0.5)
            k, v = (qkv_ref[span, lanes[i]].astype(dtype) for i in (1, 2))
            stacked = jnp.concatenate(
                [jnp.where(head_of_lane == j, q, 0.0) for j in range(per_pass)], axis=0
            ).astype(dtype)  # [heads·L, 128]: head j's query in its lanes, zeros elsewhere
            scores = jax.lax.dot_general(stacked, k, (((1,), (1,)), ((), ())), **exact)
            if bias.shape[0] > per_pass * length:  # each head its own bias
                scores = scores + bias[g * per_pass * length : (g + 1) * per_pass * length]
            else:
                scores = scores + bias
            scores = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
            total = jnp.sum(scores, axis=-1, keepdims=True)
            # [heads·L, 128]: head j's context in its lanes of its rows.
            context = jnp.dot(scores.astype(dtype), v, **exact) * (1.0 / total)
            merged = context[:length]
            for j in range(1, per_pass):
                merged = jnp.where(
                    head_of_lane == j, context[j * length : (j + 1) * length], merged
                )
            ctx_ref[span, lanes[0]] = merged
        return carry

    jax.lax.fori_loop(0, tokens // length, attend, 0)
    eps = config.layer_norm_eps
    x = _norm(x_ref[...] + _dot(ctx_ref[...], wo[...]) + bo[...], g1[...], be1[...], eps)
    h = _activate(_dot(x, w1[...]) + b1[...], config.hidden_act)
    out_ref[...] = _norm(x + _dot(h, w2[...]) + b2[...], g2[...], be2[...], eps)


def _weights(p: Mapping) -> list[jax.Array]:
    """The layer's weights as the kernel takes them: Q, K and V as one matrix, vectors as
    ``[1, n]`` rows."""

    def row(v):
        return jnp.reshape(v, (1, -1))

    dense = [p[name] for name in ("query", "key", "value")]
    return [
        jnp.concatenate([d["w"] for d in dense], axis=1),
        row(jnp.concatenate([d["b"] for d in dense])),
        p["attention_out"]["w"],
        row(p["attention_out"]["b"]),
        row(p["attention_norm"]["scale"]),
        row(p["attention_norm"]["bias"]),
        p["intermediate"]["w"],
        row(p["intermediate"]["b"]),
        p["output"]["w"],
        row(p["output"]["b"]),
        row(p["output_norm"]["scale"]),
        row(p["output_norm"]["bias"]),
    ]


def _rows(x: jax.Array, bias: jax.Array, weights, config: BertConfig, interpret: bool) -> jax.Array:
    """The layer over a batch of rows, ``x`` [B, L, hidden] and ``bias`` [B, ·, L]: one
    program per block of rows of up to _BLOCK_TOKENS tokens; ``interpret``: in Pallas's
    interpreter (off a TPU)."""
    batch, length, hidden = x.shape
    weight_bytes = sum(w.size * w.dtype.itemsize for w in weights)

    def vmem(rows: int) -> int:  # the weights and a block's activations, each twice over
        tokens = rows * length
        activations = 4 * tokens * (5 * hidden + config.intermediate_size + 2 * bias.shape[1])
        return 2 * (weight_bytes + activations)

    capacity = 64 * 2**20 if interpret else pltpu.get_tpu_info().vmem_capacity_bytes
    fits = [r for r in range(1, batch + 1) if not batch % r and r * length <= _BLOCK_TOKENS]
    per_block = max([r for r in fits if vmem(r) <= capacity * 3 // 4], default=1)
    tokens = per_block * length
    limit = min(capacity * 9 // 10, max(32 * 2**20, vmem(per_block)))

    def whole(w):
        return pl.BlockSpec(w.shape, lambda i: (0,) * w.ndim)

    # What the kernel executes, for XLA's scheduling and cost analysis (a custom call's
    # insides are hidden from both): the dense matmuls, attention's two products at
    # ``per_pass`` heads a pass, exp over the scores and in GELU; the rows in and out, the
    # bias, and the weights once (their blocks never change).
    per_pass, tokens_all = _LANES // config.head_dim, batch * length
    cost = pl.CostEstimate(
        flops=tokens_all * (8 * hidden**2 + 4 * hidden * config.intermediate_size)
        + tokens_all * 4 * per_pass * length * hidden,
        transcendentals=tokens_all * (per_pass * length * hidden // _LANES)
        + tokens_all * config.intermediate_size,
        bytes_accessed=2 * 4 * tokens_all * hidden + bias.size * bias.dtype.itemsize + weight_bytes,
    )

    out = pl.pallas_call(
        functools.partial(_kernel, config=config, length=length),
        grid=(batch // per_block,),
        in_specs=[
            pl.BlockSpec((tokens, hidden), lambda i: (i, 0)),
            pl.BlockSpec((per_block, *bias.shape[1:]), lambda i: (i, 0, 0)),
            *map(whole, weights),
        ],
        out_specs=pl.BlockSpec((tokens, hidden), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((batch * length, hidden), jnp.float32),
        scratch_shapes=[
            pltpu.VMEM((tokens, 3 * hidden), jnp.float32),
            pltpu.VMEM((tokens, hidden), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=int(limit)),
        cost_estimate=cost,
        interpret=interpret,
    )(jnp.reshape(x, (batch * length, hidden)), bias, *weights)
    return jnp.reshape(out, (batch, length, hidden))


def layer(x: jax.Array, bias: jax.Array, p: Mapping, config: BertConfig) -> jax.Array:
    """One encoder layer over one row, as ``encoder.encode_tokens`` computes it.

    Under ``jax.vmap`` the batch's rows run in blocks of up to 1,024 tokens, one block a
    program, so each weight tile of the matrix units meets every token of the block.

    Args:
        x: float32[L, hidden], the layer's input.
        bias: float32[L, L] or [1, L] (every head) or [heads, L, L], added to the attention
            logits.
        p: The layer's weights; dense matrices in bfloat16 multiply in bfloat16, summed in
            float32, and in float32 at ``Precision.HIGHEST`` otherwise, as XLA's layers do.
        config: The encoder's shape.

    Returns:
        float32[L, hidden].
    """
    return _layer(x, bias, p, config, _platform() != "tpu")


# Jitted: a model's layers share one shape, so a program traces, batches and lowers the
# layer once and calls it per layer; traced six times over, MiniLM's layers held the GIL
# long enough at a worker's start to slow its feed (bench/RESULTS.md, 2026-12-07).
@functools.partial(jax.jit, static_argnames=("config", "interpret"))
def _layer(x: jax.Array, bias: jax.Array, p: Mapping, config: BertConfig, interpret: bool):
    length = x.shape[0]
    bias = jnp.reshape(bias, (-1, length)) if bias.ndim == 3 else bias
    bias = jnp.broadcast_to(bias, (max(bias.shape[0], length), length)).astype(jnp.float32)

    def row(x, bias, *weights):
        return _rows(x[None], bias[None], weights, config, interpret)[0]

    one = jax.custom_batching.custom_vmap(row)

    @one.def_vmap
    def batched(size, in_batched, x, bias, *weights):
        if any(in_batched[2:]):  # weights that differ by row: Pallas's own batching, by row
            axes = [0 if b else None for b in in_batched]
            return jax.vmap(row, in_axes=axes)(x, bias, *weights), True
        x, bias = (
            a if b else jnp.broadcast_to(a, (size, *a.shape))
            for a, b in zip((x, bias), in_batched[:2], strict=True)
        )
        return _rows(x, bias, weights, config, interpret), True

    return one(x, bias, *_weights(p))
