"""The encoder layer as one Pallas kernel (``layer_kernel="pallas"``), in Pallas's
interpreter on the CPU, against the XLA layers it replaces: BERT (MiniLM's widths), MPNet
and XLM-RoBERTa, padded and packed, alone and in a real Beam pipeline with dead letters;
and lowered for a TPU from here (Pallas's TPU lowering of every layer).

With float32 matmuls both sum in float32 from float32 products: cosine >= 0.99999. With
bfloat16 matmuls each rounds its own float32 sums to bfloat16 at every layer, so the two
differ as each differs from float32: both are held to the bound ``--matmuls bfloat16``
documents against float32."""

from __future__ import annotations

import dataclasses
import functools
import types

import apache_beam as beam
import jax
import numpy as np
import pytest
from apache_beam.testing.util import assert_that

import beam_jax as bj
from beam_jax._src.text import fused
from beam_jax._src.text import matmuls as mm
from beam_jax.text import EmbedTexts, SentenceEncoder
from tests import tiny_families as tf
from tools import make_random_minilm as rm

# Hidden sizes of whole 128-lane groups; heads of 32 lanes (MPNet: two groups, each with
# its own heads' relative-position bias) and of 64 (XLM-R).
WIDE = {"intermediate": 256, "max_positions": 130, "max_seq_length": 64}


def _minilm_two_layers(path):
    """BERT at all-MiniLM-L6-v2's widths (384, 12 heads of 32: three lane groups), 2 layers."""
    config = {**rm.CONFIG, "num_hidden_layers": 2, "vocab_size": 2000}
    return rm.write_random_minilm(path, words=tf.sample_texts(200), config=config)


FAMILIES = {
    "bert": _minilm_two_layers,
    "mpnet": functools.partial(tf.write_tiny_mpnet, hidden=256, heads=8, **WIDE),
    "xlm-roberta": functools.partial(tf.write_tiny_xlm_roberta, hidden=128, heads=2, **WIDE),
}
ROW = 128  # padded elements and packed rows: the kernel takes whole 128-lane groups


BFLOAT16_COSINE = 0.9999  # against float32: docs/models.md, tests/test_minilm.py


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def encoders(request, tmp_path_factory):
    """The family's encoder: XLA's layers and the kernel's, with their float32 weights."""
    path = FAMILIES[request.param](tmp_path_factory.mktemp(request.param))
    xla = SentenceEncoder.from_dir(str(path), max_length=48)
    return xla, dataclasses.replace(xla, layer_kernel="pallas"), xla.load_params()


def _bfloat16(encoder, params):
    """The encoder and its weights with bfloat16 matmuls."""
    return dataclasses.replace(encoder, matmuls="bfloat16"), mm.cast_dense(params, "bfloat16")


def _cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _packed(encoder, params, rows: list[list[str]]) -> np.ndarray:
    """float32[rows, most texts in a row, dim]: each list of texts packed in one row."""
    ids = np.zeros((len(rows), ROW), np.int32)
    seg, pos = np.zeros_like(ids), np.zeros_like(ids)
    for r, row in enumerate(rows):
        at = 0
        for s, text in enumerate(row, 1):
            tokens = encoder.tokenizer().encode(text)
            ids[r, at : at + len(tokens)] = tokens
            seg[r, at : at + len(tokens)] = s
            pos[r, at : at + len(tokens)] = np.arange(len(tokens))
            at += len(tokens)
    one = _packed_row(encoder, params, max(map(len, rows)))
    return np.asarray(jax.jit(jax.vmap(one))(ids, seg, pos))


def _packed_row(encoder, params, most: int):
    """``packed_fn`` over one row's ``(ids, segment ids, positions)``: what it reads of a
    row's ``SegmentInfo``, ``most`` outputs."""

    def one(ids, seg, pos):
        segments = types.SimpleNamespace(ids=seg, positions=pos, lengths=np.zeros(most))
        return encoder.packed_fn(params, {"input_ids": ids}, segments)

    return one


def _padded(encoder, params, texts: list[str], length: int = ROW) -> np.ndarray:
    ids = np.zeros((len(texts), length), np.int32)
    lengths = np.zeros(len(texts), np.int32)
    for i, text in enumerate(texts):
        tokens = encoder.tokenizer().encode(text)
        ids[i, : len(tokens)], lengths[i] = tokens, len(tokens)
    fn = jax.jit(jax.vmap(encoder.element_fn, in_axes=(None, 0, 0)))
    return np.asarray(fn(params, {"input_ids": ids}, {"L": lengths}))


def test_the_kernel_takes_these_layers(encoders):
    assert fused.unsupported(encoders[0].config, ROW) is None
    assert fused.unsupported(encoders[0].config, 2 * ROW) is None


def test_padded_elements_match_xla_s_layers(encoders):
    xla, pallas, params = encoders
    texts = tf.sample_texts(3, seed=11) + ["", "a cat"]
    want, got = _padded(xla, params, texts), _padded(pallas, params, texts)
    assert _cosines(got, want).min() >= 0.99999
    assert not np.array_equal(got, want)  # the kernel ran: its sums are in another order
    pallas16, params16 = _bfloat16(pallas, params)
    assert _cosines(_padded(pallas16, params16, texts), want).min() >= BFLOAT16_COSINE


def test_packed_rows_match_xla_s_layers_and_row_mates_change_nothing(encoders):
    xla, pallas, params = encoders
    texts = tf.sample_texts(4, seed=12)  # at most 48 tokens each
    rows = [texts[:2], texts[2:], [texts[1]]]  # texts[1] with a row-mate, then alone
    want, got = _packed(xla, params, rows), _packed(pallas, params, rows)
    real = np.linalg.norm(want, axis=-1) > 0
    assert np.array_equal(real, np.linalg.norm(got, axis=-1) > 0)  # empty segments stay zeros
    assert _cosines(got[real], want[real]).min() >= 0.99999
    assert _cosines(got[0, 1], got[2, 0]) >= 0.999999
    pallas16, params16 = _bfloat16(pallas, params)
    got16 = _packed(pallas16, params16, rows)
    assert _cosines(got16[real], want[real]).min() >= BFLOAT16_COSINE
    assert _cosines(got16[0, 1], got16[2, 0]) >= 0.999999


def test_layers_the_kernel_does_not_take_run_as_xla_s(tmp_path):
    narrow = tf.write_tiny_mpnet(tmp_path / "narrow")  # 64 wide: half a lane group
    xla = SentenceEncoder.from_dir(str(narrow), max_length=48)
    assert "hidden size 64" in fused.unsupported(xla.config, ROW)
    params = xla.load_params()
    texts = tf.sample_texts(3, seed=13)
    pallas = dataclasses.replace(xla, layer_kernel="pallas")
    assert np.array_equal(_padded(pallas, params, texts, 64), _padded(xla, params, texts, 64))
    assert "rows of 64 tokens" in fused.unsupported(SentenceEncoder.from_dir().config, 64)
    minilm = SentenceEncoder.from_dir(max_length=48)
    params = minilm.load_params()
    short = dataclasses.replace(minilm, layer_kernel="pallas")
    assert np.array_equal(_padded(short, params, texts, 64), _padded(minilm, params, texts, 64))


def test_a_gpu_keeps_xla_s_layers_and_a_cpu_runs_the_interpreter(encoders, monkeypatch):
    """The kernel is written for a TPU's VMEM: a GPU would otherwise get the interpreter."""
    config = encoders[0].config
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert fused.unsupported(config, ROW) == "the gpu backend (the kernel is written for a TPU)"
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert fused.unsupported(config, ROW) is None


@pytest.mark.parametrize("matmuls", ["float32", "bfloat16"])
def test_the_kernel_lowers_for_a_tpu(encoders, matmuls, monkeypatch):
    """Traced as on a TPU (not interpreted) and lowered for one from here: Pallas's TPU
    lowering of every layer, padded rows of 128 and 256 tokens (where the model has the
    positions) and packed rows, each a Mosaic kernel in the program (what only the chip's
    own compiler then checks further). The layers share one shape, so the program holds
    the kernel once (lowered once, which keeps a worker's start short), called per layer."""
    xla, pallas, params = encoders
    if matmuls == "bfloat16":
        pallas, params = _bfloat16(pallas, params)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    info = types.SimpleNamespace(vmem_capacity_bytes=128 * 2**20)  # a v5e's VMEM
    monkeypatch.setattr(fused.pltpu, "get_tpu_info", lambda: info, raising=False)
    layers = len(params["layers"])

    def kernels(fn, *args) -> tuple[int, int]:
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
        return text.count("tpu_custom_call"), text.count("call @_layer(")

    padded = jax.vmap(pallas.element_fn, in_axes=(None, 0, 0))
    for length in [n for n in (ROW, 2 * ROW) if n <= pallas.config.max_tokens]:
        ids, lengths = np.ones((4, length), np.int32), np.full(4, length, np.int32)
        assert kernels(padded, params, {"input_ids": ids}, {"L": lengths}) == (1, layers)

    rows, positions = np.ones((4, ROW), np.int32), np.tile(np.arange(ROW, dtype=np.int32), (4, 1))
    assert kernels(jax.vmap(_packed_row(pallas, params, 3)), rows, rows, positions) == (1, layers)


def test_an_unknown_layer_kernel_is_refused_naming_the_known_ones():
    with pytest.raises(bj.SpecError, match=r"one of \('auto', 'xla', 'pallas'\), got 'mosaic'"):
        SentenceEncoder.from_dir(layer_kernel="mosaic")


def test_auto_runs_the_kernel_on_a_tpu_and_xla_s_layers_elsewhere(encoders, monkeypatch):
    """The default: each layer one kernel where the backend is a TPU, decided where the model
    is traced; a CPU keeps XLA's layers (bitwise), not the interpreter."""
    xla, _, params = encoders
    auto = dataclasses.replace(xla, layer_kernel="auto")
    assert SentenceEncoder.from_dir().layer_kernel == "auto"
    assert auto.resolved_layer_kernel() == "xla"
    texts = tf.sample_texts(2, seed=15)
    assert np.array_equal(_padded(auto, params, texts), _padded(xla, params, texts))
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert auto.resolved_layer_kernel() == "pallas"
    assert fused.resolve("xla") == "xla" and fused.resolve("auto") == "pallas"
    # A TPU host's CPU, named as the default device: XLA's layers, and an explicit
    # "pallas" runs in the interpreter there rather than lowering for the TPU.
    with jax.default_device(jax.devices("cpu")[0]):
        assert auto.resolved_layer_kernel() == "xla"
        assert np.array_equal(_padded(auto, params, texts), _padded(xla, params, texts))
        pallas = dataclasses.replace(xla, layer_kernel="pallas")
        got = _padded(pallas, params, texts)
        assert _cosines(got, _padded(xla, params, texts)).min() >= 0.99999
    with jax.default_device("cpu"):
        assert fused.resolve("auto") == "xla"


def test_a_pipeline_embeds_packed_rows_with_the_kernel_and_keeps_dead_letters(tmp_path):
    model = str(FAMILIES["mpnet"](tmp_path / "mpnet"))
    xla = SentenceEncoder.from_dir(model)
    pallas = dataclasses.replace(xla, layer_kernel="pallas")
    texts = tf.sample_texts(12, seed=14)
    want = _padded(xla, xla.load_params(), texts)
    lengths = [len(xla.tokenizer().encode(t)) for t in texts]
    packing = bj.plan_packing(lengths, max_size=ROW, buffer_size=len(texts))
    elements = list(enumerate(texts)) + [(99, None)]

    def check(pairs):
        assert sorted(i for i, _ in pairs) == list(range(len(texts)))
        got = np.array([vector for _, vector in sorted(pairs, key=lambda kv: kv[0])])
        assert _cosines(got, want).min() >= 0.99999

    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        vectors, dead = (
            p
            | beam.Create(elements)
            | EmbedTexts(pallas, max_batch_size=8, batching=packing).with_exception_handling()
        )
        assert_that(vectors, check)
        assert_that(
            dead | beam.Map(lambda record: record.key),
            lambda ids: ids == [99] or pytest.fail(str(ids)),
            label="Dead",
        )


def test_the_flagship_runs_the_kernel_with_layer_kernel_pallas(tmp_path, monkeypatch):
    from tests import flagship as ft

    traced = []  # the layers traced through the kernel, every compiled shape's (its own
    # cache below: a program stored whole by another test would load untraced)
    kernel = fused.layer
    monkeypatch.setattr(fused, "layer", lambda *a: traced.append(a[0].shape) or kernel(*a))

    model = FAMILIES["mpnet"](tmp_path / "mpnet")
    xla = SentenceEncoder.from_dir(str(model))
    texts = tf.sample_texts(10, seed=15)
    rows = [{"id": i, "text": t} for i, t in enumerate(texts)] + [{"id": 99, "text": None}]
    source = ft.write_json_lines(tmp_path / "in.jsonl", rows)
    flags = ("--model_dir", str(model), "--layer_kernel", "pallas", "--matmuls", "float32",
             "--batching", "buckets", "--buckets", str(ROW),
             "--compilation_cache_dir", str(tmp_path / "cache"))  # fmt: skip
    ft.run(source, tmp_path / "out", *flags, "--no-progress")
    table, failed = ft.read_outputs(tmp_path / "out")
    assert [d["id"] for d in failed] == [99]
    assert traced and len(traced) % 2 == 0  # both layers of every shape compiled
    order = np.argsort(table.column("id").to_numpy())
    got = np.array(table.column("embedding").to_pylist())[order]
    assert sorted(ft.ids(table)) == list(range(len(texts)))
    assert _cosines(got, _padded(xla, xla.load_params(), texts)).min() >= 0.99999


def test_a_batch_runs_in_blocks_of_rows_as_each_row_alone(tmp_path):
    model = FAMILIES["xlm-roberta"](tmp_path / "xlmr")  # 128 wide: 9 rows of 128 in 3 blocks
    config = SentenceEncoder.from_dir(str(model)).config
    layer = jax.tree.map(jax.numpy.asarray, SentenceEncoder.from_dir(str(model)).load_params())
    layer = mm.cast_dense(layer, "bfloat16")["layers"][0]
    rng = np.random.default_rng(16)
    x = rng.normal(size=(9, ROW, config.hidden_size)).astype(np.float32)
    bias = np.where(rng.random((9, ROW, ROW)) < 0.8, 0, -1e30).astype(np.float32)
    blocks = jax.jit(jax.vmap(lambda x, b: fused.layer(x, b, layer, config)))(x, bias)
    alone = [fused.layer(x[i], bias[i], layer, config) for i in (0, 4, 8)]
    np.testing.assert_allclose(np.asarray(blocks)[[0, 4, 8]], np.stack(alone), atol=1e-5)
    # Weights that differ by row: the kernel mapped row by row.
    twice = jax.tree.map(lambda w: jax.numpy.stack([w, 2 * w]), layer)
    mapped = jax.vmap(lambda w, x, b: fused.layer(x, b, w, config))(twice, x[:2], bias[:2])
    np.testing.assert_allclose(np.asarray(mapped)[0], np.asarray(alone[0]), atol=1e-5)
    assert not np.allclose(np.asarray(mapped)[1], np.asarray(blocks)[1], atol=1e-2)
