"""beam_jax.text.EmbedText through real pipelines: texts of record batches to embeddings."""

from __future__ import annotations

import json
import pathlib
import uuid

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax.text import EmbedText, SentenceEncoder

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def reference():
    texts = json.loads((FIXTURES / "minilm_reference.json").read_text(encoding="utf-8"))["texts"]
    with np.load(FIXTURES / "minilm_reference.npz", allow_pickle=False) as npz:
        return texts[:40], npz["embeddings"][:40]


def _write(batch: pa.RecordBatch, directory: str) -> None:
    pq.write_table(pa.Table.from_batches([batch]), f"{directory}/{uuid.uuid4().hex}.parquet")


def _read(directory: pathlib.Path, id_column: str = "doc") -> dict:
    tables = [pq.read_table(f) for f in sorted(directory.glob("*.parquet"))]
    if not tables:
        return {}
    table = pa.concat_tables(tables)
    return dict(
        zip(table.column(id_column).to_pylist(), table.column("embedding").to_pylist(), strict=True)
    )


def _write_dead(record: bj.FailedElement, directory: str) -> None:
    _write(pa.record_batch({"dead": [repr((record.key, record.stage))]}), directory)


def _run(batches, embed, directory: pathlib.Path):
    """Runs ``embed`` on ``batches``; returns ``{id: embedding}`` and the dead letters'
    ``(key, stage)``."""
    (directory / "dead").mkdir(parents=True)
    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        vectors, failed = p | beam.Create(batches, reshuffle=False) | embed
        _ = vectors | beam.Map(_write, str(directory))
        _ = failed | beam.Map(_write_dead, str(directory / "dead"))
    got = _read(directory)
    dead = [
        v
        for f in (directory / "dead").glob("*.parquet")
        for v in (pq.read_table(f).to_pydict().get("dead") or [])
    ]
    return got, dead


def _cosines(got: dict, expected: np.ndarray) -> np.ndarray:
    vectors = np.array([got[i] for i in range(len(expected))])
    norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1)
    return (vectors * expected).sum(1) / norms


def test_bucketed_and_packed_embed_like_sentence_transformers(reference, tmp_path):
    texts, expected = reference
    batch = pa.record_batch({"doc": list(range(len(texts))), "body": texts})
    encoder = SentenceEncoder.from_dir()
    lengths = [len(ids) for ids in encoder.tokenizer().encode_arrow(pa.array(texts))[0].to_pylist()]
    packing = bj.plan_packing(lengths, max_size=encoder.max_length, buffer_size=len(texts))
    runs = {}
    for name, batching in (("buckets", None), ("packed", packing)):
        embed = EmbedText(encoder, text_column="body", id_column="doc", batching=batching)
        runs[name], dead = _run([batch.slice(0, 25), batch.slice(25)], embed, tmp_path / name)
        assert not dead and sorted(runs[name]) == list(range(len(texts)))
        assert _cosines(runs[name], expected).min() >= 0.9999, name
    assert (
        _cosines(runs["packed"], np.array([runs["buckets"][i] for i in range(len(texts))])).min()
        >= 0.99999
    )


def test_bad_rows_are_dead_letters_with_their_file_and_row(tmp_path):
    path = tmp_path / "in.parquet"
    texts = pa.array([b"A fine text.", None, b"caf\xe9", b""], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"doc": [10, 11, 12, 13], "body": texts}), path)
    out = tmp_path / "out"
    out.mkdir()
    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        vectors, failed = (
            p | bj.ReadArrowBatches(str(path)) | EmbedText(text_column="body", id_column="doc")
        )
        _ = vectors | beam.Map(_write, str(out))
        assert_that(
            failed | beam.Map(lambda r: (r.key, r.stage, r.source, r.row)),
            equal_to([(11, "validation", str(path), 1), (12, "validation", str(path), 2)]),
        )
    got = _read(out)
    assert sorted(got) == [10, 13] and len(got[13]) == 384  # an empty text is embedded


def test_a_missing_column_or_a_bad_configuration_is_refused(tmp_path):
    with pytest.raises(bj.SpecError, match="two different names"):
        EmbedText(text_column="x", id_column="x")
    with pytest.raises(bj.SpecError, match="encoder has no"):
        EmbedText(object())
    with pytest.raises(bj.SpecError, match="batching must be"):
        EmbedText(batching="packed")
    with pytest.raises(Exception, match="needs the columns"):
        _run([pa.record_batch({"id": [1], "words": ["x"]})], EmbedText(), tmp_path / "out")


def test_an_accelerator_hint_and_reshuffles_around_it_change_no_result(tmp_path):
    # Tokenizing and embedding are one step: a resource hint on it (its own environment,
    # fused with nothing) or a Reshuffle before and after it gives the same results and
    # dead letters.
    texts = ["A fine text.", None, "Another one.", "   ", "Short."] * 4
    batches = [
        pa.record_batch({"doc": list(range(i, i + 5)), "body": texts[i : i + 5]})
        for i in range(0, 20, 5)
    ]
    plain = EmbedText(text_column="body", id_column="doc")
    hinted = EmbedText(text_column="body", id_column="doc", accelerator="type:nvidia-tesla-t4")

    class Broken(beam.PTransform):
        def expand(self, pcoll):
            vectors, failed = pcoll | beam.Reshuffle() | hinted
            return vectors | "After" >> beam.Reshuffle(), failed | "Dead" >> beam.Reshuffle()

    want, want_dead = _run(batches, plain, tmp_path / "plain")
    got, dead = _run(batches, Broken(), tmp_path / "broken")

    assert sorted(dead) == sorted(want_dead) and len(dead) == 4
    assert sorted(got) == sorted(want) and len(got) == 16
    for key, vector in want.items():
        np.testing.assert_allclose(got[key], vector, atol=1e-6)
