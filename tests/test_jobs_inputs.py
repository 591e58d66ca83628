"""A job's input files at launch (beam_jax.jobs): format, matching, the id column's type,
a sample of their texts."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jax import jobs


def test_the_format_comes_from_the_extension():
    assert jobs.input_format("a/*.parquet") == jobs.input_format("b.PQ") == "parquet"
    for name in ("gs://b/x.JSONL.gz", "in.json", "in.ndjson.zst", "in.jsonl.xz"):
        assert jobs.input_format(name) == "jsonl", name
    with pytest.raises(ValueError, match="cannot tell the format of --input 'data.csv'"):
        jobs.input_format("data.csv")


def test_a_directory_is_told_to_give_its_files_as_a_glob(tmp_path):
    """It was told that its format cannot be told from its extension."""
    for given in (str(tmp_path), f"{tmp_path}/", "gs://bucket/texts/"):
        folder = given.rstrip("/")
        with pytest.raises(ValueError, match=f"is a directory; .*'{folder}/\\*.parquet'"):
            jobs.input_format(given)


def test_matching_lists_sizes_times_and_links_to_nothing(tmp_path):
    (tmp_path / "b.jsonl").write_bytes(b"{}\n")
    (tmp_path / "a.jsonl").write_bytes(b"")
    (tmp_path / "c.jsonl").symlink_to(tmp_path / "gone.jsonl")
    files = jobs.match_inputs(str(tmp_path / "*.jsonl"))
    assert [f.path.rsplit("/", 1)[1] for f in files] == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert [f.size for f in files] == [0, 3, None] and files[1].mtime > 0
    with pytest.raises(FileNotFoundError, match="matches no file"):
        jobs.match_inputs(str(tmp_path / "*.parquet"))


def test_the_id_type_is_the_first_usable_files(tmp_path):
    pq.write_table(pa.table({"id": [0.5], "text": ["x"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"key": [1], "text": ["x"]}), tmp_path / "b.parquet")
    int32 = pa.table({"id": pa.array([1], pa.int32()), "text": ["x"]})
    pq.write_table(int32, tmp_path / "c.parquet")
    paths = [str(tmp_path / f"{n}.parquet") for n in "abc"]
    assert jobs.id_type_of(paths, "id", "text") == pa.int32()
    with pytest.raises(ValueError, match=r"b.parquet has no column \['id'\]"):
        jobs.id_type_of(paths[:2], "id", "text")

    lines = [b"not json", json.dumps({"text": "no id"}).encode(), json.dumps({"id": "s1"}).encode()]
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(b"\n".join([*lines, b'{"id": 2}'])))
    assert jobs.id_type_of([str(tmp_path / "d.jsonl.gz")], "id", "text") == pa.string()
    (tmp_path / "e.jsonl").write_bytes(b'\xef\xbb\xbf{"id": 7}\n{"id": "x"}\n')
    assert jobs.id_type_of([str(tmp_path / "e.jsonl")], "id", "text") == pa.int64()


def test_a_categorical_id_column_is_its_values_type(tmp_path):
    """A pandas categorical column of ids (dictionary-encoded in Parquet) was refused as
    having no usable id type, while the message asked for the strings it holds."""
    ids = pa.array(["a", "b", "a"]).dictionary_encode()
    pq.write_table(pa.table({"id": ids, "text": ["x", "y", "z"]}), tmp_path / "a.parquet")
    paths = [str(tmp_path / "a.parquet")]
    assert jobs.id_type_of(paths, "id", "text") == pa.string()
    assert jobs.id_type_of(paths, "id", "text", given=pa.string()) == pa.string()
    with pytest.raises(ValueError, match="'id' is string.*Pass --id_type string"):
        jobs.id_type_of(paths, "id", "text", given=pa.int64())


def test_a_given_id_type_is_checked_against_the_input(tmp_path):
    pq.write_table(pa.table({"id": pa.array([1], pa.int32()), "text": ["x"]}), tmp_path / "a.pq")
    parquet = [str(tmp_path / "a.pq")]
    assert jobs.id_type_of(parquet, "id", "text", given=pa.int64()) == pa.int64()
    with pytest.raises(ValueError, match=r"a.pq's id column 'id' is int32.*Pass --id_type int"):
        jobs.id_type_of(parquet, "id", "text", given=pa.string())

    (tmp_path / "b.jsonl").write_bytes(b'{"id": 7}\nnot json\n{"id": "x"}\n')
    mixed = [str(tmp_path / "b.jsonl")]
    assert jobs.id_type_of(mixed, "id", "text", given=pa.string()) == pa.string()
    assert jobs.id_type_of(mixed, "id", "text", given=pa.int64()) == pa.int64()
    (tmp_path / "c.jsonl").write_bytes(b'{"id": "x"}\n{"id": "y"}\n')
    strings = [str(tmp_path / "c.jsonl")]
    with pytest.raises(ValueError, match=r"2 lines are all strings \(the first: 'x' on line 1"):
        jobs.id_type_of(strings, "id", "text", given=pa.int64())


def test_a_text_sample_is_a_files_first_strings_with_its_row_count(tmp_path):
    texts = [f"text {i}" for i in range(30)]
    column = pa.array([*texts[:4], None, *texts[4:]], pa.string())  # a null: left out
    pq.write_table(pa.table({"text": column}), tmp_path / "a.parquet", row_group_size=7)
    [parquet] = jobs.match_inputs(str(tmp_path / "a.parquet"))
    for n in (0, 3, 10, 100):
        sample, rows = jobs.text_sample(parquet, "text", n)
        assert sample.type == pa.large_string() and rows == 31  # from the footer
        assert sample.to_pylist() == texts[:n], n
    assert len(jobs.text_sample(parquet, "other", 5)[0]) == 0  # no such column

    numbers = pa.table({"text": pa.array(range(8))})
    pq.write_table(numbers, tmp_path / "b.parquet")
    [not_text] = jobs.match_inputs(str(tmp_path / "b.parquet"))
    assert jobs.text_sample(not_text, "text", 5)[0].to_pylist() == []
    bad = pa.array([b"ok", b"\xff\xfe"], pa.binary()).cast(pa.string(), safe=False)
    pq.write_table(pa.table({"text": bad}), tmp_path / "c.parquet")
    [invalid] = jobs.match_inputs(str(tmp_path / "c.parquet"))
    assert jobs.text_sample(invalid, "text", 5) == (pa.array(["ok"], pa.large_string()), 2)
    for kind in (pa.binary(), pa.large_binary(), pa.large_string()):  # texts in any of them
        typed = pa.array([t.encode() if kind != pa.large_string() else t for t in texts], kind)
        pq.write_table(pa.table({"text": typed}), tmp_path / "t.parquet", row_group_size=7)
        [file] = jobs.match_inputs(str(tmp_path / "t.parquet"))
        assert jobs.text_sample(file, "text", 9) == (pa.array(texts[:9], pa.large_string()), 30)

    lines = [json.dumps({"text": t}) for t in texts[:20]]
    lines[1] = json.dumps({"text": 5})  # not a string: left out, its line counted
    (tmp_path / "d.jsonl").write_text("\n".join(["", *lines]) + "\n")  # a blank line
    [json_lines] = jobs.match_inputs(str(tmp_path / "d.jsonl"))
    sample, rows = jobs.text_sample(json_lines, "text", 5)
    assert sample.to_pylist() == [texts[0], *texts[2:5]]  # five lines read
    assert rows == pytest.approx(20, rel=0.1)  # estimated from the file's size
    (tmp_path / "e.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    [compressed] = jobs.match_inputs(str(tmp_path / "e.jsonl.gz"))
    sample, rows = jobs.text_sample(compressed, "text", 3)
    assert (sample.to_pylist(), rows) == ([texts[0], texts[2]], None)  # among three lines


def test_a_compressed_file_that_breaks_off_is_sampled_up_to_its_break(tmp_path):
    """Its texts before the break make the plan (the job dead-letters the break): without
    them a launch planned from nothing and padded its batches twentyfold."""
    texts = [f"text number {i}" for i in range(2000)]
    data = gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    files = jobs.match_inputs(str(tmp_path / "cut.jsonl.gz"))
    sample, rows = jobs.sample_texts(files, "text", 5000)
    assert 0 < len(sample) < 2000 and sample.to_pylist() == texts[: len(sample)]
    assert rows.rows is None  # a compressed file's rows are not estimated
