"""ReadRowsWithOrigin: files as rows that say where each was read, and the YAML EmbedText's
dead letters filed under that origin."""

from __future__ import annotations

import json

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax.internal import origin_of
from beam_jax.text import IdType
from beam_jax.yaml import OriginFields, ReadRowsWithOrigin, RunKernelOnRows
from tests.beam_helpers import pipeline, run
from tests.flagship import write_json_lines


def _parquet(path, ids, texts, row_group_size=2):
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "text": texts}), path,
                   row_group_size=row_group_size)  # fmt: skip
    return str(path)


def _dead_letter(error_row) -> bj.FailedElement:
    return bj.FailedElement.from_dict(json.loads(error_row.dead_letter))


def test_rows_of_every_file_and_row_group_say_their_file_and_row(tmp_path):
    a = _parquet(tmp_path / "a.parquet", [1, 2, 3, 4, 5], list("abcde"))
    b = _parquet(tmp_path / "b.parquet", [6, 7], ["f", None])
    p = pipeline()
    rows = p | ReadRowsWithOrigin(str(tmp_path / "*.parquet"))
    assert OriginFields().carried_by(rows.element_type)
    got = rows | beam.Map(lambda r: (r.id, r.text, r.source, r.row))
    want = [(i + 1, t, a, i) for i, t in enumerate("abcde")] + [(6, "f", b, 0), (7, None, b, 1)]
    assert_that(got, equal_to(want))
    run(p)


def test_json_lines_rows_say_their_line_and_the_fields_can_be_renamed(tmp_path):
    path = str(write_json_lines(tmp_path / "in.jsonl", [{"id": i, "text": "t"} for i in range(3)]))
    p = pipeline()
    rows = p | ReadRowsWithOrigin(path, columns=["id"], source_field="file", row_field="line")
    assert_that(rows | beam.Map(tuple), equal_to([(i, path, i) for i in range(3)]))
    run(p)


def test_an_origin_field_that_is_already_a_column_is_refused_naming_the_fix(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1], "row": [7]}), path)
    with pytest.raises(bj.SpecError, match=r"already have columns \['row'\].*row_field"):
        pipeline() | ReadRowsWithOrigin(str(path))
    with pytest.raises(bj.SpecError, match="two different non-empty names"):
        ReadRowsWithOrigin(str(path), source_field="row")


def test_with_exception_handling_an_unreadable_file_is_a_dead_letter_naming_it(tmp_path):
    _parquet(tmp_path / "a.parquet", [1], ["a"])
    bad = tmp_path / "b.parquet"
    bad.write_bytes(b"not parquet")
    p = pipeline()
    read = ReadRowsWithOrigin(str(tmp_path / "*.parquet")).with_exception_handling()
    rows, dead = p | read
    assert_that(rows | beam.Map(lambda r: (r.id, r.row)), equal_to([(1, 0)]))
    assert_that(dead | beam.Map(lambda d: (d.stage, d.source)), equal_to([("read", str(bad))]),
                label="Dead")  # fmt: skip
    run(p)


def test_embed_text_files_dead_letters_under_the_rows_file_and_row(tmp_path):
    from pipelines.embed_yaml import EmbedText

    a = _parquet(tmp_path / "a.parquet", [1, 2, 3, None], ["fine", None, "ok", "no id"])
    b = _parquet(tmp_path / "b.parquet", [5, 6], [None, "good"])
    p = pipeline()
    rows = p | ReadRowsWithOrigin(str(tmp_path / "*.parquet")) | beam.Reshuffle()
    out = rows | EmbedText(error_handling={"output": "failed"})
    assert_that(out["output"] | beam.Map(lambda r: r.id), equal_to([1, 3, 6]), label="Good")
    records = out["failed"] | beam.Map(_dead_letter)
    origins = records | beam.Map(lambda d: (d.key, d.source, d.row))
    assert_that(origins, equal_to([(2, a, 1), (None, a, 3), (5, b, 0)]), label="Origins")
    run(p)


def test_embed_text_batches_are_runs_of_one_file_with_its_first_row():
    from pipelines.embed_yaml import _to_batch

    entries = [(3, "c", "a", 2), (1, "a", "a", 0), (9, "z", "b", 5), (2, "b", "a", 1),
               (7, "x", None, None)]  # fmt: skip
    batches = list(_to_batch(entries, IdType.from_name("int")))
    got = [(b.column("id").to_pylist(), origin_of(b)) for b in batches]
    assert got == [([1, 2, 3], ("a", 0)), ([9], ("b", 5)), ([7], (None, None))]


def test_run_kernel_on_rows_files_dead_letters_under_the_named_origin_fields(tmp_path):
    from tests.kernels import SENTINEL

    rows = [{"id": "a", "x": [1.0]}, {"id": "b", "x": [SENTINEL]}, {"id": "c", "x": [2.0]}]
    path = str(write_json_lines(tmp_path / "in.jsonl", rows))
    p = pipeline()
    read = ReadRowsWithOrigin(path, source_field="file", row_field="line")
    run_kernel = RunKernelOnRows(
        "tests.kernels.failing_sum", {"x": {"shape": ["L"]}}, {"L": [4]}, source_field="file",
        row_field="line", error_handling={"output": "failed"},
    )  # fmt: skip
    out = p | read | run_kernel
    assert_that(out["output"] | beam.Map(lambda r: (r.id, r.output)),
                equal_to([("a", [1.0]), ("c", [2.0])]), label="Good")  # fmt: skip
    origins = out["failed"] | beam.Map(_dead_letter) | beam.Map(lambda d: (d.key, d.source, d.row))
    assert_that(origins, equal_to([("b", path, 1)]), label="Origins")
    run(p)
