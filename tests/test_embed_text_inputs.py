"""Bad input to the flagship: each fault ends as a dead letter naming its row or file.

One test per case of docs/reliability.md's flagship table. A row's fault is that row's dead
letter (with its id, file and row); a file's fault is one dead letter naming the file (or
fails the launch, naming it); the good rows are all written, and the job never fails.
"""

from __future__ import annotations

import gzip
import os
import socket

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jax.testing import assert_conserved
from tests import flagship as ft


def _parquet(path, ids, texts, **types):
    columns = {"id": pa.array(ids, types.get("id")), "text": pa.array(texts, types.get("text"))}
    pq.write_table(pa.table(columns), path)
    return path


def _invalid_utf8(values: list[bytes]) -> pa.Array:
    """A string column holding exactly these bytes, valid UTF-8 or not (as buggy writers do)."""
    return pa.array(values, pa.binary()).view(pa.string())


def _only(failed, **fields):
    assert len(failed) == 1, failed
    for name, value in fields.items():
        assert failed[0][name] == value, (name, failed[0])
    return failed[0]


def test_parquet_text_of_invalid_utf8_is_that_rows_dead_letter(tmp_path):
    raw = [t.encode() for t in ft.texts(500)]
    raw[123] = b"caf\xe9 au lait"  # Latin-1, not UTF-8
    raw[321] = b"half a pair \xed\xa0\x80"  # a lone surrogate, encoded as if it were UTF-8
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(500)), "text": _invalid_utf8(raw)}), path)

    summary = ft.run(path, tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == [i for i in range(500) if i not in (123, 321)]
    assert [(d["id"], d["file"], d["row"], d["stage"]) for d in failed] == [
        (123, str(path), 123, "validation"),
        (321, str(path), 321, "validation"),
    ]
    assert all("text is not valid UTF-8" in d["error"] for d in failed)
    assert "xe9" in failed[0]["error"] and "xed" in failed[1]["error"]
    assert summary.rows == 500 and summary.results == 498
    assert_conserved(summary.totals())


def test_parquet_id_of_invalid_utf8_is_that_rows_dead_letter(tmp_path):
    path = tmp_path / "in.parquet"
    ids = _invalid_utf8([b"a", b"b\xff", b"c"])
    pq.write_table(pa.table({"id": ids, "text": ft.texts(3)}), path)

    ft.run(path, tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == ["a", "c"]
    d = _only(failed, id="b\\xff", row=1, stage="validation")
    assert "id is not valid UTF-8" in d["error"]


def test_json_lone_surrogates_in_text_or_id_are_those_rows_dead_letters(tmp_path):
    path = ft.write_json_lines(
        tmp_path / "in.jsonl",
        [
            {"id": "good", "text": "A fine sentence."},
            {"id": "text", "text": "half a pair \ud800 here"},  # valid JSON, invalid Unicode
            {"id": "id-\udc00", "text": "A fine text with a bad id."},
        ],
    )

    summary = ft.run(path, tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert ft.ids(table) == ["good"]
    by_id = {d["id"]: d for d in failed}
    assert set(by_id) == {"text", "id-\udc00"}
    assert "'text' holds a lone surrogate ('\\ud800' at index 12)" in by_id["text"]["error"]
    assert "'id' holds a lone surrogate" in by_id["id-\udc00"]["error"]
    assert {d["stage"] for d in failed} == {"read"}  # the JSON line is no row
    assert_conserved(summary.totals())


def test_json_line_of_invalid_utf8_is_that_rows_dead_letter(tmp_path):
    path = ft.write_json_lines(
        tmp_path / "in.jsonl",
        [
            {"id": 1, "text": "A fine sentence."},
            b'{"id": 2, "text": "caf\xe9"}',
        ],
    )

    ft.run(path, tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert ft.ids(table) == [1]
    d = _only(failed, id=2, row=1, stage="read")  # the id is read past the bad byte
    assert "line is not valid UTF-8" in d["error"]


def test_json_line_without_text_names_the_missing_field(tmp_path):
    path = ft.write_json_lines(tmp_path / "in.jsonl", [{"id": 1, "text": "Fine."}, {"id": 2}])

    ft.run(path, tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    d = _only(failed, id=2, row=1, stage="validation", element="None")
    assert "no 'text' field" in d["error"] and "object at 0x" not in str(d)


def test_broken_json_lines_are_dead_letters_and_the_rest_is_embedded(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        b'{"id": 1, "text": "First."}\n'
        b"not json at all\n"
        b'{"id": 2, "text": "cut off\n'
        b"[1, 2]\n"
        b"\n"  # blank: not a row
        b'{"id": 3, "text": "Last, without a newline."}'
    )

    summary = ft.run(path, tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == [1, 3]
    assert sorted(d["row"] for d in failed) == [1, 2, 3]
    assert all(d["id"] is None and d["stage"] == "read" for d in failed)
    assert summary.rows == 5
    assert_conserved(summary.totals())


def test_json_lines_byte_order_mark_is_not_a_fault(tmp_path):
    path = ft.write_json_lines(tmp_path / "in.jsonl", [{"id": 1, "text": "First."}])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())

    ft.run(path, tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert ft.ids(table) == [1] and not failed


def test_file_with_other_columns_anywhere_in_a_glob_is_named(tmp_path):
    bad = _parquet(tmp_path / "a.parquet", [1, 2], ["x", "y"])
    pq.write_table(pa.table({"key": [1, 2], "body": ["x", "y"]}), bad)  # first in the glob
    _parquet(tmp_path / "b.parquet", [3, 4], ft.texts(2))
    _parquet(tmp_path / "c.parquet", [5], ft.texts(1))

    summary = ft.run(tmp_path / "*.parquet", tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == [3, 4, 5]
    d = _only(failed, id=None, file=str(bad), row=None, stage="read")
    assert "has no column(s) ['id', 'text']; its columns are ['key', 'body']" in d["error"]
    assert summary.unreadable_files == 1


def test_files_with_other_types_dead_letter_their_rows_by_name(tmp_path):
    floats = _parquet(tmp_path / "0.parquet", [0.5], ft.texts(1))  # first: skipped at launch
    _parquet(tmp_path / "a.parquet", [1, 2], ft.texts(2), id=pa.int64())
    _parquet(tmp_path / "b.parquet", [3], ft.texts(1), id=pa.int32())  # narrower ints fit
    _parquet(tmp_path / "c.parquet", [4], [t.encode() for t in ft.texts(1)], text=pa.binary())
    strings = _parquet(tmp_path / "d.parquet", ["5", "6"], ft.texts(2))
    numbers = _parquet(tmp_path / "e.parquet", [7], [3.5])

    ft.run(tmp_path / "*.parquet", tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == [1, 2, 3, 4]
    got = sorted((d["file"], d["row"], d["id"], d["error"].split(": ", 1)[1]) for d in failed)
    assert got == [
        (str(floats), 0, 0.5, "the id 0.5 is a float, but this input's ids are integers (int64)"),
        (str(strings), 0, "5", "the id '5' is a str, but this input's ids are integers (int64)"),
        (str(strings), 1, "6", "the id '6' is a str, but this input's ids are integers (int64)"),
        (str(numbers), 0, 7, "expected a string 'text', got text of type float"),
    ]
    assert all(d["stage"] == "validation" for d in failed)


def test_truncated_parquet_among_good_files_is_named(tmp_path):
    _parquet(tmp_path / "a.parquet", [1, 2], ft.texts(2))
    cut = _parquet(tmp_path / "b.parquet", [3, 4], ft.texts(2))
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    _parquet(tmp_path / "c.parquet", [5], ft.texts(1))

    ft.run(tmp_path / "*.parquet", tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == [1, 2, 5]
    d = _only(failed, file=str(cut), row=None, stage="read")
    assert "magic bytes not found" in d["error"] and str(cut) in d["message"]


def test_parquet_with_a_corrupt_footer_is_named(tmp_path):
    _parquet(tmp_path / "a.parquet", [1], ft.texts(1))
    bad = _parquet(tmp_path / "b.parquet", [2, 3], ft.texts(2))
    data = bytearray(bad.read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    data[-8 - length : -8] = os.urandom(length)  # the metadata, scrambled; magic bytes intact
    bad.write_bytes(bytes(data))

    ft.run(tmp_path / "*.parquet", tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert ft.ids(table) == [1]
    _only(failed, file=str(bad), row=None, stage="read")


def test_compressed_json_lines_cut_short_keep_the_rows_before_the_cut(tmp_path):
    rows = [{"id": i, "text": t} for i, t in enumerate(ft.texts(3000))]
    data = gzip.compress(
        "".join(f'{{"id": {r["id"]}, "text": "{r["text"]}"}}\n' for r in rows).encode()
    )
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])

    summary = ft.run(path, tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    d = _only(failed, file=str(path), stage="read")
    assert 0 < d["row"] < 3000 and f"breaks off at line {d['row'] + 1}" in d["message"]
    assert sorted(ft.ids(table)) == list(range(d["row"]))  # every row before the cut, once
    assert summary.rows == d["row"] and summary.unreadable_files == 1
    assert_conserved(summary.totals())


def test_enormous_text_is_embedded_from_its_first_characters(tmp_path):
    prose = "The quick brown fox jumps over the lazy dog near the river bank. "
    huge = prose * (100 * 2**20 // len(prose))  # 100 MB
    head = huge[:3000].rsplit(" ", 1)[0]  # far more than 256 tokens
    spaces = "word " + " " * 200_000 + "word"  # no 256 tokens in the first 65,536 characters
    # Whitespace at the ends is no text: its tokens are all in the first characters.
    edged = " " * 200_000 + "word" + "\n" * 200_000
    path = _parquet(tmp_path / "in.parquet", [1, 2, 3, 4, 5], [huge, head, spaces, edged, "word"])
    del huge

    ft.run(path, tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == [1, 2, 4, 5]
    vectors = dict(zip(ft.ids(table), table.column("embedding").to_pylist(), strict=True))
    np.testing.assert_allclose(vectors[1], vectors[2], atol=1e-6)  # the same first 256 tokens
    np.testing.assert_allclose(vectors[4], vectors[5], atol=1e-6)
    d = _only(failed, id=3, stage="tokenize", error_type="TextTooLongError")
    assert "200,009 characters" in d["error"] and len(d["element"]) <= 1000


def test_a_file_whose_name_holds_glob_characters_is_read_by_its_name(tmp_path):
    # "data [v1].parquet" as a glob matches "data v.parquet" and the like, not itself: the
    # launch said the --input it was given "matches no file".
    path = _parquet(tmp_path / "data [v1].parquet", [1, 2], ft.texts(2))

    summary = ft.run(path, tmp_path / "out", "--buckets", "16,256")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == [1, 2] and not failed and summary.rows == 2


def test_a_glob_in_the_current_directory_matches_its_files(tmp_path, monkeypatch):
    # Beam lists the directory before a glob's first wildcard, "" for "in-*.parquet": the
    # launch said it matched no file.
    _parquet(tmp_path / "in-1.parquet", [1, 2], ft.texts(2))
    _parquet(tmp_path / "in-2.parquet", [3], ft.texts(1))
    monkeypatch.chdir(tmp_path)

    summary = ft.run("in-*.parquet", tmp_path / "out", "--buckets", "16,256")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == [1, 2, 3] and not failed and summary.rows == 3


def test_empty_json_lines_file_has_no_rows(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"")
    ft.write_json_lines(tmp_path / "b.jsonl", [{"id": 1, "text": "Fine."}])

    summary = ft.run(tmp_path / "*.jsonl", tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert ft.ids(table) == [1] and not failed and summary.rows == 1


def test_empty_parquet_file_is_named_and_one_without_rows_is_not(tmp_path):
    empty = tmp_path / "a.parquet"
    empty.write_bytes(b"")
    _parquet(tmp_path / "b.parquet", pa.array([], pa.int64()), pa.array([], pa.string()))
    _parquet(tmp_path / "c.parquet", [1], ft.texts(1))

    ft.run(tmp_path / "*.parquet", tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert ft.ids(table) == [1]
    d = _only(failed, file=str(empty), row=None, stage="read")
    assert "0 bytes" in d["error"]


def test_empty_glob_fails_the_launch_naming_the_pattern(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match=r"nothing\*\.parquet' matches no file"):
        ft.run(tmp_path / "nothing*.parquet", out)
    assert not out.exists()


def test_files_that_cannot_be_opened_are_named(tmp_path):
    ft.write_json_lines(tmp_path / "a.jsonl", [{"id": 1, "text": "Fine."}])
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "gone.jsonl")  # a link to nothing
    sock = tmp_path / "c.jsonl"
    if len(str(sock)) > 100:
        pytest.skip(f"socket path too long: {sock}")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))  # a socket: open() fails even for root
    try:
        ft.run(tmp_path / "*.jsonl", tmp_path / "out")
    finally:
        server.close()

    table, failed = ft.read_outputs(tmp_path / "out")
    assert ft.ids(table) == [1]
    by_file = {d["file"]: d for d in failed}
    assert set(by_file) == {str(tmp_path / "b.jsonl"), str(sock)}
    assert "No such file" in by_file[str(tmp_path / "b.jsonl")]["error"]
    assert "is not a regular file" in by_file[str(sock)]["error"]
    assert all(d["stage"] == "read" for d in failed)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_file_without_read_permission_is_named(tmp_path):
    ft.write_json_lines(tmp_path / "a.jsonl", [{"id": 1, "text": "Fine."}])
    locked = ft.write_json_lines(tmp_path / "b.jsonl", [{"id": 2, "text": "Locked."}])
    locked.chmod(0)

    ft.run(tmp_path / "*.jsonl", tmp_path / "out")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert ft.ids(table) == [1]
    assert "Permission denied" in _only(failed, file=str(locked), stage="read")["error"]


@pytest.mark.parametrize(
    "path_flags", [["--buckets", "16,256"], ["--batching", "packed"]], ids=["buckets", "packed"]
)
def test_id_and_text_columns_of_other_names(tmp_path, path_flags):
    texts = ft.texts(6) + [None]
    table = pa.table({"doc_id": list(range(100, 107)), "body": texts, "text": ["no"] * 7})
    pq.write_table(table, tmp_path / "docs.parquet")
    pq.write_table(
        pa.table({"id": list(range(100, 107)), "text": texts}), tmp_path / "plain.parquet"
    )
    flags = ["--no-progress", *path_flags]
    summary = ft.run(
        tmp_path / "docs.parquet",
        tmp_path / "out",
        "--id_column",
        "doc_id",
        "--text_column",
        "body",
        *flags,
    )
    assert summary.results == 6 and summary.dead_letters == 1
    got, failed = ft.read_outputs(tmp_path / "out")
    ft.run(tmp_path / "plain.parquet", tmp_path / "plain", *flags)
    want, _ = ft.read_outputs(tmp_path / "plain")
    assert got.schema.names == ["id", "embedding"]
    assert sorted(ft.ids(got)) == list(range(100, 106))
    got, want = got.sort_by("id"), want.sort_by("id")
    vectors = [np.array(t.column("embedding").to_pylist()) for t in (got, want)]
    np.testing.assert_array_equal(*vectors)
    assert [d["id"] for d in failed] == [106]


def test_json_lines_fields_of_other_names_and_a_missing_one(tmp_path):
    rows = [{"key": f"k{i}", "sentence": t} for i, t in enumerate(ft.texts(3))]
    rows.append({"key": "k9", "text": "no sentence field"})
    source = ft.write_json_lines(tmp_path / "rows.jsonl", rows)
    flags = ("--id_column", "key", "--text_column", "sentence", "--buckets", "16,256")
    summary = ft.run(source, tmp_path / "out", *flags, "--no-progress")
    got, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(got)) == ["k0", "k1", "k2"] and summary.dead_letters == 1
    assert failed[0]["id"] == "k9" and "'sentence'" in failed[0]["message"]


def test_the_same_name_for_both_columns_is_refused():
    from pipelines.embed.flags import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--id_column", "x", "--text_column", "x"])


def test_an_id_type_the_input_does_not_have_fails_the_launch(tmp_path):
    parquet = _parquet(tmp_path / "ints.parquet", [0, 1], ft.texts(2), id=pa.int64())
    with pytest.raises(ValueError, match=r"ints.parquet's id column 'id' is int64.*--id_type int"):
        ft.run(parquet, tmp_path / "a", "--id_type", "string")
    lines = ft.write_json_lines(tmp_path / "ints.jsonl", [{"id": 0, "text": "Zero."}])
    with pytest.raises(ValueError, match=r"all integers \(the first: 0 on line 1 of .*ints.jsonl"):
        ft.run(lines, tmp_path / "b", "--id_type", "string")
    with pytest.raises(ValueError, match="built-in corpus's ids are integers"):
        argv = ["--builtin_texts", "5", "--output", str(tmp_path / "c"), "--id_type", "string"]
        ft.embed_text.run([*argv, "--runner=FnApiRunner"])

    summary = ft.run(parquet, tmp_path / "d", "--id_type", "int", "--no-progress")
    assert sorted(ft.ids(ft.read_outputs(tmp_path / "d")[0])) == [0, 1] and not summary.dead_letters


def test_json_line_whose_id_is_not_of_the_id_type_advises_the_other_type(tmp_path):
    rows = [{"id": "a", "text": "First."}, {"id": 7, "text": "Second."}, {"id": "b", "text": "3."}]
    path = ft.write_json_lines(tmp_path / "mixed.jsonl", rows)

    ft.run(path, tmp_path / "out", "--id_type", "string", "--no-progress")

    table, failed = ft.read_outputs(tmp_path / "out")
    assert sorted(ft.ids(table)) == ["a", "b"]
    d = _only(failed, id=7, row=1, stage="read")
    assert "'id' holds a number where the column is string" in d["message"]
    assert d["message"].endswith("or pass --id_type int if the ids are integers"), d["message"]
