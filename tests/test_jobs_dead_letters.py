"""beam_jax.jobs: dead letters as JSON lines of FailedElement, written and read back."""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax import jobs

FIELDS = [
    "key",
    "key_type",
    "source",
    "row",
    "stage",
    "error_type",
    "message",
    "element",
    "traceback",
]


def _record(key="r1", stage="validation", message="expected a string 'text', got null", **kw):
    return bj.FailedElement.from_error(
        "InvalidElementError", message, stage=stage, element="{'id': 'r1'}", key=key, **kw
    )


def _back(line: str) -> bj.FailedElement:
    return bj.FailedElement.from_dict(json.loads(line))


def test_a_line_holds_the_record_s_fields_origin_first_and_reads_back_equal():
    record = _record(source="data/a.jsonl", row=4)
    line = jobs.dead_letter_json(record)
    fields = json.loads(line)
    assert list(fields) == FIELDS and "\n" not in line
    assert (fields["key"], fields["source"], fields["row"]) == ("r1", "data/a.jsonl", 4)
    assert _back(line) == record
    assert line == record.to_json()  # one writer, whichever way it is called


@pytest.mark.parametrize(
    "key", [7, True, "é", 1.5, None, (1, "a"), (("x", 2), 3.5), b"raw", [1, 2], {"a": 1}]
)
def test_every_key_reads_back_as_the_record_held_it(key):
    record = _record(key=key)
    back = _back(jobs.dead_letter_json(record))
    assert back == record
    assert (back.key_type is None) == (not isinstance(key, bytes | list | dict))


def test_with_origin_files_a_record_under_another_key_source_and_row():
    record = _record(source="x", row=1).with_origin(key=b"id-9", source="y.jsonl", row=12)
    origin = (record.key, record.key_type, record.source, record.row)
    assert origin == ("id-9", "bytes", "y.jsonl", 12)
    assert _back(jobs.dead_letter_json(record)) == record
    kept = _record(source="x", row=1).with_origin(row=2)
    assert (kept.key, kept.source, kept.row) == ("r1", "x", 2)


def test_text_is_utf8_unless_a_lone_surrogate_needs_escaping():
    line = jobs.dead_letter_json(_record(key="naïve"))
    assert "naïve" in line
    record = _record(message="bad \ud800 here")
    line = jobs.dead_letter_json(record)
    line.encode("utf-8")  # escaped, so it encodes
    assert _back(line) == record


def test_only_a_failed_element_is_written():
    with pytest.raises(TypeError, match="FailedElement"):
        jobs.dead_letter_json({"key": 1})


def test_write_dead_letters_writes_json_lines_read_back_as_the_records(tmp_path):
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
    back = list(jobs.read_dead_letters(str(tmp_path / "_failed" / "*.jsonl")))
    assert sorted(back, key=lambda r: r.row) == records
    counts = bj.metric_totals(result, "t")
    assert counts == {"dead_letters_read": 1, "dead_letters_validation": 2,
                      "dead_letters_tokenize": 1}  # fmt: skip


def test_read_dead_letters_names_a_line_that_is_no_dead_letter(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(jobs.dead_letter_json(_record()) + "\n\n" + json.dumps({"id": 1}) + "\n")
    with pytest.raises(ValueError, match=r"line 3 of .*bad.jsonl is not a dead letter"):
        list(jobs.read_dead_letters(str(path)))
    assert list(jobs.read_dead_letters(str(tmp_path / "none-*.jsonl"))) == []


def test_write_dead_letters_writes_no_file_when_nothing_failed(tmp_path):
    with beam.Pipeline("FnApiRunner") as pipeline:
        empty = pipeline | beam.Create([], reshuffle=False).with_output_types(bj.FailedElement)
        _ = empty | jobs.WriteDeadLetters(str(tmp_path / "_failed" / "score"))
    assert not list(tmp_path.rglob("*.jsonl"))


def test_write_dead_letters_needs_a_prefix():
    with pytest.raises(bj.SpecError, match="file_path_prefix"):
        jobs.WriteDeadLetters("")
