"""beam_jax.jobs: dead letters as JSON lines, alone and written by a Beam pipeline."""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax import jobs

FIELDS = ["id", "file", "row", "stage", "error", "error_type", "message", "element", "traceback"]


def _record(key="r1", stage="validation", message="expected a string 'text', got null", **kw):
    return bj.FailedElement.from_error(
        "InvalidElementError", message, stage=stage, element="{'id': 'r1'}", key=key, **kw
    )


def test_a_line_leads_with_where_the_element_came_from_then_what_went_wrong():
    record = _record(source="data/a.jsonl", row=4)
    line = jobs.dead_letter_json(record)
    fields = json.loads(line)
    assert list(fields) == FIELDS and "\n" not in line
    assert fields["id"] == "r1" and fields["file"] == "data/a.jsonl" and fields["row"] == 4
    assert fields["error"] == "InvalidElementError: expected a string 'text', got null"
    assert fields["element"] == record.element and fields["traceback"] == record.traceback


def test_where_overrides_the_record_s_origin_and_adds_fields_after_it():
    fields = json.loads(
        jobs.dead_letter_json(_record(source="x", row=1), id=None, file="y", part=2)
    )
    assert list(fields)[:4] == ["id", "file", "row", "part"]
    assert (fields["id"], fields["file"], fields["row"], fields["part"]) == (None, "y", 1, 2)
    unknown = json.loads(jobs.dead_letter_json(_record()))
    assert (unknown["file"], unknown["row"]) == (None, None)


@pytest.mark.parametrize(
    ("raw", "written"),
    [(7, 7), (True, True), ("é", "é"), (1.5, "1.5"), ([1, 2], "[1, 2]"), ((1, "a"), [1, "a"])],
)
def test_an_id_json_cannot_hold_as_itself_is_written_as_its_repr(raw, written):
    assert json.loads(jobs.dead_letter_json(_record(), id=raw))["id"] == written
    long = json.loads(jobs.dead_letter_json(_record(), id=[0] * 2000))["id"]
    assert len(long) == 1000 and long.endswith("...")


def test_text_is_utf8_unless_a_lone_surrogate_needs_escaping():
    line = jobs.dead_letter_json(_record(key="naïve"))
    assert "naïve" in line
    line = jobs.dead_letter_json(_record(message="bad \ud800 here"))
    line.encode("utf-8")  # escaped, so it encodes
    assert json.loads(line)["message"] == "bad \ud800 here"


def test_a_tuple_key_is_a_json_list():
    assert json.loads(jobs.dead_letter_json(_record(key=("a", 3))))["id"] == ["a", 3]


def test_write_dead_letters_writes_json_lines_and_counts_them_per_stage(tmp_path):
    records = [_record(key=i, stage=s, source="in.jsonl", row=i) for i, s in
               enumerate(["read", "validation", "validation", "tokenize"])]  # fmt: skip
    prefix = str(tmp_path / "_failed" / "prepare")
    pipeline = beam.Pipeline("FnApiRunner")
    files = pipeline | beam.Create(records) | jobs.WriteDeadLetters(prefix, metrics_namespace="t")
    assert_that(files | beam.Map(lambda p: p.rsplit("/", 1)[1]),
                equal_to(["prepare-00000-of-00001.jsonl"]))  # fmt: skip
    result = pipeline.run()
    result.wait_until_finish()
    lines = (tmp_path / "_failed" / "prepare-00000-of-00001.jsonl").read_text().splitlines()
    assert sorted(lines) == sorted(jobs.dead_letter_json(r) for r in records)
    counts = bj.metric_totals(result, "t")
    assert counts == {"dead_letters_read": 1, "dead_letters_validation": 2,
                      "dead_letters_tokenize": 1}  # fmt: skip


def test_write_dead_letters_writes_no_file_when_nothing_failed(tmp_path):
    with beam.Pipeline("FnApiRunner") as pipeline:
        empty = pipeline | beam.Create([], reshuffle=False).with_output_types(bj.FailedElement)
        _ = empty | jobs.WriteDeadLetters(str(tmp_path / "_failed" / "score"))
    assert not list(tmp_path.rglob("*.jsonl"))


def test_write_dead_letters_needs_a_prefix():
    with pytest.raises(bj.SpecError, match="file_path_prefix"):
        jobs.WriteDeadLetters("")
