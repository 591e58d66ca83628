"""Tests for the pure-JAX all-MiniLM-L6-v2 encoder (``beam_jax.text``) and the built-in corpus.

The reference embeddings in tests/fixtures/ come from sentence-transformers itself
(see tools/make_minilm_reference.py); torch is not needed to run these tests.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import types

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import beam_jax as bj
from beam_jax import text
from beam_jax._src.text import corpus as corpus_source
from beam_jax._src.text import matmuls as matmuls_module
from beam_jax.internal import Packer
from beam_jax.text import BertConfig, SentenceEncoder

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
BUCKETS = (16, 32, 64, 128, 256)
BATCH_MULTIPLE = 16  # batch sizes are rounded up to this, so compiled shapes get reused
MIN_COSINE = 0.9999
ENCODER = SentenceEncoder.from_dir()  # the packaged all-MiniLM-L6-v2


@pytest.fixture(autouse=True)
def strict_jax():
    # conftest.py already sets these globally; repeated here so the model code is held
    # to them even when this file runs on its own.
    with jax.numpy_rank_promotion("raise"), jax.numpy_dtype_promotion("strict"):
        yield


@pytest.fixture(scope="module")
def params():
    return ENCODER.load_params()


@pytest.fixture(scope="module")
def tokenizer():
    return ENCODER.tokenizer()


# The built-in corpus (and hand-written texts), and a second, different real corpus: the
# Python Language Reference's help topics (see tools/make_minilm_reference.py).
@pytest.fixture(scope="module", params=["minilm_reference", "minilm_reference_topics"])
def reference(request):
    name = request.param
    meta = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    with np.load(FIXTURES / f"{name}.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    offsets = np.concatenate([[0], np.cumsum(arrays["token_lengths"])])
    ids = [arrays["token_ids"][a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return {
        "texts": meta["texts"],
        "ids": ids,
        "full_lengths": arrays["full_lengths"],
        "embeddings": arrays["embeddings"],
    }


_embed_batch = jax.jit(jax.vmap(ENCODER.element_fn, in_axes=(None, 0, 0)))


def embed_padded(params, ids_list, length, pad_ids=None):
    """Embeds token-id arrays as one batch padded to ``length``, as the core library does."""
    rows = -(-len(ids_list) // BATCH_MULTIPLE) * BATCH_MULTIPLE
    batch = np.zeros((rows, length), np.int32) if pad_ids is None else pad_ids.copy()
    lengths = np.zeros((rows,), np.int32)  # extra rows are all padding
    for row, ids in enumerate(ids_list):
        batch[row, : len(ids)] = ids
        lengths[row] = len(ids)
    out = _embed_batch(params, {"input_ids": jnp.asarray(batch)}, {"L": jnp.asarray(lengths)})
    return np.asarray(out)[: len(ids_list)]


def embed_bucketed(params, ids_list):
    """Embeds texts of any length by grouping them into the smallest bucket that fits."""
    out = np.zeros((len(ids_list), 384), np.float32)
    for lo, hi in zip((0, *BUCKETS), BUCKETS, strict=False):
        index = [i for i, ids in enumerate(ids_list) if lo < len(ids) <= hi]
        if index:
            out[index] = embed_padded(params, [ids_list[i] for i in index], hi)
    return out


def cosines(a, b):
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# --- model files and config -------------------------------------------------------


def test_model_dir_has_the_files():
    path = text.packaged_model_dir()
    assert (path / "model.safetensors").is_file()
    assert (path / "tokenizer.json").is_file()


def test_config_is_read_from_the_model_files():
    config = ENCODER.config
    assert config == BertConfig() and config.hidden_act == "gelu"
    assert (ENCODER.pooling, ENCODER.normalize, ENCODER.dim) == ("mean", True, 384)
    assert (config.hidden_size, config.num_attention_heads, config.head_dim) == (384, 12, 32)
    assert (config.num_hidden_layers, config.intermediate_size) == (6, 1536)
    assert ENCODER.max_length == 256 and config.layer_norm_eps == 1e-12


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"hidden_size": 100}, "multiple of num_attention_heads"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive int, got 0"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
        ({"hidden_act": "gelu_10"}, "hidden_act 'gelu_10' is not supported"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        BertConfig(**kwargs)


def test_encoder_rejects_a_max_length_beyond_the_positions():
    with pytest.raises(bj.SpecError, match=re.escape("max_length (1024) exceeds the 512 tokens")):
        SentenceEncoder(path=None, config=BertConfig(), max_length=1024)
    with pytest.raises(bj.SpecError, match="max_length must be an int >= 2, got 1"):
        SentenceEncoder(path=None, config=BertConfig(), max_length=1)


def test_params_are_float32_and_transposed(params):
    leaves = jax.tree_util.tree_leaves(params)
    assert len(leaves) == 5 + 6 * 16  # 3 tables + LayerNorm, then 8 (w, b) pairs a layer
    assert all(leaf.dtype == np.float32 for leaf in leaves)
    layer = params["layers"][0]
    assert layer["intermediate"]["w"].shape == (384, 1536)
    assert layer["output"]["w"].shape == (1536, 384)
    assert params["embeddings"]["word"].shape == (30522, 384)


def test_matmuls_are_checked_and_auto_follows_the_devices_bfloat16_units(monkeypatch):
    with pytest.raises(bj.SpecError, match=r"matmuls must be one of .* got 'half'"):
        SentenceEncoder(path=None, config=BertConfig(), matmuls="half")
    auto = SentenceEncoder(path=None, config=BertConfig(), matmuls="auto")
    assert dataclasses.replace(auto, matmuls="float32").resolved_matmuls() == "float32"
    assert dataclasses.replace(auto, matmuls="bfloat16").resolved_matmuls() == "bfloat16"
    # Decided from what the device is, the same however often it is asked.
    assert len({auto.resolved_matmuls() for _ in range(3)}) == 1
    cpu = jax.devices("cpu")[0]
    flags, vendor = matmuls_module._cpu_flags(), matmuls_module._cpu_vendor()
    units = "amx_bf16" in flags or ("avx512_bf16" in flags and vendor == "AuthenticAMD")
    assert matmuls_module.resolve("auto", cpu) == ("bfloat16" if units else "float32")
    for flags, vendor, chosen in (
        ({"avx512f", "amx_bf16"}, "GenuineIntel", "bfloat16"),
        ({"avx512f", "avx512_bf16"}, "AuthenticAMD", "bfloat16"),  # Zen 4 and later
        ({"avx512f", "avx512_bf16"}, "GenuineIntel", "float32"),  # no AMX: bf16 is slower
        ({"avx512f", "avx2"}, "AuthenticAMD", "float32"),
        ({"avx2"}, "", "float32"),
    ):
        monkeypatch.setattr(matmuls_module, "_cpu_flags", lambda f=frozenset(flags): f)
        monkeypatch.setattr(matmuls_module, "_cpu_vendor", lambda v=vendor: v)
        assert matmuls_module.resolve("auto", cpu) == chosen, (flags, vendor)
    device = types.SimpleNamespace
    for dev, units in (
        (device(platform="tpu", device_kind="TPU v5 lite"), True),
        (device(platform="gpu", device_kind="NVIDIA H100", compute_capability="9.0"), True),
        (device(platform="gpu", device_kind="NVIDIA A100", compute_capability="8.0"), True),
        (device(platform="gpu", device_kind="Tesla V100", compute_capability="7.0"), False),
        (device(platform="gpu", device_kind="AMD Instinct"), False),
        (device(platform="metal", device_kind="Apple M2"), False),
    ):
        assert matmuls_module.has_bfloat16_units(dev) is units, dev
        assert matmuls_module.resolve("auto", dev) == ("bfloat16" if units else "float32")
    with pytest.raises(ValueError, match=r"matmuls must be one of .* got 'fp16'"):
        matmuls_module.resolve("fp16")


def test_cpu_flags_are_read_from_cpuinfo(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx512_bf16\n\n"
        "processor\t: 1\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu\n"
    )
    monkeypatch.setattr(matmuls_module, "_CPUINFO", str(info))
    cached = (matmuls_module._cpu_flags, matmuls_module._cpu_vendor)
    for f in cached:
        f.cache_clear()
    try:
        assert matmuls_module._cpu_flags() == {"fpu", "sse2", "avx512_bf16"}
        assert matmuls_module._cpu_vendor() == "AuthenticAMD"
        assert matmuls_module.resolve("auto", jax.devices("cpu")[0]) == "bfloat16"
        for f in cached:
            f.cache_clear()
        monkeypatch.setattr(matmuls_module, "_CPUINFO", str(tmp_path / "absent"))
        assert matmuls_module._cpu_flags() == frozenset()  # not Linux: no units known
        assert matmuls_module._cpu_vendor() == ""
    finally:
        for f in cached:
            f.cache_clear()


# --- tokenizer --------------------------------------------------------------------


def test_tokenizer_matches_sentence_transformers(tokenizer, reference):
    ours = tokenizer.encode_batch(reference["texts"])
    for sample, got, want in zip(reference["texts"], ours, reference["ids"], strict=True):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want, err_msg=repr(sample[:80]))


def test_tokenizer_truncates_to_256_including_special_tokens(tokenizer, reference):
    pairs = zip(reference["texts"], reference["full_lengths"], strict=True)
    long = [text for text, n in pairs if n > 256]
    assert len(long) >= 20
    for ids in tokenizer.encode_batch(long):
        assert len(ids) == 256 and ids[0] == 101 and ids[-1] == 102


def test_tokenizer_details(tokenizer):
    assert tokenizer.encode("Hello, world!").tolist() == [101, 7592, 1010, 2088, 999, 102]
    assert tokenizer.encode("").tolist() == [101, 102]
    # Lower-cased, accents stripped (BertNormalizer), unknown symbols -> [UNK] (100).
    assert tokenizer.encode("CAFÉ 😀").tolist() == tokenizer.encode("cafe [UNK]").tolist()
    short = SentenceEncoder.from_dir(max_length=8).tokenizer()
    assert len(short.encode("one two three four five six seven")) == 8
    with pytest.raises(TypeError, match="one str"):
        tokenizer.encode_batch("not a list")
    with pytest.raises(ValueError, match="max_length must be an int >= 2"):
        text.Tokenizer(tokenizer.path, max_length=1)


# --- encoder ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def float32_embeddings(params, reference):
    """The float32 encoder's vectors of ``reference``'s texts, bucketed: computed once per
    corpus for the tests that compare with them (read only)."""
    vectors = embed_bucketed(params, reference["ids"])
    vectors.flags.writeable = False
    return vectors


def test_embeddings_match_sentence_transformers(float32_embeddings, reference):
    got = float32_embeddings
    cos = cosines(got, reference["embeddings"])
    worst = int(np.argmin(cos))
    assert cos[worst] >= MIN_COSINE, (cos[worst], reference["texts"][worst][:80])
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(got, reference["embeddings"], atol=1e-4)


@pytest.fixture(scope="module")
def bfloat16_params():
    return dataclasses.replace(ENCODER, matmuls="bfloat16").load_params()


def test_bfloat16_matmuls_keep_the_cosine_to_sentence_transformers(
    float32_embeddings, bfloat16_params, reference
):
    """bfloat16 inputs and weights, float32 sums: only the dense layers' matrices are
    bfloat16, and both kernels stay within MIN_COSINE of sentence-transformers' float32."""
    layer = bfloat16_params["layers"][0]
    assert layer["intermediate"]["w"].dtype == jnp.bfloat16
    assert layer["intermediate"]["b"].dtype == np.float32
    assert layer["attention_norm"]["scale"].dtype == np.float32
    assert bfloat16_params["embeddings"]["word"].dtype == np.float32
    bucketed = embed_bucketed(bfloat16_params, reference["ids"])
    packed, _ = embed_packed(bfloat16_params, reference["ids"])
    for got in (bucketed, packed):
        cos = cosines(got, reference["embeddings"])
        worst = int(np.argmin(cos))
        assert cos[worst] >= MIN_COSINE, (cos[worst], reference["texts"][worst][:80])
    # The bfloat16 path ran: the vectors are close to float32's, not equal to them.
    assert 1e-6 < np.abs(bucketed - float32_embeddings).max() < 1e-2


def test_padding_does_not_change_the_embedding(params, reference):
    ids = [x for x in reference["ids"] if len(x) <= 64][::7][:BATCH_MULTIPLE]
    tight = embed_padded(params, ids, 64)
    rng = np.random.default_rng(0)
    garbage = rng.integers(0, 30522, (BATCH_MULTIPLE, 256), dtype=np.int32)
    loose = embed_padded(params, ids, 256, pad_ids=garbage)  # padding is not even [PAD]
    np.testing.assert_allclose(loose, tight, rtol=1e-5, atol=1e-6)


@hypothesis.settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(
    ids=st.lists(st.integers(999, 30521), min_size=1, max_size=30),
    pad=st.integers(0, 30521),
)
def test_padding_invariance_property(params, ids, pad):
    ids = np.asarray([101, *ids, 102][:32], np.int32)
    short = embed_padded(params, [ids], 32)
    long = embed_padded(params, [ids], 64, pad_ids=np.full((BATCH_MULTIPLE, 64), pad, np.int32))
    np.testing.assert_allclose(long, short, rtol=1e-5, atol=1e-6)


def test_embed_single_element_and_all_padding_row(params, tokenizer):
    ids = tokenizer.encode("A cat sat on the mat.")
    one = text.embed(params, jnp.asarray(ids), jnp.ones(ids.shape, jnp.bool_), ENCODER.config)
    batched = embed_padded(params, [ids, np.zeros((0,), np.int32)], 16)
    np.testing.assert_allclose(np.asarray(one), batched[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(batched[1], 0.0)  # no nan from an empty row


def test_embed_rejects_bad_shapes(params):
    with pytest.raises(ValueError, match="use jax.vmap"):
        text.embed(params, jnp.zeros((2, 4), jnp.int32), jnp.ones((2, 4), jnp.bool_), BertConfig())
    with pytest.raises(ValueError, match="exceeds the 512 positions"):
        text.embed(params, jnp.zeros((600,), jnp.int32), jnp.ones((600,), jnp.bool_), BertConfig())


def test_live_against_sentence_transformers(params, tokenizer, reference):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = sentence_transformers.SentenceTransformer(str(text.packaged_model_dir()), device="cpu")
    texts = reference["texts"][::12][:20]
    want = model.encode(texts, convert_to_numpy=True)
    got = embed_bucketed(params, tokenizer.encode_batch(texts))
    assert cosines(got, want).min() >= MIN_COSINE


# --- built-in corpus --------------------------------------------------------------


def test_builtin_corpus_shape_and_determinism():
    corpus = text.builtin_corpus()
    assert len(corpus) >= 2000
    assert [i for i, _ in corpus] == list(range(len(corpus)))
    texts = [t for _, t in corpus]
    assert len(set(texts)) == len(texts)
    assert all(t == " ".join(t.split()) and t for t in texts)
    assert not any(">>>" in t for t in texts)
    assert text.builtin_corpus(10) == corpus[:10]
    corpus_source._passages.cache_clear()  # recompute from the files, not the cache
    corpus_source._ordered.cache_clear()
    assert text.builtin_corpus() == corpus


def test_builtin_corpus_has_a_spread_of_lengths(tokenizer):
    texts = [t for _, t in text.builtin_corpus()]
    full = text.Tokenizer(tokenizer.path, max_length=100_000)
    lengths = np.asarray([len(ids) for ids in full.encode_batch(texts)])
    assert (lengths <= 16).sum() >= 200
    assert ((lengths > 64) & (lengths <= 256)).sum() >= 200
    assert (lengths > 256).sum() >= 20


def test_builtin_corpus_rejects_bad_n():
    with pytest.raises(ValueError, match="got -1"):
        text.builtin_corpus(-1)


def test_labelled_corpus_keeps_the_largest_modules_and_their_own_passages():
    classes, rows = text.labelled_corpus(5)
    assert len(classes) == 5 and list(classes) == sorted(classes)
    assert [i for i, *_ in rows] == list(range(len(rows)))
    assert {label for *_, label in rows} == set(classes)
    corpus = {t for _, t in text.builtin_corpus()}
    assert all(t in corpus for _, t, _ in rows)  # the same passages, labelled
    fewer_classes, fewer = text.labelled_corpus(3)
    assert set(fewer_classes) < set(classes) and len(fewer) < len(rows)
    assert text.labelled_corpus(5) == (classes, rows)  # deterministic
    with pytest.raises(ValueError, match="between 2 and .* got 1"):
        text.labelled_corpus(1)


# --- packed encoder ---------------------------------------------------------------

PACKED_MIN_COSINE = 0.99999
_embed_rows = jax.jit(jax.vmap(ENCODER.packed_fn, in_axes=(None, 0, 0)))


def _wrong_packed_element(params, element, segments):
    """embed_packed without the segment mask: every real token attends to the whole row."""
    ids = segments.ids.astype(jnp.int32)
    key_bias = jnp.where(ids > 0, jnp.float32(0), jnp.float32(-1e30))
    positions, bias = segments.positions, key_bias[None, :]
    x = text.encode_tokens(params, element["input_ids"], positions, bias, ENCODER.config)
    which = jnp.arange(1, segments.lengths.shape[-1] + 1, dtype=jnp.int32)
    onehot = (which[:, None] == ids[None, :]).astype(jnp.float32)
    count = jnp.maximum(jnp.sum(onehot, axis=1), jnp.float32(1e-9))
    pooled = jnp.matmul(onehot, x) / count[:, None]
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def embed_packed(params, ids_list, kernel=_embed_rows, row_length=256, rows=8):
    """Embeds texts packed several to a row, as the packing policy lays them out."""
    plan = Packer(
        {"input_ids": bj.ArraySpec(("L",), np.int32)},
        bj.Packing(row_lengths=row_length, rows_per_batch=rows, max_segments=32),
    )
    result = plan.pack([{"input_ids": ids} for ids in ids_list])
    assert not result.refused
    outputs = [
        np.asarray(kernel(params, {"input_ids": b.leaves[0]}, b.segments)) for b in result.batches
    ]
    return np.stack(plan.unpack(result, outputs)), result


def test_packed_encoder_equals_the_unpacked_one(params, float32_embeddings, reference):
    packed, result = embed_packed(params, reference["ids"])
    shared = sum(int((b.segment_counts > 1).sum()) for b in result.batches)
    assert shared >= 10  # rows really hold several texts
    cos = cosines(packed, float32_embeddings)
    worst = int(np.argmin(cos))
    assert cos[worst] >= PACKED_MIN_COSINE, (cos[worst], reference["texts"][worst][:80])
    assert cosines(packed, reference["embeddings"]).min() >= MIN_COSINE


def test_without_the_segment_mask_packed_texts_contaminate_each_other(params, reference):
    ids = [x for x in reference["ids"] if len(x) <= 64][:48]
    right, result = embed_packed(params, ids)
    wrong, _ = embed_packed(
        params, ids, kernel=jax.jit(jax.vmap(_wrong_packed_element, (None, 0, 0)))
    )
    alone_vectors = embed_bucketed(params, ids)
    assert cosines(right, alone_vectors).min() >= PACKED_MIN_COSINE
    # Texts that share a row see each other: their vectors move far from their own.
    assert cosines(wrong, alone_vectors).min() < 0.95
    alone = [
        int(i) for b in result.batches for i, r in zip(b.indices, b.rows, strict=True)
        if b.segment_counts[r] == 1
    ]  # fmt: skip
    np.testing.assert_allclose(wrong[alone], right[alone], atol=1e-5)


def test_packed_encoder_rejects_bad_shapes(params):
    with pytest.raises(ValueError, match="takes one row"):
        text.embed_packed(
            params, jnp.zeros((4,), jnp.int32), jnp.zeros((5,), jnp.int32),
            jnp.zeros((4,), jnp.int32), 2, ENCODER.config,
        )  # fmt: skip
