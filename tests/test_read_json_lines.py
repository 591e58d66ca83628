"""ReadArrowBatches over JSON lines: record batches that know their file and line; each bad
line, cut-short file or unopenable file one dead letter; every other line read."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import socket

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax._src.arrow.json_lines import BadLine, LineBatch, infer_schema, read_json_lines
from beam_jax._src.arrow.origin import origin_of
from tests.beam_helpers import pipeline, run

SCHEMA = pa.schema([("id", pa.int64()), ("text", pa.string())])


def _lines(rows) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def _rows_with_lines(batches) -> list[tuple[str, int, int, str]]:
    """``(file name, line, id, text)`` for every row, from each batch's origin."""
    out = []
    for batch in batches:
        path, first = origin_of(batch)
        for offset, row in enumerate(batch.to_pylist()):
            out.append((os.path.basename(path), first + offset, row["id"], row["text"]))
    return out


def _collect(pcoll, label):
    return pcoll | label >> beam.combiners.ToList()


def _check(expected):
    def check(found):
        assert sorted(_rows_with_lines(found[0])) == sorted(expected)

    return check


@pytest.mark.parametrize("spread", [True, False])
def test_good_files_plain_and_compressed_read_with_their_lines(tmp_path, spread):
    rows = [{"id": i, "text": f"text {i}", "other": [i]} for i in range(25)]
    data = b"\xef\xbb\xbf" + _lines(rows[:10]) + b"\n   \n" + _lines(rows[10:])  # BOM, blanks
    (tmp_path / "a.jsonl").write_bytes(data)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.ndjson.bz2").write_bytes(bz2.compress(data))
    (tmp_path / "d.json.xz").write_bytes(lzma.compress(data))
    (tmp_path / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    (tmp_path / "f.jsonl").write_bytes(data.rstrip(b"\n"))  # no final newline
    (tmp_path / "g.jsonl").write_bytes(b"")  # no rows, no fault
    pq.write_table(pa.table({"id": [100, 101], "text": ["p", "q"]}), tmp_path / "h.parquet")
    lines = [i if i < 10 else i + 2 for i in range(25)]  # two blank lines after row 9
    names = ["a.jsonl", "b.jsonl.gz", "c.ndjson.bz2", "d.json.xz", "e.jsonl.zst", "f.jsonl"]
    expected = [(n, line, i, f"text {i}") for n in names for i, line in enumerate(lines)]
    expected += [("h.parquet", 0, 100, "p"), ("h.parquet", 1, 101, "q")]

    p = pipeline()
    batches, dead = (
        p
        | bj.ReadArrowBatches(
            str(tmp_path / "*"), columns=["id", "text"], max_rows=4, spread=spread
        ).with_exception_handling()
    )
    labels = [t.unique_name for t in p.to_runner_api().components.transforms.values()]
    read = [name for name in labels if name.startswith("ReadArrowBatches")]
    assert any(name.endswith("GroupByKey") for name in read) == spread, read  # a shuffle
    # The JSON-lines files' paths are shuffled once (a file is read whole), not twice.
    json_shuffles = [n for n in read if "Json" in n and n.endswith("GroupByKey")]
    assert len(json_shuffles) == spread, json_shuffles
    assert_that(batches | beam.Map(lambda b: b.num_rows), lambda sizes: max(sizes) <= 4, "Sizes")
    assert_that(_collect(batches, "All"), _check(expected), "Rows")
    assert_that(dead, equal_to([]), label="NoDeadLetters")
    assert_that(
        batches | beam.Map(lambda b: b.schema == SCHEMA), lambda same: all(same), label="Schema"
    )
    run(p)


def test_each_bad_line_is_one_dead_letter_and_the_other_lines_are_read(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        b'{"id": 0, "text": "First."}\n'
        b"not json at all\n"
        b'{"id": 2, "text": "cut off\n'
        b"[1, 2]\n"
        b"\n"  # blank: neither a row nor a dead letter
        b'{"id": 5, "text": "caf\xe9"}\n'  # not UTF-8: the id is read past the bad byte
        b'{"id": "six", "text": "an id of another type"}\n'
        b'{"id": 7, "text": "half a pair \\ud800 here"}\n'  # valid JSON, invalid Unicode
        b'{"id": 8, "text": "a"} {"id": 9, "text": "b"}\n'  # two objects on one line
        b'{"id": 10}\n'  # a missing field is null
        b'{"id": 11, "text": "Last, without a newline."}'
    )
    p = pipeline()
    batches, dead = (
        p | bj.ReadArrowBatches(str(path), schema=SCHEMA, key="id").with_exception_handling()
    )
    expected = [("in.jsonl", 0, 0, "First."), ("in.jsonl", 9, 10, None),
                ("in.jsonl", 10, 11, "Last, without a newline.")]  # fmt: skip
    assert_that(_collect(batches, "All"), _check(expected), "Rows")

    def check_dead(records):
        by_row = {r.row: r for r in records}
        assert sorted(by_row) == [1, 2, 3, 5, 6, 7, 8], sorted(by_row)
        assert all(r.stage == "read" and r.source == str(path) for r in records)
        assert all(r.error_type == "InputLineError" for r in records)
        # Lines from 1 in messages (rows from 0); a dead letter is not told to dead-letter.
        assert all(f"line {r.row + 1} of {path}" in r.message for r in records)
        assert not any("with_exception_handling" in r.message for r in records)
        assert "not valid JSON" in by_row[1].message and "not json at all" in by_row[1].element
        assert "not valid JSON" in by_row[2].message
        assert "JSON list, not an object" in by_row[3].message
        assert "not valid UTF-8" in by_row[5].message and by_row[5].key == 5
        assert "caf\\\\xe9" in by_row[5].element
        assert "do not fit the columns (id: int64" in by_row[6].message
        assert by_row[6].key == "six"
        assert "'text' holds a lone surrogate ('\\ud800' at index 12)" in by_row[7].message
        assert by_row[7].key == 7
        assert "not valid JSON" in by_row[8].message  # "Extra data"
        assert all(r.key is None for r in (by_row[1], by_row[2], by_row[3], by_row[8]))

    assert_that(dead, check_dead, label="Dead")
    result = run(p)
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query()["counters"]
        if c.key.metric.namespace == "beam_jax"
    }
    assert counters["lines_failed"] == 7 and counters["files_read"] == 1


def test_a_bad_line_without_exception_handling_fails_the_job_naming_file_and_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(_lines([{"id": 0, "text": "a"}, b"{broken", {"id": 2, "text": "b"}]))
    p = pipeline()
    _ = p | bj.ReadArrowBatches(str(path))
    with pytest.raises(Exception, match=f"line 2 of {path}: the line is not valid JSON") as e:
        run(p)
    assert "or read with .with_exception_handling() to dead-letter the line" in str(e.value)


def test_a_file_cut_short_keeps_the_lines_before_the_cut(tmp_path):
    rows = [{"id": i, "text": f"text number {i}"} for i in range(3000)]
    data = gzip.compress(_lines(rows))
    cut = tmp_path / "in.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(_lines(rows[:5]))

    p = pipeline()
    batches, dead = (
        p | bj.ReadArrowBatches(str(tmp_path / "*.json*"), max_rows=256).with_exception_handling()
    )
    rows = _collect(batches | beam.FlatMap(lambda b: _rows_with_lines([b])), "Rows")
    both = (
        (
            rows | "KeyRows" >> beam.Map(lambda r: ("k", ("rows", r))),
            dead | "KeyDead" >> beam.Map(lambda r: ("k", ("dead", r))),
        )
        | beam.Flatten()
        | beam.GroupByKey()
        | beam.MapTuple(lambda _, items: (
            [r for kind, v in items if kind == "rows" for r in v],
            [v for kind, v in items if kind == "dead"],
        ))
    )  # fmt: skip

    def check(found):
        ((rows_read, records),) = found
        assert len(records) == 1, records
        (record,) = records
        assert record.source == str(cut) and record.stage == "read"
        assert 0 < record.row < 3000
        assert f"breaks off at line {record.row + 1}" in record.message
        assert "EOFError" in record.message and "lines before it were read" in record.message
        # Every line before the cut, once; none after it.
        cut_ids = sorted(i for name, _, i, _ in rows_read if name == "in.jsonl.gz")
        assert cut_ids == list(range(record.row))
        assert sorted(i for name, _, i, _ in rows_read if name == "whole.jsonl") == list(range(5))

    assert_that(both, check)
    run(p)


def test_files_that_cannot_be_opened_are_one_dead_letter_each(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(_lines([{"id": 1, "text": "Fine."}]))
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "gone.jsonl")  # a link to nothing
    os.mkfifo(tmp_path / "c.jsonl")  # a named pipe: opening it would wait for a writer
    sock = tmp_path / "d.jsonl"
    if len(str(sock)) > 100:
        pytest.skip(f"socket path too long: {sock}")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))  # a socket: open() fails even for root
    locked = tmp_path / "e.jsonl"
    locked.write_bytes(_lines([{"id": 2, "text": "Locked."}]))
    locked.chmod(0)
    try:
        p = pipeline()
        batches, dead = (
            p
            | bj.ReadArrowBatches(
                str(tmp_path / "*.jsonl"), schema=SCHEMA
            ).with_exception_handling()
        )
        assert_that(batches | beam.FlatMap(lambda b: b.column("id").to_pylist()),
                    equal_to([1] if os.geteuid() else [1, 2]))  # fmt: skip

        def check(records):
            by_file = {os.path.basename(r.source): r for r in records}
            unreadable = {"b.jsonl", "c.jsonl", "d.jsonl"} | (
                {"e.jsonl"} if os.geteuid() else set()
            )
            assert set(by_file) == unreadable
            assert all(r.stage == "read" and r.row is None for r in records)
            assert "No such file" in by_file["b.jsonl"].message
            assert "is not a regular file" in by_file["c.jsonl"].message
            assert "is not a regular file" in by_file["d.jsonl"].message
            if os.geteuid():
                assert "Permission denied" in by_file["e.jsonl"].message
            assert all("cannot open JSON-lines file" in r.message for r in records)

        assert_that(dead, check, label="Dead")
        run(p)
    finally:
        server.close()
        locked.chmod(0o644)


def test_types_are_inferred_at_launch_from_the_first_lines(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(
        _lines([b"not json", {"id": "x1", "text": "a", "score": 1}, {"id": "x2", "score": 2.5}])
    )
    schema = infer_schema([str(tmp_path / "a.jsonl")])
    assert schema == pa.schema(
        [("id", pa.string()), ("text", pa.string()), ("score", pa.float64())]
    )
    only = infer_schema([str(tmp_path / "a.jsonl")], columns=["score", "absent"])
    assert only == pa.schema([("score", pa.float64()), ("absent", pa.string())])
    read = bj.ReadArrowBatches(str(tmp_path / "*.jsonl"), columns=["id"])
    assert read.json_schema() == pa.schema([("id", pa.string())])

    (tmp_path / "b.jsonl").write_bytes(_lines([{"id": 1}, {"id": "two"}]))
    with pytest.raises(bj.SpecError, match="two types .*schema=pa.schema"):
        infer_schema([str(tmp_path / "b.jsonl")])


def test_format_names_json_lines_whatever_the_extension_and_arguments_are_checked(tmp_path):
    path = tmp_path / "rows.txt"
    path.write_bytes(_lines([{"id": 3, "text": "c"}]))
    p = pipeline()
    batches = p | bj.ReadArrowBatches(str(path), format="jsonl", schema=SCHEMA)
    assert_that(batches | beam.FlatMap(lambda b: b.to_pylist()), equal_to([{"id": 3, "text": "c"}]))
    run(p)
    with pytest.raises(bj.SpecError, match="format must be one of .* got 'csv'"):
        bj.ReadArrowBatches("x", format="csv")
    with pytest.raises(bj.SpecError, match="schema must be a pyarrow.Schema, got dict"):
        bj.ReadArrowBatches("x", schema={"id": "int"})
    with pytest.raises(bj.SpecError, match=r"columns \['x'\] are not in schema"):
        bj.ReadArrowBatches("x", schema=SCHEMA, columns=["id", "x"])


_LINE = st.one_of(
    st.builds(
        lambda i, t: json.dumps({"id": i, "text": t}).encode(),
        st.integers(-(2**40), 2**40),
        st.text(max_size=30),
    ),  # fmt: skip
    st.builds(lambda i: json.dumps({"id": i}).encode(), st.integers(0, 9)),  # text missing
    st.builds(lambda i: json.dumps({"id": i, "text": "crlf"}).encode() + b"\r", st.integers(0, 9)),
    st.builds(lambda n: json.dumps({"id": n, "text": "long " * n}).encode(), st.integers(0, 99)),
    st.sampled_from(
        [
            b"",
            b"  ",
            b"\r",
            b"{",
            b"[1]",
            b'"s"',
            b'{"id": "s"}',
            b'{"id": 1.5}',
            b'{"id": 1} {"id": 2}',
            b'{"text": "\xff"}',
            b"null",
        ]
    ),  # fmt: skip
)


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(_LINE, max_size=40), block=st.integers(1, 200), max_rows=st.integers(1, 7))
def test_every_line_is_one_row_or_one_bad_line_or_blank(lines, block, max_rows):
    data = b"\n".join(lines)
    items = list(read_json_lines(io.BytesIO(data), SCHEMA, max_rows=max_rows, block_bytes=block))
    seen: dict[int, object] = {}
    for item in items:
        if isinstance(item, LineBatch):
            assert 0 < item.batch.num_rows <= max_rows
            for offset, row in enumerate(item.batch.to_pylist()):
                assert item.first_line + offset not in seen
                seen[item.first_line + offset] = row
        else:
            assert isinstance(item, BadLine) and item.line not in seen
            seen[item.line] = item
    for number, line in enumerate(lines):
        if not line.strip():
            assert number not in seen
            continue
        try:
            value = json.loads(line.decode("utf-8"))
            good = (
                isinstance(value, dict)
                and (value.get("id") is None or type(value["id"]) is int)
                and (value.get("text") is None or isinstance(value["text"], str))
                and (value.get("text") is None or value["text"].encode("utf-8") is not None)
            )
        except (ValueError, UnicodeError):
            good = False
        if good:
            assert seen[number] == {"id": value.get("id"), "text": value.get("text")}, line
        else:
            assert isinstance(seen[number], BadLine), (line, seen[number])
            assert seen[number].text == line
    assert [i.line if isinstance(i, BadLine) else i.first_line for i in items] == sorted(
        i.line if isinstance(i, BadLine) else i.first_line for i in items
    )


def test_bad_lines_in_batches_ride_with_the_rows_around_them(tmp_path):
    """bad_lines="in_batches": a batch's rows span bad and blank lines (each row's line in
    ``beam_jax.row``), each bad line's dead letter travels in the metadata of the batch read
    after it, and a file's bad lines after its last row come in a batch of no rows: every
    line ends in exactly one batch, as a row or as a dead letter of it."""
    from beam_jax.internal import bad_lines_of, row_origin

    rows = [{"id": i, "text": f"text {i}"} for i in range(12)]
    lines = [*rows[:3], b"{broken", *rows[3:6], b"", {"id": "x", "text": "t"}, *rows[6:12], b"[1]"]
    (tmp_path / "a.jsonl").write_bytes(_lines(lines))
    (tmp_path / "bad.jsonl").write_bytes(_lines([b"nope", b'{"id": 1, "text": 2}']))
    p = pipeline()
    batches, dead = (
        p
        | bj.ReadArrowBatches(
            str(tmp_path / "*.jsonl"), schema=SCHEMA, max_rows=5, bad_lines="in_batches"
        ).with_exception_handling()
    )
    found = _collect(batches, "Batches")

    def check(found):
        (batches,) = found
        seen: dict[str, list[tuple[int, str]]] = {}
        for batch in batches:
            path, at = row_origin(batch)
            name = os.path.basename(path)
            if not batch.num_rows:
                rows_at = []
            elif isinstance(at, int):
                rows_at = list(range(at, at + batch.num_rows))
            else:
                rows_at = at.tolist()
            seen.setdefault(name, []).extend((line, "row") for line in rows_at)
            for record in bad_lines_of(batch):
                assert record.source == path and record.stage == "read"
                assert record.message.startswith(f"line {record.row + 1} of {path}: ")
                assert "with_exception_handling" not in record.message
                seen.setdefault(name, []).append((record.row, "bad"))
                # A bad line comes with the batch read after it, before its rows end.
                assert not rows_at or record.row < max(rows_at)
        a = sorted(seen["a.jsonl"])
        assert [n for n, _ in a] == [n for n in range(len(lines)) if n != 7]  # 7: blank
        assert [n for n, kind in a if kind == "bad"] == [3, 8, 15]
        assert sorted(seen["bad.jsonl"]) == [(0, "bad"), (1, "bad")]  # no rows: one batch

    assert_that(found, check)
    assert_that(dead, equal_to([]), label="NoSeparateDeadLetters")
    run(p)


def test_bad_lines_is_checked():
    with pytest.raises(bj.SpecError, match="bad_lines must be one of"):
        bj.ReadArrowBatches("x.jsonl", bad_lines="inline")
