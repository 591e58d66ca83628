"""MLTransform with the JAX MiniLM as its embeddings manager: same vectors as RunKernel."""

from __future__ import annotations

import json

import apache_beam as beam
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.ml.transforms.base import MLTransform
from apache_beam.testing.util import assert_that

from pipelines.minilm_mltransform import MiniLMEmbeddings, MiniLMTextHandler
from tests.beam_helpers import pipeline, run
from tests.flagship import reference_embeddings, write_json_lines

TEXTS = {
    1: "A cat sat on the mat.",
    2: "MLTransform embeds the text columns of each row.",
    3: "Short.",
    4: "",  # no tokens besides [CLS] and [SEP]: still a vector, as sentence-transformers gives
}


@pytest.fixture(scope="module")
def expected() -> dict:
    """The encoder's embeddings of the texts, each alone, outside Beam."""
    return reference_embeddings({k: t for k, t in TEXTS.items() if t})


def _matches(expected: dict):
    def check(rows):
        got = {row["id"]: np.asarray(row["text"], np.float32) for row in rows}
        assert sorted(got) == sorted(TEXTS)
        for key, vector in got.items():
            assert vector.shape == (384,)
            if key in expected:
                np.testing.assert_allclose(vector, expected[key], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(got[4]), 1.0, rtol=1e-5)

    return check


def _rows_from_parquet(p, tmp_path):
    path = tmp_path / "in.parquet"
    table = pa.table({"id": pa.array(list(TEXTS), pa.int64()), "text": list(TEXTS.values())})
    pq.write_table(table, path)
    return p | beam.io.ReadFromParquet(str(path))


def _rows_from_json_lines(p, tmp_path):
    path = write_json_lines(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in TEXTS.items()])
    return p | beam.io.ReadFromText(str(path)) | beam.Map(json.loads)


@pytest.mark.parametrize("read", [_rows_from_parquet, _rows_from_json_lines])
def test_mltransform_with_minilm_embeddings_equals_run_kernel(tmp_path, expected, read):
    p = pipeline()
    rows = read(p, tmp_path)
    embedded = rows | MLTransform(
        write_artifact_location=str(tmp_path / "artifacts")
    ).with_transform(MiniLMEmbeddings(columns=["text"]))
    assert_that(embedded, _matches(expected))
    run(p)


def test_the_text_handler_compiles_only_listed_shapes():
    handler = MiniLMTextHandler()
    model = handler.load_model()
    vectors = handler.run_inference(["one", "two words", "a somewhat longer text " * 20], model)
    assert [v.shape for v in vectors] == [(384,)] * 3
    plan = handler.plan(num_devices=len(jax.devices()))
    listed = {
        tuple((s, dt.name) for s, dt in plan.leaf_shapes(b, size)) for b, size in plan.shapes()
    }
    compiled = {tuple((s, dt) for s, dt in sig) for sig in model.worker.kernel.compiled_shapes()}
    assert compiled and compiled <= listed
