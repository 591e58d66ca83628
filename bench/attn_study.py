# ruff: noqa  (a one-off study, in the tree for one commit)
"""A multi-head attention kernel for packed rows in Pallas: one program per row (or per
few rows), every head's scores and softmax in VMEM, the segment mask made in the kernel
from the row's segment ids. Against today's kernel, in today's per-row layout."""
import functools, json, os, sys, time, types
sys.argv = sys.argv[:1]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pkg = types.ModuleType("beam_jax"); pkg.__path__ = [os.path.join(ROOT, "beam_jax")]; sys.modules["beam_jax"] = pkg
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
from beam_jax._src.text.config import BertConfig
from beam_jax._src.text import encoder as enc
from beam_jax._src.text.packed import embed_packed, segment_attention_bias
OUT = os.environ.get("OUT", "/tmp"); TOKENS = int(os.environ.get("TOKENS", 32768)); REPS = int(os.environ.get("REPS", 10))
INTERPRET = jax.devices()[0].platform == "cpu"
cfg = BertConfig(); H, I, NL = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
NH, HD = cfg.num_attention_heads, cfg.head_dim
rng = np.random.default_rng(0)
print("device", jax.devices()[0].device_kind, "interpret", INTERPRET, flush=True)
def dense(i, o):
    return {"w": jnp.asarray(rng.normal(0, 0.05, (i, o)), jnp.bfloat16), "b": jnp.asarray(rng.normal(0, 0.02, o), jnp.float32)}
def norm():
    return {"scale": jnp.asarray(1 + rng.normal(0, 0.05, H), jnp.float32), "bias": jnp.asarray(rng.normal(0, 0.02, H), jnp.float32)}
params = {"embeddings": {"word": jnp.asarray(rng.normal(0, 0.05, (cfg.vocab_size, H)), jnp.float32),
                         "position": jnp.asarray(rng.normal(0, 0.05, (512, H)), jnp.float32),
                         "token_type": jnp.asarray(rng.normal(0, 0.05, (2, H)), jnp.float32), "norm": norm()},
          "layers": [{"query": dense(H, H), "key": dense(H, H), "value": dense(H, H), "attention_out": dense(H, H),
                      "attention_norm": norm(), "intermediate": dense(H, I), "output": dense(I, H), "output_norm": norm()}
                     for _ in range(NL)]}
def rows(L, B, mean):
    ids = np.zeros((B, L), np.int32); seg = np.zeros((B, L), np.int32); pos = np.zeros((B, L), np.int32); texts = real = S = 0
    for b in range(B):
        at = s = 0
        while True:
            n = int(np.clip(rng.gamma(4, mean / 4), 4, L))
            if at + n > L: break
            s += 1; ids[b, at:at+n] = rng.integers(1000, 30000, n); seg[b, at:at+n] = s; pos[b, at:at+n] = np.arange(n); at += n
        texts += s; real += at; S = max(S, s)
    return jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(pos), S, texts, real

def attn_kernel(q_ref, k_ref, v_ref, sq_ref, sk_ref, o_ref):
    for r in range(q_ref.shape[0]):  # the rows of this block
        q, k, v = q_ref[r], k_ref[r], v_ref[r]  # [NH, L, HD] bf16
        s = jnp.einsum("hqd,hkd->hqk", q, k, preferred_element_type=jnp.float32)
        same = (sq_ref[r] == sk_ref[r]) & (sk_ref[r] > 0)  # [L,1] == [1,L] -> [L, L]
        s = jnp.where(same[None], s, jnp.float32(-1e9))
        m = jnp.max(s, axis=-1, keepdims=True); p = jnp.exp(s - m); l = jnp.sum(p, axis=-1, keepdims=True)
        o = jnp.einsum("hqk,hkd->hqd", p.astype(jnp.bfloat16), v, preferred_element_type=jnp.float32)
        o_ref[r] = o / l

def attn_pallas(q, k, v, seg, rb):
    B, _, L, _ = q.shape
    blk = lambda *shape: pl.BlockSpec((rb, *shape), lambda i: (i,) + (0,) * len(shape))
    return pl.pallas_call(
        attn_kernel, grid=(B // rb,),
        in_specs=[blk(NH, L, HD), blk(NH, L, HD), blk(NH, L, HD), blk(L, 1), blk(1, L)],
        out_specs=blk(NH, L, HD), out_shape=jax.ShapeDtypeStruct((B, NH, L, HD), jnp.float32), interpret=INTERPRET,
    )(q, k, v, seg[:, :, None], seg[:, None, :])

def encode_with(ids, seg, pos, S, rb):
    B, L = ids.shape
    def embed_row(i, p):
        e = params["embeddings"]
        x = jnp.take(e["word"], i, 0) + jnp.take(e["position"], p, 0) + e["token_type"][0][None]
        return enc._layer_norm(x, e["norm"], cfg.layer_norm_eps)
    x = jax.vmap(embed_row)(ids, pos)
    split = lambda y: jnp.transpose(jnp.reshape(y, (L, NH, HD)), (1, 0, 2))
    for l in params["layers"]:
        def qkv(xr):
            q = split(enc._dense(xr, l["query"])) * jnp.float32(HD**-0.5)
            return tuple(y.astype(jnp.bfloat16) for y in (q, split(enc._dense(xr, l["key"])), split(enc._dense(xr, l["value"]))))
        q, k, v = jax.vmap(qkv)(x)
        ctx = attn_pallas(q, k, v, seg, rb)
        def rest(xr, c):
            a = enc._dense(jnp.reshape(jnp.transpose(c, (1, 0, 2)), (L, H)), l["attention_out"])
            xr = enc._layer_norm(xr + a, l["attention_norm"], cfg.layer_norm_eps)
            h = enc._activation(enc._dense(xr, l["intermediate"]), "gelu")
            return enc._layer_norm(xr + enc._dense(h, l["output"]), l["output_norm"], cfg.layer_norm_eps)
        x = jax.vmap(rest)(x, ctx)
    def pool_row(xr, s, p):
        member = jnp.arange(1, S + 1)[:, None] == s[None, :]; first = member & (p == 0)[None, :]
        return enc.unit(enc.pool(xr, member.astype(jnp.float32), first.astype(jnp.float32), "mean"))
    return jax.vmap(pool_row)(x, seg, pos)

def today(ids, seg, pos, S):
    return jax.vmap(lambda i, s, p: embed_packed(params, i, s, p, S, cfg))(ids, seg, pos)
VARIANTS = {"today (vmap of embed_packed)": today}
for rb in (1, 2, 4, 8):
    VARIANTS[f"Pallas multi-head attention, {rb} row(s) a program"] = (lambda rb: lambda i, s, p, S: encode_with(i, s, p, S, rb))(rb)
def timed(f, *a):
    o = f(*a); jax.block_until_ready(o); t = []
    for _ in range(REPS):
        t0 = time.perf_counter(); jax.block_until_ready(f(*a)); t.append(time.perf_counter() - t0)
    return o, float(np.median(t))
x = jnp.asarray(rng.normal(size=(8192, 8192)), jnp.bfloat16)
_, s = timed(jax.jit(lambda a: a @ a), x); PEAK = 2 * 8192**3 / s
print(f"bf16 peak {PEAK/1e12:.1f} TFLOP/s", flush=True)
dense_flops = 2 * NL * (4 * H * H + 2 * H * I); res = {"peak_tflops": PEAK / 1e12, "runs": []}
for L, mean in ((128, 24), (256, 48)):
    B = TOKENS // L; ids, seg, pos, S, texts, real = rows(L, B, mean); base = None
    for name, f in VARIANTS.items():
        try:
            out, s = timed(jax.jit(f, static_argnums=3), ids, seg, pos, S); out = np.asarray(out)
            base = out if base is None else base
            cos = float(np.min(np.sum(out * base, -1)[np.linalg.norm(base, axis=-1) > 0]))
            mfu = real * (dense_flops + 2 * NL * 2 * L * H) / s / PEAK
            print(f"L={L} B={B} {name}: {s*1e3:.1f} ms, {texts/s:,.0f} texts/s, MFU {mfu:.1%}, min cos to today {cos:.7f}", flush=True)
            res["runs"].append({"L": L, "variant": name, "seconds": s, "texts_per_s": texts / s, "mfu": mfu, "min_cos": cos})
        except Exception as e:
            print(f"L={L} {name}: FAILED {type(e).__name__}: {str(e)[:700]}", flush=True)
json.dump(res, open(os.path.join(OUT, f"attn_{os.environ.get('TAG', 'default')}.json"), "w"), indent=1)
