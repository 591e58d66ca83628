"""A job's input files at launch (beam_jax.jobs): format, matching, the id column's type."""

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
