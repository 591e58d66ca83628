"""The flagship's columnar path (pipelines/embed_columnar.py), end to end and in parts.

The columnar path must write what the per-element path writes: the same parts, the same
embeddings, the same dead letters. The end-to-end tests run both on the same awkward
files and compare every output file; the others check the pieces (keys, cutting results
into parts), a resume after a failed run, and a second real corpus against
sentence-transformers.
"""

from __future__ import annotations

import glob
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jax.testing import assert_conserved
from pipelines import column_parts as cp
from pipelines import text_rows as tr
from tests import flagship as ft

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
MIN_COSINE = 0.9999


def _outputs(out: pathlib.Path) -> tuple[dict[str, pa.Table], dict[str, list[dict]]]:
    """Every embeddings part (by name) and every dead-letter file's lines (by name)."""
    parts = {pathlib.Path(p).name: pq.read_table(p) for p in glob.glob(str(out / "*.parquet"))}
    failed = {}
    for path in glob.glob(str(out / "_failed" / "*.jsonl")):
        lines = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
        failed[pathlib.Path(path).name] = [
            {k: v for k, v in d.items() if k != "traceback"} for d in lines
        ]
    return parts, failed


def test_keys_split_back_and_results_are_cut_by_part():
    keys = np.array([cp.row_key(0, 5), cp.row_key(0, 6), cp.row_key(2, 5), cp.row_key(0, 2**39)])
    files, rows = cp.split_keys(keys)
    assert files.tolist() == [0, 0, 2, 0] and rows.tolist() == [5, 6, 5, 2**39]
    batch = pa.record_batch({"key": keys, "output": pa.array([1.0, 2.0, 3.0, 4.0])})
    cut = dict(cp.results_by_part(batch, part_rows=6))
    assert sorted(cut) == [(0, 0), (0, 6), (0, 2**39 // 6 * 6), (2, 0)]
    assert cut[(0, 0)].column("output").to_pylist() == [1.0]
    assert cut[(2, 0)].column("output").to_pylist() == [3.0]
    whole = list(cp.results_by_part(batch.slice(0, 2), part_rows=10))
    assert len(whole) == 1 and whole[0][1].num_rows == 2  # one part: the batch as it is


def test_columnar_writes_what_the_per_element_path_writes(tmp_path):
    texts = ft.texts(30)
    raw = [t.encode() for t in texts]
    raw[3] = b"caf\xe9 au lait"  # not UTF-8: this batch is checked value by value
    raw[4] = b""  # empty: embedded as [CLS] [SEP]
    raw[5] = b" " * (tr.MAX_TOKENIZED_CHARS + 10) + b"word"  # too long to be prose
    raw[6] = b"enormous prose " * (tr.MAX_TOKENIZED_CHARS // 10)  # embedded from its start
    text = pa.array(raw, pa.binary()).view(pa.string())
    ids = pa.array([*range(25), None, *range(26, 30)], pa.int32())
    text = pa.concat_arrays([text.slice(0, 7), pa.array([None], pa.string()), text.slice(8)])
    pq.write_table(pa.table({"id": ids, "text": text}), tmp_path / "a.parquet")
    # A second file whose ids are int64, one beyond int32: the run's type is the first's.
    pq.write_table(
        pa.table({"id": pa.array([40, 2**40, 42], pa.int64()), "text": ["one", "two", "   "]}),
        tmp_path / "b.parquet",
    )
    source = tmp_path / "*.parquet"
    flags = ("--rows_per_part", "4")  # parts cut the reader's batches

    columnar = ft.run(source, tmp_path / "columnar", *flags)
    per_element = ft.run(source, tmp_path / "per_element", *flags, "--per_element")

    parts, failed = _outputs(tmp_path / "columnar")
    want_parts, want_failed = _outputs(tmp_path / "per_element")
    assert sorted(parts) == sorted(want_parts) and len(parts) == 8 + 1
    for name, table in parts.items():
        want = want_parts[name]
        assert table.schema == want.schema and table.column("id") == want.column("id"), name
        got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        expected = np.stack(want.column("embedding").to_numpy(zero_copy_only=False))
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert failed == want_failed
    stages = sorted(((d["id"], d["row"], d["stage"]) for f in failed.values() for d in f), key=repr)
    assert stages == sorted(
        [(3, 3, "validation"), (5, 5, "tokenize"), (7, 7, "validation"),
         (None, 25, "validation"), (2**40, 1, "validation")],
        key=repr,
    )  # fmt: skip
    for summary in (columnar, per_element):
        assert (summary.rows, summary.results, summary.dead_letters) == (33, 28, 5)
        stages = {k: n for k, n in summary.dead_letters_by_stage.items() if n}
        assert stages == {"validation": 4, "tokenize": 1}
        assert_conserved(summary.totals())
        assert_conserved(summary.kernel)


class FailAfterParts(cp.WritePartColumns):
    """Fails the job right after writing its second part, the first time only."""

    failed = False

    def process(self, element):
        yield from super().process(element)
        type(self).written = getattr(type(self), "written", 0) + 1
        if type(self).written >= 2 and not FailAfterParts.failed:
            FailAfterParts.failed = True
            raise RuntimeError("a worker fault after two parts")


def test_columnar_run_resumes_after_a_failure(tmp_path, monkeypatch):
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(12)), "text": ft.texts(12)}), source)
    out, flags = tmp_path / "out", ("--rows_per_part", "3")  # 4 parts
    monkeypatch.setattr(cp, "WritePartColumns", FailAfterParts)

    with pytest.raises(Exception, match="a worker fault after two parts"):
        ft.run(source, out, *flags)
    summary = ft.run(source, out, *flags)

    table, failed = ft.read_outputs(out)
    assert sorted(ft.ids(table)) == list(range(12)) and not failed
    assert summary.parts_reused == 2 and summary.parts_written == 2
    assert summary.rows == summary.results == 6  # the reused parts' rows are not read again


def test_second_corpus_matches_sentence_transformers(tmp_path):
    meta = json.loads((FIXTURES / "minilm_reference_topics.json").read_text(encoding="utf-8"))
    with np.load(FIXTURES / "minilm_reference_topics.npz", allow_pickle=False) as npz:
        embeddings, full_lengths = npz["embeddings"], npz["full_lengths"]
    texts = meta["texts"]
    assert len(texts) >= 100 and (full_lengths > 256).sum() >= 10
    source = tmp_path / "topics.parquet"
    pq.write_table(pa.table({"id": [f"t{i}" for i in range(len(texts))], "text": texts}), source)
    # Few shapes, few compiles: the model's answer does not depend on the buckets.
    flags = ["--buckets", "32,64,128,256", "--batch_sizes", "8,32"]

    summary = ft.run(source, tmp_path / "out", *flags)

    table, failed = ft.read_outputs(tmp_path / "out")
    assert not failed and summary.results == len(texts)
    order = np.argsort([int(i[1:]) for i in ft.ids(table)])
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[order]
    cos = np.sum(got * embeddings, 1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(embeddings, axis=1)
    )
    worst = int(np.argmin(cos))
    assert cos[worst] >= MIN_COSINE, (cos[worst], texts[worst][:80])
