"""beam_jax.text on a small random BERT against an independent float64 numpy forward pass.

The model directory is written by tests/tiny_bert.py in the Hugging Face /
sentence-transformers layout. The reference below is written from the BERT paper's
equations on torch's weight layout and runs on each text's real tokens only (no padding, no
mask), so it shares nothing with the library's code.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import shutil

import apache_beam as beam
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pytest
import safetensors.numpy
from apache_beam.testing.util import assert_that

import beam_jax as bj
from beam_jax import text
from beam_jax.internal import Packer
from beam_jax.text import SentenceEncoder
from tests.beam_helpers import pipeline
from tests.tiny_bert import VOCAB, sample_texts, write_tiny_bert

MIN_COSINE = 0.99999
PAD_TO = 32  # the tiny models' max_seq_length
# (pooling, normalize, hidden_act, weight-name prefix): every pooling mode, both norms,
# the exact and the tanh GELU and ReLU, and both ways Hugging Face names the weights.
MODELS = {
    "cls": ("cls", False, "gelu", ""),
    "mean_normalized": ("mean", True, "gelu_new", "bert."),
    "max_normalized": ("max", True, "relu", ""),
}


# --- the independent reference ------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "gelu_new": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: np.maximum(x, 0),
}


def _layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def reference_embed(model_dir, ids) -> np.ndarray:
    """One text's sentence vector in float64, from the directory's own files."""
    config = json.loads((model_dir / "config.json").read_text())
    pooling_config = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    modules = json.loads((model_dir / "modules.json").read_text())
    w = {
        k.removeprefix("bert."): v.astype(np.float64)
        for k, v in safetensors.numpy.load_file(str(model_dir / "model.safetensors")).items()
    }
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]
    act = ACTIVATIONS[config["hidden_act"]]
    ids = np.asarray(ids)
    n = len(ids)

    def linear(x, name):  # torch layout: weight [out, in]
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    def norm(x, name):
        return _layer_norm(x, w[f"{name}.weight"], w[f"{name}.bias"], eps)

    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = norm(x, "embeddings.LayerNorm")
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}"
        d = x.shape[1] // heads
        q, k, v = (
            linear(x, f"{p}.attention.self.{m}").reshape(n, heads, d).transpose(1, 0, 2)
            for m in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(n, heads * d)
        x = norm(
            x + linear(context, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm"
        )
        hidden = act(linear(x, f"{p}.intermediate.dense"))
        x = norm(x + linear(hidden, f"{p}.output.dense"), f"{p}.output.LayerNorm")
    if pooling_config["pooling_mode_cls_token"]:
        vector = x[0]
    elif pooling_config["pooling_mode_mean_tokens"]:
        vector = x.mean(0)
    else:
        vector = x.max(0)
    if modules[-1]["type"].endswith("Normalize"):
        vector = vector / np.linalg.norm(vector)
    return vector


# --- fixtures and helpers -----------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request, tmp_path_factory):
    pooling, normalize, act, prefix = MODELS[request.param]
    path = write_tiny_bert(
        tmp_path_factory.mktemp(request.param) / "model",
        pooling=pooling, normalize=normalize, hidden_act=act, prefix=prefix,
        seed=len(request.param),
    )  # fmt: skip
    encoder = SentenceEncoder.from_dir(path)
    return {
        "name": request.param,
        "path": path,
        "encoder": encoder,
        "params": encoder.load_params(),
    }


@pytest.fixture(scope="module")
def texts():
    return sample_texts(40) + ["", "The cat sat on the mat.", " ".join(["big"] * 60)]


def cosines(a, b):
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


_JITTED: dict = {}


def _jit(fn):
    if fn not in _JITTED:
        _JITTED[fn] = jax.jit(jax.vmap(fn, in_axes=(None, 0, 0)))
    return _JITTED[fn]


def embed_padded(encoder, params, ids_list, length=PAD_TO, seed=0):
    """One batch padded to ``length`` with random ids (padding must not matter)."""
    rows = -(-len(ids_list) // 16) * 16
    batch = np.random.default_rng(seed).integers(0, len(VOCAB), (rows, length), dtype=np.int32)
    lengths = np.zeros(rows, np.int32)
    for row, ids in enumerate(ids_list):
        batch[row, : len(ids)] = ids
        lengths[row] = len(ids)
    out = _jit(encoder.element_fn)(params, {"input_ids": batch}, {"L": lengths})
    return np.asarray(out)[: len(ids_list)]


def embed_packed(encoder, params, ids_list, row_length=PAD_TO):
    plan = Packer(
        encoder.spec, bj.Packing(row_lengths=row_length, rows_per_batch=8, max_segments=8)
    )
    result = plan.pack([{"input_ids": ids} for ids in ids_list])
    assert not result.refused
    fn = _jit(encoder.packed_fn)
    outputs = [
        np.asarray(fn(params, {"input_ids": b.leaves[0]}, b.segments)) for b in result.batches
    ]
    return np.stack(plan.unpack(result, outputs)), result


# --- the directory is read as sentence-transformers reads it ------------------------


def test_the_directory_is_read(model):
    encoder = model["encoder"]
    pooling, normalize, act, _ = MODELS[model["name"]]
    assert (encoder.pooling, encoder.normalize, encoder.config.hidden_act) == (
        pooling, normalize, act,
    )  # fmt: skip
    assert encoder.config == text.BertConfig(
        vocab_size=len(VOCAB), hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
        intermediate_size=128, hidden_act=act, max_position_embeddings=64,
    )  # fmt: skip
    assert (encoder.dim, encoder.max_length, encoder.lowercase) == (64, 32, False)
    assert encoder.spec == {
        "input_ids": bj.ArraySpec(("L",), np.int32, valid_range=(0, len(VOCAB)))
    }
    leaves = jax.tree_util.tree_leaves(model["params"])
    assert len(leaves) == 5 + 2 * 16 and all(x.dtype == np.float32 for x in leaves)


def test_the_tokenizer_overrides_the_files_padding_and_truncation(model):
    tokenizer = model["encoder"].tokenizer()
    cls, sep, unk = VOCAB.index("[CLS]"), VOCAB.index("[SEP]"), VOCAB.index("[UNK]")
    # Lower-cased and accents stripped; an unknown word split into pieces; no padding.
    ids = tokenizer.encode("  The CATS sat  ").tolist()
    assert ids == [cls, VOCAB.index("the"), VOCAB.index("cat"), VOCAB.index("##s"),
                   VOCAB.index("sat"), sep]  # fmt: skip
    assert tokenizer.encode("").tolist() == [cls, sep]
    assert tokenizer.encode("日").tolist() == [cls, unk, sep]
    long = tokenizer.encode(" ".join(["big"] * 100))  # the file truncates at 12; the model, 32
    assert len(long) == 32 and long[0] == cls and long[-1] == sep


def test_the_tokenizer_is_loaded_once_per_process_and_model(model):
    encoder = model["encoder"]
    assert encoder.tokenizer() is encoder.tokenizer()
    assert pickle.loads(pickle.dumps(encoder)).tokenizer() is encoder.tokenizer()  # an equal copy
    other = text.SentenceEncoder.from_dir()  # another model: its own tokenizer
    assert other.tokenizer() is not encoder.tokenizer()
    assert other.tokenizer().encode("Hello, world!").tolist() == [101, 7592, 1010, 2088, 999, 102]


# --- the forward pass equals the reference ------------------------------------------


def test_padded_form_equals_the_float64_reference(model, texts):
    encoder, params = model["encoder"], model["params"]
    ids = encoder.tokenizer().encode_batch(texts)
    got = embed_padded(encoder, params, ids)
    want = np.stack([reference_embed(model["path"], x) for x in ids])
    cos = cosines(got.astype(np.float64), want)
    worst = int(np.argmin(cos))
    assert cos[worst] >= MIN_COSINE, (cos[worst], texts[worst])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_packed_form_equals_the_float64_reference(model, texts):
    encoder, params = model["encoder"], model["params"]
    ids = encoder.tokenizer().encode_batch(texts)
    got, result = embed_packed(encoder, params, ids)
    assert sum(int((b.segment_counts > 1).sum()) for b in result.batches) >= 5
    want = np.stack([reference_embed(model["path"], x) for x in ids])
    assert cosines(got.astype(np.float64), want).min() >= MIN_COSINE
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@hypothesis.settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(
    lengths=st.lists(st.integers(1, PAD_TO), min_size=1, max_size=12),
    seed=st.integers(0, 2**16),
)
def test_packing_never_changes_a_vector(model, lengths, seed):
    """Whatever shares a row with a text, and wherever in the row it lands, its vector is
    the one it gets padded alone."""
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, len(VOCAB), n).astype(np.int32) for n in lengths]
    encoder, params = model["encoder"], model["params"]
    packed, _ = embed_packed(encoder, params, ids)
    padded = embed_padded(encoder, params, ids, seed=seed)
    np.testing.assert_allclose(packed, padded, rtol=1e-5, atol=2e-5)


def test_both_kernels_run_in_a_pipeline_from_a_pickled_encoder(model, texts):
    """RunKernelOnArrow over tokenized record batches, bucketed and packed: Beam pickles the
    encoder's kernels and load_params into the DoFns."""
    encoder = model["encoder"]
    ids, failures = encoder.tokenizer().encode_arrow(pa.array(texts))
    assert not failures
    batch = pa.record_batch({"id": pa.array(range(len(texts)), pa.int64()), "input_ids": ids})
    want = {i: reference_embed(model["path"], x) for i, x in enumerate(ids.to_pylist())}
    columns = bj.ArrowColumns(leaves={"input_ids": "input_ids"}, id="id")

    def close_to_reference(batches):
        got = {
            i: np.asarray(v, np.float64)
            for b in batches
            for i, v in zip(b.column("id").to_pylist(), b.column("output").to_pylist(), strict=True)
        }
        assert sorted(got) == sorted(want)
        ours = np.stack([got[i] for i in sorted(want)])
        theirs = np.stack([want[i] for i in sorted(want)])
        assert cosines(ours, theirs).min() >= MIN_COSINE

    with pipeline() as p:
        rows = p | beam.Create([batch])
        bucketed = rows | "Bucketed" >> bj.RunKernelOnArrow(
            encoder.element_fn, spec=encoder.spec, columns=columns,
            load_params=encoder.load_params,
            bucketing=bj.Bucketing(boundaries={"L": (8, 16, 32)}, batch_size=8),
        )  # fmt: skip
        packed = rows | "Packed" >> bj.RunKernelOnArrow(
            encoder.packed_fn, spec=encoder.spec, columns=columns,
            load_params=encoder.load_params,
            packing=bj.Packing(row_lengths=32, rows_per_batch=4, max_segments=8),
        )  # fmt: skip
        assert_that(bucketed, close_to_reference, label="BucketedMatches")
        assert_that(packed, close_to_reference, label="PackedMatches")


def test_encoder_and_tokenizer_pickle(model, monkeypatch):
    encoder = model["encoder"]
    # The directory is held as an absolute path: workers may start elsewhere.
    monkeypatch.chdir(model["path"].parent)
    assert SentenceEncoder.from_dir("model") == encoder and encoder.path == str(model["path"])
    again = pickle.loads(pickle.dumps(encoder))
    assert again == encoder and hash(again) == hash(encoder)
    tokenizer = pickle.loads(pickle.dumps(encoder.tokenizer()))
    assert tokenizer.encode("the cat").tolist() == encoder.tokenizer().encode("the cat").tolist()
    ids = encoder.tokenizer().encode_batch(["the big red dog ran"])
    np.testing.assert_array_equal(
        embed_padded(again, again.load_params(), ids),
        embed_padded(encoder, model["params"], ids),
    )


def test_against_sentence_transformers(model, texts):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    st_model = sentence_transformers.SentenceTransformer(str(model["path"]), device="cpu")
    want = st_model.encode(texts, convert_to_numpy=True)
    encoder = model["encoder"]
    ids = encoder.tokenizer().encode_batch(texts)
    features = st_model.tokenize(texts)
    theirs = [
        row[mask.bool()].tolist()
        for row, mask in zip(features["input_ids"], features["attention_mask"], strict=True)
    ]
    assert [x.tolist() for x in ids] == theirs
    got = embed_padded(encoder, model["params"], ids)
    assert cosines(got, want).min() >= 0.9999


# --- FLOPs ---------------------------------------------------------------------------


def test_flops_per_token_counts_what_xla_executes(model):
    """XLA's own count of the compiled batch's FLOPs: the matmuls we count, plus a small
    share of elementwise work (norms, softmax, activation) that we leave out."""
    encoder, params = model["encoder"], model["params"]
    rows, length = 4, 32
    batch = ({"input_ids": jnp.zeros((rows, length), jnp.int32)}, {"L": jnp.full(rows, length)})
    compiled = jax.jit(jax.vmap(encoder.element_fn, (None, 0, 0))).lower(params, *batch).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    ours = encoder.flops_per_token(length) * rows * length
    assert ours <= analysis["flops"] <= 1.5 * ours, (ours, analysis["flops"])
    h, i, layers = 64, 128, 2
    assert encoder.flops_per_token(length) == layers * (8 * h * h + 4 * h * i + 4 * length * h)
    with pytest.raises(ValueError, match="length must be a positive int, got 0"):
        encoder.flops_per_token(0)


# --- what is refused, and how --------------------------------------------------------


@pytest.fixture
def tiny(tmp_path):
    return write_tiny_bert(tmp_path / "model")


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "file, changes, message",
    [
        ("config.json", {"model_type": "deberta-v2"}, "has model_type 'deberta-v2', which the"),
        ("config.json", {"position_embedding_type": "relative_key"}, "only 'absolute'"),
        ("config.json", {"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu' is not supported"),
        ("config.json", {"hidden_size": 66}, "must be a multiple of num_attention_heads"),
        (
            "1_Pooling/config.json",
            {"pooling_mode_cls_token": False, "pooling_mode_mean_sqrt_len_tokens": True},
            "pooling ['pooling_mode_mean_sqrt_len_tokens']; this encoder implements exactly one",
        ),
        (
            "1_Pooling/config.json",
            {"pooling_mode_mean_tokens": True},
            "pooling ['cls', 'mean']; this encoder implements exactly one of",
        ),
        ("1_Pooling/config.json", {"pooling_mode_cls_token": False}, "pooling none"),
        ("1_Pooling/config.json", {"word_embedding_dimension": 32}, "word_embedding_dimension 32"),
    ],
)
def test_models_this_encoder_does_not_implement_are_refused(tiny, file, changes, message):
    _edit_json(tiny / file, **changes)
    with pytest.raises(bj.SpecError, match=re.escape(message)):
        SentenceEncoder.from_dir(tiny)


def test_a_dense_module_and_a_wrong_order_are_refused(tiny):
    modules = json.loads((tiny / "modules.json").read_text())
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (tiny / "modules.json").write_text(json.dumps([*modules, dense]))
    with pytest.raises(bj.SpecError, match=r"lists a 'sentence_transformers.models.Dense' module"):
        SentenceEncoder.from_dir(tiny)
    (tiny / "modules.json").write_text(json.dumps(modules[::-1]))
    assert SentenceEncoder.from_dir(tiny).pooling == "cls"  # read in the order of idx
    for m, idx in zip(modules, (1, 0), strict=True):
        m["idx"] = idx
    (tiny / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(bj.SpecError, match=r"lists the modules \['Pooling', 'Transformer'\]"):
        SentenceEncoder.from_dir(tiny)


def test_missing_files_are_named(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; expected a sentence-transformers"):
        SentenceEncoder.from_dir(tmp_path / "nowhere")
    weights = tiny / "model.safetensors"
    weights.rename(tiny / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="model.safetensors does not exist"):
        SentenceEncoder.from_dir(tiny)
    encoder = SentenceEncoder(path=str(tiny), config=text.BertConfig(vocab_size=len(VOCAB)))
    with pytest.raises(FileNotFoundError, match=r"\['pytorch_model.bin'\]: convert the checkpoint"):
        text.read_weights(weights, encoder.config)


def test_weights_of_another_shape_or_missing_are_named(tiny):
    _edit_json(tiny / "config.json", intermediate_size=256)
    encoder = SentenceEncoder.from_dir(tiny)
    with pytest.raises(ValueError, match=r"intermediate.dense.weight' .* has shape \(128, 64\), "
                       r"expected \(256, 64\)"):  # fmt: skip
        encoder.load_params()
    _edit_json(tiny / "config.json", intermediate_size=128, num_hidden_layers=3)
    with pytest.raises(KeyError, match="'encoder.layer.2.attention.self.query.weight' not found"):
        SentenceEncoder.from_dir(tiny).load_params()


def test_old_layer_norm_names_are_read(tiny):
    weights = safetensors.numpy.load_file(str(tiny / "model.safetensors"))
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v
        for k, v in weights.items()
    }
    encoder = SentenceEncoder.from_dir(tiny)
    before = encoder.load_params()
    safetensors.numpy.save_file(renamed, str(tiny / "model.safetensors"))
    after = encoder.load_params()
    jax.tree_util.tree_map(np.testing.assert_array_equal, before, after)


def test_defaults_where_files_are_absent(tiny):
    """As sentence-transformers: without modules.json, mean pooling and no Normalize;
    without max_seq_length, the tokenizer's model_max_length within the positions."""
    (tiny / "modules.json").unlink()
    shutil.rmtree(tiny / "1_Pooling")
    (tiny / "sentence_bert_config.json").unlink()
    model = text.read_model_dir(tiny)
    assert (model.pooling, model.normalize, model.max_length) == ("mean", False, 64)
    assert model.files == ("config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json")  # fmt: skip
    _edit_json(tiny / "tokenizer_config.json", model_max_length=10**30)
    assert text.read_model_dir(tiny).max_length == 64  # capped by the positions
    (tiny / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    assert SentenceEncoder.from_dir(tiny).max_length == 16
    assert SentenceEncoder.from_dir(tiny, max_length=8).tokenizer().max_length == 8
    (tiny / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 16, "do_lower_case": True})
    )
    assert SentenceEncoder.from_dir(tiny).lowercase


def test_a_manifest_of_ones_own_model_is_checked(tiny, tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(text.make_manifest(tiny, "tiny")))
    assert sorted(json.loads(manifest.read_text())["files"]) == [
        "1_Pooling/config.json", "config.json", "model.safetensors", "modules.json",
        "sentence_bert_config.json", "tokenizer.json",
    ]  # fmt: skip
    encoder = SentenceEncoder.from_dir(tiny, manifest=manifest)
    assert encoder.manifest == str(manifest)
    _edit_json(tiny / "1_Pooling" / "config.json", pooling_mode_cls_token=True)  # same content
    (tiny / "1_Pooling" / "config.json").write_text(
        (tiny / "1_Pooling" / "config.json").read_text() + " "
    )
    with pytest.raises(text.ModelFileMismatchError, match=r"1_Pooling/config.json has sha256"):
        encoder.load_params()
