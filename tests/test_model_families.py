"""MPNet and XLM-RoBERTa beside BERT: small random models in the Hugging Face layout checked
against an independent float64 numpy forward pass, through the padded and packed kernels
and a real Beam pipeline; against sentence-transformers where a Python with it (and torch)
is found; and a model type the encoder does not know refused at launch."""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that

import beam_jax as bj
from beam_jax.text import EmbedTexts, SentenceEncoder
from tests import tiny_families as tf

FAMILIES = {"mpnet": tf.write_tiny_mpnet, "xlm-roberta": tf.write_tiny_xlm_roberta}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request, tmp_path_factory) -> pathlib.Path:
    return FAMILIES[request.param](tmp_path_factory.mktemp(request.param))


# ------------------------------------------------------------ the float64 reference


def _bucket(distance: int, num_buckets: int, max_distance: int = 128) -> int:
    """MPNet's relative-position bucket of ``key - query``, written from Hugging Face's
    ``MPNetEncoder.relative_position_bucket`` in Python floats."""
    n = -distance
    half = num_buckets // 2
    bucket = half if n < 0 else 0
    n = abs(n)
    exact = half // 2
    if n < exact:
        return bucket + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (half - exact))
    return bucket + min(large, half - 1)


def _layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def reference(path: pathlib.Path, texts: list[str]) -> np.ndarray:
    """Each text embedded alone in float64, read from the directory's files by their
    Hugging Face names (not through beam_jax)."""
    import safetensors.numpy
    import tokenizers
    from scipy.special import erf

    config = json.loads((path / "config.json").read_text())
    kind = config["model_type"]
    max_seq = json.loads((path / "sentence_bert_config.json").read_text())["max_seq_length"]
    pool = json.loads((path / "1_Pooling" / "config.json").read_text())
    normalize = (path / "2_Normalize").is_dir()
    raw = safetensors.numpy.load_file(str(path / "model.safetensors"))
    w = {k: v.astype(np.float64) for k, v in raw.items()}
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]
    rust = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    rust.no_padding()
    rust.enable_truncation(max_seq)
    if kind == "mpnet":
        names = ("attention.attn.q", "attention.attn.k", "attention.attn.v",
                 "attention.attn.o", "attention.LayerNorm")  # fmt: skip
    else:
        names = ("attention.self.query", "attention.self.key", "attention.self.value",
                 "attention.output.dense", "attention.output.LayerNorm")  # fmt: skip

    def lin(x, name):
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    out = []
    for text in texts:
        ids = np.array(rust.encode(text.strip()).ids)
        n = len(ids)
        # RoBERTa and MPNet: positions count real tokens from the padding index + 1.
        positions = np.arange(n) + config["pad_token_id"] + 1
        x = w["embeddings.word_embeddings.weight"][ids]
        x = x + w["embeddings.position_embeddings.weight"][positions]
        if kind != "mpnet":
            x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        bias = np.zeros((heads, n, n))
        if kind == "mpnet":
            table = w["encoder.relative_attention_bias.weight"]
            buckets = config["relative_attention_num_buckets"]
            for q in range(n):
                for k in range(n):
                    bias[:, q, k] = table[_bucket(k - q, buckets)]
        for layer in range(config["num_hidden_layers"]):
            p = f"encoder.layer.{layer}"
            d = x.shape[1] // heads
            q, k, v = (
                lin(x, f"{p}.{m}").reshape(n, heads, d).transpose(1, 0, 2) for m in names[:3]
            )
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(d) + bias
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            context = (probs @ v).transpose(1, 0, 2).reshape(n, heads * d)
            x = _layer_norm(x + lin(context, f"{p}.{names[3]}"), w[f"{p}.{names[4]}.weight"],
                            w[f"{p}.{names[4]}.bias"], eps)  # fmt: skip
            h = lin(x, f"{p}.intermediate.dense")
            h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
            x = _layer_norm(x + lin(h, f"{p}.output.dense"), w[f"{p}.output.LayerNorm.weight"],
                            w[f"{p}.output.LayerNorm.bias"], eps)  # fmt: skip
        if pool["pooling_mode_cls_token"]:
            vector = x[0]
        elif pool["pooling_mode_max_tokens"]:
            vector = x.max(0)
        else:
            vector = x.mean(0)
        out.append(vector / np.linalg.norm(vector) if normalize else vector)
    return np.array(out)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_relative_position_buckets_match_mpnet_s():
    from beam_jax._src.text.encoder import relative_position_buckets

    distances = np.arange(-600, 601)
    for buckets in (32, 16):
        want = [_bucket(int(d), buckets) for d in distances]
        assert relative_position_buckets(distances, buckets).tolist() == want


def test_the_family_is_read_from_config_json(model):
    encoder = SentenceEncoder.from_dir(str(model))
    config = json.loads((model / "config.json").read_text())
    assert encoder.config.model_type == config["model_type"]
    assert encoder.config.position_offset == 2  # the padding index 1, plus one
    # 66 positions, of which the first two are never a token's: 64 tokens at most.
    assert encoder.last_boundary_range == (48, 64)
    params = encoder.load_params()
    assert ("relative_attention_bias" in params) == (config["model_type"] == "mpnet")
    assert ("token_type" in params["embeddings"]) == (config["model_type"] != "mpnet")


def test_padded_and_packed_kernels_match_the_float64_reference(model):
    texts = tf.sample_texts(24) + ["", "   the cat   "]
    encoder = SentenceEncoder.from_dir(str(model))
    params = encoder.load_params()
    want = reference(model, texts)
    ids = [encoder.tokenizer().encode(t) for t in texts]
    assert max(map(len, ids)) == 48  # some texts are cut at max_seq_length
    got = []
    for tokens in ids:
        padded = np.zeros(64, np.int32)
        padded[: len(tokens)] = tokens
        lengths = {"L": np.int32(len(tokens))}
        got.append(np.asarray(encoder.element_fn(params, {"input_ids": padded}, lengths)))
    assert _cosines(got, want).min() >= 0.99999
    # Packed: the texts end to end in rows of 64, each embedded as if alone.
    lengths = [len(t) for t in ids]
    packing = bj.plan_packing(lengths, max_size=64, buffer_size=len(texts))
    _embed_texts_like(model, texts, want, 0.99999, batching=packing)


def _embed_texts_like(model: pathlib.Path, texts: list[str], want: np.ndarray, cosine: float,
                      **kwargs) -> None:  # fmt: skip
    """Runs ``EmbedTexts`` on ``(i, texts[i])`` and checks one vector per text, each at
    least ``cosine`` from ``want[i]``."""

    def check(pairs):
        assert sorted(i for i, _ in pairs) == list(range(len(texts)))
        got = np.array([vector for _, vector in sorted(pairs, key=lambda kv: kv[0])])
        assert _cosines(got, want).min() >= cosine, _cosines(got, want).min()

    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        vectors = (
            p
            | beam.Create(list(enumerate(texts)))
            | EmbedTexts(str(model), max_batch_size=8, **kwargs)
        )
        assert_that(vectors, check)


def test_a_pipeline_embeds_like_the_reference(model):
    texts = tf.sample_texts(20, seed=3)
    _embed_texts_like(model, texts, reference(model, texts), 0.99999)


# ------------------------------------------------------------ sentence-transformers


def _st_python() -> str | None:
    """A Python with sentence-transformers: this one, or $BEAM_JAX_ST_PYTHON."""
    try:
        import sentence_transformers  # noqa: F401

        return sys.executable
    except ImportError:
        pass
    other = os.environ.get("BEAM_JAX_ST_PYTHON")
    return other if other and shutil.which(other) else None


def _st_env() -> dict[str, str]:
    # The tests' PYTHONPATH holds tests/, whose kernels.py would shadow a package of the
    # same name that transformers imports; the other Python needs none of it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "CUDA_VISIBLE_DEVICES": ""}


ST_SCRIPT = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
texts = json.load(open(sys.argv[2]))
np.save(sys.argv[3], model.encode(texts, batch_size=8, convert_to_numpy=True))
"""


@pytest.mark.skipif(_st_python() is None, reason="needs sentence-transformers (and torch): "
                    "install them or set BEAM_JAX_ST_PYTHON to a Python that has them")  # fmt: skip
def test_sentence_transformers_gives_the_same_vectors(model, tmp_path):
    texts = tf.sample_texts(16, seed=5)
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    subprocess.run(
        [_st_python(), "-c", ST_SCRIPT, str(model), str(tmp_path / "texts.json"),
         str(tmp_path / "st.npy")],
        check=True, timeout=600, env=_st_env(),
    )  # fmt: skip
    want = np.load(tmp_path / "st.npy")
    assert _cosines(reference(model, texts), want).min() >= 0.9999
    _embed_texts_like(model, texts, want, 0.9999)


# ------------------------------------------------------------ refused at launch


def test_an_unknown_model_type_is_refused_at_launch_naming_it_and_the_known_ones(tmp_path):
    from pipelines.embed import job as embed_job

    model = tf.write_tiny_mpnet(tmp_path / "deberta")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "deberta-v2"}))
    pattern = r"model_type 'deberta-v2'.*bert, roberta, xlm-roberta, mpnet"
    with pytest.raises(bj.SpecError, match=pattern):
        SentenceEncoder.from_dir(str(model))
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": 1, "text": "a cat"}) + "\n")
    with pytest.raises(SystemExit, match=pattern):
        embed_job.main(["--input", str(source), "--output", str(tmp_path / "out"),
                        "--model_dir", str(model), "--no-progress"])  # fmt: skip
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_flagship_embeds_like_the_reference_with_model_dir(model, tmp_path):
    from tests import flagship as ft

    texts = tf.sample_texts(30, seed=7)
    source = ft.write_json_lines(
        tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts)]
    )
    ft.run(source, tmp_path / "out", "--model_dir", str(model), "--no-progress",
           "--matmuls", "float32")  # fmt: skip
    table, failed = ft.read_outputs(tmp_path / "out")
    assert not failed and sorted(ft.ids(table)) == list(range(len(texts)))
    order = np.argsort(table.column("id").to_numpy())
    got = np.array(table.column("embedding").to_pylist())[order]
    assert _cosines(got, reference(model, texts)).min() >= 0.99999
