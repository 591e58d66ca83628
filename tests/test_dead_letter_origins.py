"""Every path's dead letters, read back with ``FailedElement.from_dict``, say where their row
came from: the flagship, curate, Beam YAML, the library's ``EmbedText`` and RunInference.

Each path gets a few rows and one or two bad ones, among them a model-stage failure (a
kernel that raises on one input) where the path lets a test give it its kernel. A tiny BERT
keeps the text paths' compiles short.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import pathlib

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.ml.inference.base import RunInference

import beam_jax as bj
from beam_jax import jobs
from beam_jax.text import EmbedText, SentenceEncoder, labelled_corpus
from tests import tiny_bert
from tests.beam_helpers import pipeline, run
from tests.kernels import SENTINEL, D, attention_params, masked_attention_pool

PROVIDER = pathlib.Path(__file__).resolve().parent.parent / "pipelines" / "beam_jax_provider.yaml"

POISON = "river"  # a text holding this word makes the faulty encoder's kernel raise
TEXTS = ["the cat sat on the mat", "a dog ran", None, "big red house", "the river ran", "it is"]
NULL_ROW, POISON_ROW = 2, 4  # validation; kernel (after a dropped row: rows are not contiguous)


def read_back(pattern: str) -> list[bj.FailedElement]:
    """Every line of every dead-letter file matching ``pattern``, as a ``FailedElement``."""
    lines = [line for p in sorted(glob.glob(pattern)) for line in open(p).read().splitlines()]
    return [bj.FailedElement.from_dict(json.loads(line)) for line in lines]


def _origins(records: list[bj.FailedElement]) -> list[tuple]:
    return sorted((r.key, r.source, r.row, r.stage) for r in records)


def _fault(ids):
    poison = tiny_bert.VOCAB.index(POISON)
    if np.any(ids == poison):
        raise ValueError(f"the kernel refuses token {poison} ({POISON!r})")
    return np.zeros(ids.shape[:-1], np.float32)


def _faulted(ids):
    shape = jax.ShapeDtypeStruct(ids.shape[:-1], jnp.float32)
    return jax.pure_callback(_fault, shape, ids, vmap_method="broadcast_all")


@dataclasses.dataclass(frozen=True)
class FaultyEncoder(SentenceEncoder):
    """The encoder, but its kernels raise on a text holding ``POISON`` (a model-stage
    failure of that row alone, once the batch is bisected)."""

    def element_fn(self, params, element, lengths):
        return super().element_fn(params, element, lengths) + _faulted(element["input_ids"])

    def packed_fn(self, params, element, segments):
        return super().packed_fn(params, element, segments) + _faulted(element["input_ids"])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_bert")
    return str(tiny_bert.write_tiny_bert(path, layers=1, hidden=16, heads=2, intermediate=32))


@pytest.fixture(scope="module")
def faulty(tiny_model) -> FaultyEncoder:
    encoder = SentenceEncoder.from_dir(tiny_model)
    fields = {f.name: getattr(encoder, f.name) for f in dataclasses.fields(encoder) if f.init}
    return FaultyEncoder(**fields)


def _texts_parquet(path: pathlib.Path) -> str:
    ids = pa.array(range(100, 100 + len(TEXTS)), pa.int64())
    pq.write_table(pa.table({"id": ids, "text": pa.array(TEXTS, pa.string())}), path)
    return str(path)


def _want_texts(path: str, model_stage: str = "kernel") -> list[tuple]:
    return [(100 + NULL_ROW, path, NULL_ROW, "validation"),
            (100 + POISON_ROW, path, POISON_ROW, model_stage)]  # fmt: skip


@pytest.mark.parametrize("batching", ["buckets", "packed"])
def test_embed_text_files_every_stage_under_the_rows_file_and_row(faulty, tmp_path, batching):
    source = _texts_parquet(tmp_path / "in.parquet")
    packed = bj.Packing(row_lengths=32, rows_per_batch=2, max_segments=4)
    batching = packed if batching == "packed" else bj.Bucketing(boundaries={"L": (32,)})
    p = pipeline()
    _, failed = p | bj.ReadArrowBatches(source) | EmbedText(faulty, batching=batching)
    _ = failed | jobs.WriteDeadLetters(str(tmp_path / "_failed" / "embed"))
    run(p)
    assert _origins(read_back(str(tmp_path / "_failed" / "*.jsonl"))) == _want_texts(source)


def test_the_flagship(faulty, tiny_model, tmp_path):
    from pipelines.embed import job

    source = _texts_parquet(tmp_path / "in.parquet")
    out = tmp_path / "out"
    encoder = job.Encoder(faulty.element_fn, faulty.packed_fn)
    flags = ["--model_dir", tiny_model, "--batching", "buckets", "--matmuls", "float32"]
    job.run(["--input", source, "--output", str(out), "--runner=FnApiRunner", *flags],
            encoder=encoder)  # fmt: skip
    assert _origins(read_back(str(out / "_failed" / "*.jsonl"))) == _want_texts(source)


def test_curate(tmp_path):
    from pipelines import curate

    classes, rows = labelled_corpus(3)
    lines = [{"id": f"r{i}", "text": t, "label": lab} for i, t, lab in rows[:24]]
    lines.insert(5, {"id": "no-text", "label": classes[0]})  # validation
    lines.insert(9, {"id": "blank", "text": "  ", "label": classes[1]})  # tokenize
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    curate.run(["--input", str(source), "--output", str(out), "--passes", "1",
                "--flip_fraction", "0", "--num_buckets", "1", "--batch_sizes", "32",
                "--hash_bits", "6", "--dim", "8", "--runner=FnApiRunner"])  # fmt: skip
    assert _origins(read_back(str(out / "_failed" / "*.jsonl"))) == [
        ("blank", str(source), 9, "tokenize"),
        ("no-text", str(source), 5, "validation"),
    ]


def _yaml_pipeline(texts: str, numbers: str, model: str, output: pathlib.Path) -> str:
    return f"""
pipeline:
  transforms:
    - {{type: ReadRowsWithOrigin, name: ReadTexts, config: {{path: "{texts}"}}}}
    - type: EmbedText
      name: Embed
      input: ReadTexts
      config: {{model_dir: "{model}", error_handling: {{output: failed}}}}
    - {{type: WriteDeadLetters, input: Embed.failed,
        config: {{file_path_prefix: "{output}/embed"}}}}
    - {{type: ReadRowsWithOrigin, name: ReadNumbers, config: {{path: "{numbers}"}}}}
    - type: RunKernelOnRows
      name: Sum
      input: ReadNumbers
      config:
        kernel: tests.kernels.failing_sum
        fields: {{x: {{shape: [L]}}}}
        boundaries: {{L: [4]}}
        error_handling: {{output: failed}}
    - {{type: WriteDeadLetters, input: Sum.failed, config: {{file_path_prefix: "{output}/sum"}}}}
providers:
  - include: "{PROVIDER}"
"""


def test_beam_yaml(tiny_model, tmp_path):
    yaml_transform = pytest.importorskip("apache_beam.yaml.yaml_transform")
    texts = _texts_parquet(tmp_path / "texts.parquet")
    numbers = str(tmp_path / "numbers.parquet")
    xs = [[1.0], [2.0, 3.0], [SENTINEL], [1.0] * 9, [4.0]]  # a kernel fault; too long
    pq.write_table(pa.table({"id": ["a", "b", "c", "d", "e"], "x": xs}), numbers)
    p = pipeline()
    yaml_transform.expand_pipeline(p, _yaml_pipeline(texts, numbers, tiny_model, tmp_path / "f"))
    run(p)
    assert _origins(read_back(str(tmp_path / "f" / "embed-*.jsonl"))) == [
        (100 + NULL_ROW, texts, NULL_ROW, "validation")  # the packaged tiny model has no fault
    ]
    assert _origins(read_back(str(tmp_path / "f" / "sum-*.jsonl"))) == [
        ("c", numbers, 2, "kernel"),
        ("d", numbers, 3, "validation"),
    ]


def test_run_inference(tmp_path):
    # Examples in memory have no file: their key is their origin (FailedInferences(keyed)).
    examples = [(f"k{i}", {"x": np.ones((3, D), np.float32)}) for i in range(3)]
    examples.append(("bad", {"x": np.ones((3, D + 1), np.float32)}))
    handler = bj.KeyedJaxModelHandler(
        masked_attention_pool,
        spec={"x": bj.ArraySpec(("L", D), np.float32)},
        bucketing=bj.Bucketing(boundaries={"L": (4,)}, batch_size=8),
        load_params=attention_params,
        max_batch_duration_secs=None,
    )
    p = pipeline()
    _, other = (
        p | beam.Create(examples, reshuffle=False) | RunInference(handler).with_exception_handling()
    )
    dead = other.failed_inferences | bj.FailedInferences(keyed=True)
    _ = dead | jobs.WriteDeadLetters(str(tmp_path / "_failed" / "inference"))
    run(p)
    records = read_back(str(tmp_path / "_failed" / "*.jsonl"))
    assert _origins(records) == sorted((k, None, None, "inference") for k, _ in examples)
