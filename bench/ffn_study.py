# ruff: noqa  (a one-off study, in the tree for one commit: bench/RESULTS.md cites it)
"""A fused feed-forward block (x @ W1 + b1, GELU, @ W2 + b2, + x, layer norm) as one Pallas
kernel over token tiles, its [tokens, 1536] intermediate kept in VMEM, against today's
kernel and the same layer stack with XLA's feed-forward block. MiniLM's shapes, random
weights, synthetic packed rows (as encoder_study.py)."""

import functools
import json
import os
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pkg = types.ModuleType("beam_jax")
pkg.__path__ = [os.path.join(ROOT, "beam_jax")]
sys.modules["beam_jax"] = pkg
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from beam_jax._src.text import encoder as enc
from beam_jax._src.text.config import BertConfig
from beam_jax._src.text.packed import embed_packed, segment_attention_bias

OUT = os.environ.get("OUT", "/tmp")
TOKENS = int(os.environ.get("TOKENS", 32768))
REPS = int(os.environ.get("REPS", 10))
INTERPRET = jax.devices()[0].platform == "cpu"
cfg = BertConfig()
H, I, NL = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
rng = np.random.default_rng(0)
print("device", jax.devices()[0].device_kind, "interpret", INTERPRET, flush=True)


def dense(i, o):
    return {
        "w": jnp.asarray(rng.normal(0, 0.05, (i, o)), jnp.bfloat16),
        "b": jnp.asarray(rng.normal(0, 0.02, o), jnp.float32),
    }


def norm():
    return {
        "scale": jnp.asarray(1 + rng.normal(0, 0.05, H), jnp.float32),
        "bias": jnp.asarray(rng.normal(0, 0.02, H), jnp.float32),
    }


params = {
    "embeddings": {
        "word": jnp.asarray(rng.normal(0, 0.05, (cfg.vocab_size, H)), jnp.float32),
        "position": jnp.asarray(rng.normal(0, 0.05, (512, H)), jnp.float32),
        "token_type": jnp.asarray(rng.normal(0, 0.05, (2, H)), jnp.float32),
        "norm": norm(),
    },
    "layers": [
        {
            "query": dense(H, H),
            "key": dense(H, H),
            "value": dense(H, H),
            "attention_out": dense(H, H),
            "attention_norm": norm(),
            "intermediate": dense(H, I),
            "output": dense(I, H),
            "output_norm": norm(),
        }
        for _ in range(NL)
    ],
}


def rows(L, B, mean):
    ids = np.zeros((B, L), np.int32)
    seg = np.zeros((B, L), np.int32)
    pos = np.zeros((B, L), np.int32)
    texts = real = S = 0
    for b in range(B):
        at = s = 0
        while True:
            n = int(np.clip(rng.gamma(4, mean / 4), 4, L))
            if at + n > L:
                break
            s += 1
            ids[b, at : at + n] = rng.integers(1000, 30000, n)
            seg[b, at : at + n] = s
            pos[b, at : at + n] = np.arange(n)
            at += n
        texts += s
        real += at
        S = max(S, s)
    return jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(pos), S, texts, real


def erf(x):  # Abramowitz and Stegun 7.1.26 (|error| <= 1.5e-7), from exp alone
    a = jnp.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (
        ((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592
    ) * t * jnp.exp(-a * a)
    return jnp.where(x < 0, -y, y)


def ffn_kernel(x_ref, w1_ref, b1_ref, w2_ref, b2_ref, g_ref, beta_ref, o_ref, *, eps):
    x = x_ref[...].astype(jnp.float32)
    h = (
        jnp.dot(x.astype(jnp.bfloat16), w1_ref[...], preferred_element_type=jnp.float32)
        + b1_ref[...]
    )
    h = 0.5 * h * (1.0 + erf(h * 0.7071067811865476))
    y = (
        jnp.dot(h.astype(jnp.bfloat16), w2_ref[...], preferred_element_type=jnp.float32)
        + b2_ref[...]
        + x
    )
    m = jnp.mean(y, axis=-1, keepdims=True)
    d = y - m
    v = jnp.mean(d * d, axis=-1, keepdims=True)
    o_ref[...] = (d * jax.lax.rsqrt(v + eps) * g_ref[...] + beta_ref[...]).astype(o_ref.dtype)


def ffn_pallas(x, l, tm):
    n = x.shape[0]
    full = lambda shape: pl.BlockSpec(shape, lambda i: (0, 0))
    return pl.pallas_call(
        functools.partial(ffn_kernel, eps=cfg.layer_norm_eps),
        grid=(n // tm,),
        in_specs=[
            pl.BlockSpec((tm, H), lambda i: (i, 0)),
            full((H, I)),
            full((1, I)),
            full((I, H)),
            full((1, H)),
            full((1, H)),
            full((1, H)),
        ],
        out_specs=pl.BlockSpec((tm, H), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((n, H), jnp.float32),
        interpret=INTERPRET,
    )(
        x,
        l["intermediate"]["w"],
        l["intermediate"]["b"][None],
        l["output"]["w"],
        l["output"]["b"][None],
        l["output_norm"]["scale"][None],
        l["output_norm"]["bias"][None],
    )


def ffn_xla(x, l):
    h = enc._activation(enc._dense(x, l["intermediate"]), "gelu")
    return enc._layer_norm(x + enc._dense(h, l["output"]), l["output_norm"], cfg.layer_norm_eps)


def hybrid(ids, seg, pos, S, ffn):
    B, L = ids.shape

    def embed_row(i, p):
        e = params["embeddings"]
        x = jnp.take(e["word"], i, 0) + jnp.take(e["position"], p, 0) + e["token_type"][0][None]
        return enc._layer_norm(x, e["norm"], cfg.layer_norm_eps)

    x = jax.vmap(embed_row)(ids, pos)
    bias = jax.vmap(segment_attention_bias)(seg)
    for l in params["layers"]:
        att = jax.vmap(lambda xr, br: enc._attention(xr, br, l, cfg))(x, bias)
        x = jax.vmap(
            lambda xr, ar: enc._layer_norm(xr + ar, l["attention_norm"], cfg.layer_norm_eps)
        )(x, att)
        x = ffn(x.reshape(B * L, H), l).reshape(B, L, H)

    def pool_row(xr, s, p):
        which = jnp.arange(1, S + 1)
        member = which[:, None] == s[None, :]
        first = member & (p == 0)[None, :]
        return enc.unit(enc.pool(xr, member.astype(jnp.float32), first.astype(jnp.float32), "mean"))

    return jax.vmap(pool_row)(x, seg, pos)


def today(ids, seg, pos, S):
    return jax.vmap(lambda i, s, p: embed_packed(params, i, s, p, S, cfg))(ids, seg, pos)


VARIANTS = {
    "today (vmap of embed_packed)": today,
    "rows' attention, XLA feed-forward on all tokens": lambda i, s, p, S: hybrid(
        i, s, p, S, ffn_xla
    ),
}
for tm in (256, 512, 1024):
    VARIANTS[f"rows' attention, Pallas fused feed-forward (tile {tm})"] = (
        lambda tm: lambda i, s, p, S: hybrid(i, s, p, S, lambda x, l: ffn_pallas(x, l, tm))
    )(tm)


def timed(f, *a):
    o = f(*a)
    jax.block_until_ready(o)
    t = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*a))
        t.append(time.perf_counter() - t0)
    return o, float(np.median(t))


x = jnp.asarray(rng.normal(size=(8192, 8192)), jnp.bfloat16)
_, s = timed(jax.jit(lambda a: a @ a), x)
PEAK = 2 * 8192**3 / s
print(f"bf16 peak {PEAK / 1e12:.1f} TFLOP/s", flush=True)
dense_flops = 2 * NL * (4 * H * H + 2 * H * I)
res = {"peak_tflops": PEAK / 1e12, "runs": []}
# the block alone first: Pallas against XLA on 32k tokens
xs = jnp.asarray(rng.normal(size=(TOKENS, H)), jnp.float32)
l0 = params["layers"][0]
ref, s_x = timed(jax.jit(lambda a: ffn_xla(a, l0)), xs)
fl = 2 * TOKENS * 2 * H * I
print(
    f"feed-forward block alone, XLA: {s_x * 1e3:.2f} ms, {fl / s_x / PEAK:.1%} of peak", flush=True
)
for tm in (256, 512, 1024):
    try:
        out, s_p = timed(jax.jit(lambda a: ffn_pallas(a, l0, tm)), xs)
        err = float(jnp.max(jnp.abs(out - ref)))
        print(
            f"feed-forward block alone, Pallas tile {tm}: {s_p * 1e3:.2f} ms, {fl / s_p / PEAK:.1%} of peak, max |diff| {err:.2e}",
            flush=True,
        )
        res["runs"].append(
            {"part": "ffn", "tile": tm, "seconds": s_p, "xla_seconds": s_x, "max_abs_diff": err}
        )
    except Exception as e:
        print(
            f"feed-forward Pallas tile {tm}: FAILED {type(e).__name__}: {str(e)[:500]}", flush=True
        )
for L, mean in ((128, 24), (256, 48)):
    B = TOKENS // L
    ids, seg, pos, S, texts, real = rows(L, B, mean)
    base = None
    for name, f in VARIANTS.items():
        try:
            out, s = timed(jax.jit(f, static_argnums=3), ids, seg, pos, S)
            out = np.asarray(out)
            base = out if base is None else base
            ok = np.linalg.norm(base, axis=-1) > 0
            cos = float(np.min(np.sum(out * base, -1)[ok]))
            mfu = real * (dense_flops + 2 * NL * 2 * L * H) / s / PEAK
            print(
                f"L={L} B={B} {name}: {s * 1e3:.1f} ms, {texts / s:,.0f} texts/s, MFU {mfu:.1%}, min cos to today {cos:.7f}",
                flush=True,
            )
            res["runs"].append(
                {
                    "L": L,
                    "variant": name,
                    "seconds": s,
                    "texts_per_s": texts / s,
                    "mfu": mfu,
                    "min_cos": cos,
                }
            )
        except Exception as e:
            print(f"L={L} {name}: FAILED {type(e).__name__}: {str(e)[:500]}", flush=True)
json.dump(
    res, open(os.path.join(OUT, f"ffn_{os.environ.get('TAG', 'default')}.json"), "w"), indent=1
)
