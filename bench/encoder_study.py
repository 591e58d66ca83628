# ruff: noqa  (a one-off study, in the tree for one commit: bench/RESULTS.md cites it)
"""MiniLM's packed encoder on one device, by variant and by part: texts/s, the FLOPs and HBM
bytes XLA counts, and the cosine to today's kernel. Random weights (MiniLM's shapes),
synthetic packed rows (segment lengths drawn like short sentences). One process."""

import json
import os
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pkg = types.ModuleType("beam_jax")
pkg.__path__ = [os.path.join(ROOT, "beam_jax")]
sys.modules["beam_jax"] = pkg  # the encoder's modules without Beam
import jax
import jax.numpy as jnp
import numpy as np

from beam_jax._src.text.config import BertConfig
from beam_jax._src.text.packed import embed_packed, segment_attention_bias

OUT = os.environ.get("OUT", "/tmp")
TOKENS = int(os.environ.get("TOKENS", 32768))
REPS = int(os.environ.get("REPS", 10))
dev = jax.devices()[0]
print("device", dev.platform, dev.device_kind, "jax", jax.__version__, flush=True)
cfg = BertConfig()
H, I, NL = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
rng = np.random.default_rng(0)


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
    texts = real = 0
    S = 0
    for b in range(B):
        at, s = 0, 0
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


# ---- variants of the layer stack
def ln(x, p, eps=cfg.layer_norm_eps):
    x = x.astype(jnp.float32)
    m = jnp.mean(x, -1, keepdims=True)
    v = jnp.mean(jnp.square(x - m), -1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + eps) * p["scale"] + p["bias"]


def mm(x, p):
    return jnp.matmul(x.astype(jnp.bfloat16), p["w"], preferred_element_type=jnp.float32) + p["b"]


def gelu(x):
    return 0.5 * x * (1 + jax.lax.erf(x * 2**-0.5))


def fused_qkv(layer):
    return {
        "w": jnp.concatenate([layer[n]["w"] for n in ("query", "key", "value")], 1),
        "b": jnp.concatenate([layer[n]["b"] for n in ("query", "key", "value")]),
    }


QKV = [fused_qkv(l) for l in params["layers"]]


def attn_xla(q, k, v, seg):  # [B,L,Hh,D] each; seg [B,L]
    bias = jax.vmap(segment_attention_bias)(seg)[:, None]
    lg = (
        jnp.einsum(
            "bqhd,bkhd->bhqk",
            q.astype(jnp.bfloat16),
            k.astype(jnp.bfloat16),
            preferred_element_type=jnp.float32,
        )
        + bias
    )
    pr = jax.nn.softmax(lg, -1)
    return jnp.einsum(
        "bhqk,bkhd->bqhd",
        pr.astype(jnp.bfloat16),
        v.astype(jnp.bfloat16),
        preferred_element_type=jnp.float32,
    )


def attn_flash(q, k, v, seg):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    t = lambda y: jnp.transpose(y, (0, 2, 1, 3)).astype(jnp.bfloat16)
    L = q.shape[1]
    blk = min(L, 128)
    bs = fa.BlockSizes(block_q=blk, block_k_major=blk, block_k=blk, block_b=1)
    o = fa.flash_attention(
        t(q), t(k), t(v), segment_ids=fa.SegmentIds(seg, seg), sm_scale=1.0, block_sizes=bs
    )
    return jnp.transpose(o, (0, 2, 1, 3)).astype(jnp.float32)


def stack(ids, seg, pos, attn, act_dtype=jnp.float32):
    B, L = ids.shape
    nh, hd = cfg.num_attention_heads, cfg.head_dim
    e = params["embeddings"]
    x = jnp.take(e["word"], ids, 0) + jnp.take(e["position"], pos, 0) + e["token_type"][0]
    x = ln(x, e["norm"]).astype(act_dtype)
    for l, qkv in zip(params["layers"], QKV):
        y = mm(x, qkv).reshape(B, L, 3, nh, hd)
        q, k, v = y[:, :, 0] * hd**-0.5, y[:, :, 1], y[:, :, 2]
        c = attn(q, k, v, seg).reshape(B, L, H)
        x = ln(x + mm(c, l["attention_out"]), l["attention_norm"]).astype(act_dtype)
        h = gelu(mm(x, l["intermediate"])).astype(act_dtype)
        x = ln(x + mm(h, l["output"]), l["output_norm"]).astype(act_dtype)
    return x.astype(jnp.float32)


def pooled(x, seg, pos, S):
    which = jnp.arange(1, S + 1)
    member = (which[None, :, None] == seg[:, None, :]).astype(jnp.float32)
    v = jnp.einsum("bsl,blh->bsh", member, x) / jnp.maximum(member.sum(-1, keepdims=True), 1)
    return v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def today(ids, seg, pos, S):
    return jax.vmap(lambda i, s, p: embed_packed(params, i, s, p, S, cfg))(ids, seg, pos)


VARIANTS = {
    "today (vmap of embed_packed)": today,
    "batched, fused QKV, XLA attention": lambda i, s, p, S: pooled(
        stack(i, s, p, attn_xla), s, p, S
    ),
    "+ bf16 activations between ops": lambda i, s, p, S: pooled(
        stack(i, s, p, attn_xla, jnp.bfloat16), s, p, S
    ),
    "batched, fused QKV, Pallas flash attention (segment ids)": lambda i, s, p, S: pooled(
        stack(i, s, p, attn_flash), s, p, S
    ),
    "+ bf16 activations, flash": lambda i, s, p, S: pooled(
        stack(i, s, p, attn_flash, jnp.bfloat16), s, p, S
    ),
}


def timed(f, *args):
    out = f(*args)
    jax.block_until_ready(out)
    t = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        t.append(time.perf_counter() - t0)
    return out, float(np.median(t))


# ---- peak
a = jnp.asarray(rng.normal(size=(8192, 8192)), jnp.bfloat16)
mmf = jax.jit(lambda x: x @ x)
_, s = timed(mmf, a)
PEAK = 2 * 8192**3 / s
print(f"bf16 peak {PEAK / 1e12:.1f} TFLOP/s", flush=True)
dense_flops = 2 * NL * (4 * H * H + 2 * H * I)  # per token
results = {"peak_tflops": PEAK / 1e12, "runs": []}
for L, mean in ((128, 24), (256, 48)):
    B = TOKENS // L
    ids, seg, pos, S, texts, real = rows(L, B, mean)
    attn_flops = 2 * NL * 2 * L * H  # per token: scores and context, over the row
    ref = None
    for name, f in VARIANTS.items():
        try:
            jf = jax.jit(f, static_argnums=3)
            c = jf.lower(ids, seg, pos, S).compile()
            ca = c.cost_analysis()
            ca = ca[0] if isinstance(ca, list) else ca
            out, s = timed(jf, ids, seg, pos, S)
            out = np.asarray(out, np.float32)
            if ref is None:
                ref = out
            cos = float(np.min(np.sum(out * ref, -1)[np.linalg.norm(ref, axis=-1) > 0]))
            useful = real * (dense_flops + attn_flops)
            r = {
                "L": L,
                "rows": B,
                "texts": texts,
                "real_tokens": real,
                "variant": name,
                "seconds": s,
                "texts_per_s": texts / s,
                "mfu_real_tokens": useful / s / PEAK,
                "xla_flops": float(ca.get("flops", -1)),
                "xla_bytes": float(ca.get("bytes accessed", -1)),
                "min_cosine_to_today": cos,
            }
            print(
                f"L={L} B={B} {name}: {s * 1e3:.1f} ms, {texts / s:,.0f} texts/s, MFU {r['mfu_real_tokens']:.1%}, "
                f"XLA {r['xla_flops'] / 1e9:.0f} GFLOP {r['xla_bytes'] / 1e9:.2f} GB, cos {cos:.6f}",
                flush=True,
            )
        except Exception as e:
            r = {"L": L, "variant": name, "error": f"{type(e).__name__}: {str(e)[:400]}"}
            print(f"L={L} {name}: FAILED {r['error']}", flush=True)
        results["runs"].append(r)
    # parts of one layer, alone, batched form: attention block vs feed-forward block
    x = jnp.asarray(rng.normal(size=(B, L, H)), jnp.float32)
    l, qkv = params["layers"][0], QKV[0]
    nh, hd = cfg.num_attention_heads, cfg.head_dim

    def att_block(x, seg, attn=attn_xla):
        y = mm(x, qkv).reshape(B, L, 3, nh, hd)
        c = attn(y[:, :, 0], y[:, :, 1], y[:, :, 2], seg).reshape(B, L, H)
        return ln(x + mm(c, l["attention_out"]), l["attention_norm"])

    def ffn_block(x):
        return ln(x + mm(gelu(mm(x, l["intermediate"])), l["output"]), l["output_norm"])

    def scores_only(x, seg):
        y = mm(x, qkv).reshape(B, L, 3, nh, hd)
        return attn_xla(y[:, :, 0], y[:, :, 1], y[:, :, 2], seg)

    def matmuls_only(x):
        return mm(mm(mm(x, qkv)[..., :H], l["attention_out"]), l["intermediate"]) @ l["output"]["w"]

    for pname, pf, args, flops in (
        (
            "one layer: attention block (XLA)",
            att_block,
            (x, seg),
            2 * L * B * (4 * H * H + 2 * L * H),
        ),
        (
            "one layer: QKV + attention core (XLA)",
            scores_only,
            (x, seg),
            2 * L * B * (3 * H * H + 2 * L * H),
        ),
        ("one layer: feed-forward block", ffn_block, (x,), 2 * L * B * 2 * H * I),
        (
            "one layer: its four matmul chains only",
            matmuls_only,
            (x,),
            2 * L * B * (H * H + H * I + I * H + H * H),
        ),
    ):
        try:
            jf = jax.jit(pf)
            c = jf.lower(*args).compile()
            ca = c.cost_analysis()
            ca = ca[0] if isinstance(ca, list) else ca
            _, s = timed(jf, *args)
            r = {
                "L": L,
                "part": pname,
                "seconds": s,
                "flop_util": flops / s / PEAK,
                "xla_bytes": float(ca.get("bytes accessed", -1)),
                "hbm_GBps": float(ca.get("bytes accessed", 0)) / s / 1e9,
            }
            print(
                f"L={L} {pname}: {s * 1e3:.2f} ms, {r['flop_util']:.1%} of peak, {r['xla_bytes'] / 1e6:.0f} MB at {r['hbm_GBps']:.0f} GB/s",
                flush=True,
            )
        except Exception as e:
            r = {"L": L, "part": pname, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"L={L} {pname}: FAILED {r['error']}", flush=True)
        results["runs"].append(r)
tag = os.environ.get("TAG", "default")
json.dump(results, open(os.path.join(OUT, f"study_{tag}.json"), "w"), indent=1)
