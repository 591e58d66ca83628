"""The flagship's parts through the real command: one dead-letter file per part, a JSON line
that is no row filed in its part (not a part of its own), and an embeddings file for every
part, even one whose rows all failed or that holds only bad lines; an input of no rows gets
one embeddings file of none."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from beam_jax import jobs
from pipelines.embed import write
from tests import flagship as ft
from tests import processes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _names(out: pathlib.Path) -> tuple[list[str], list[str]]:
    parts = sorted(p.name for p in out.glob("embeddings-*.parquet"))
    failed = sorted(p.name for p in (out / write.DEAD_LETTER_DIR).glob("*.jsonl"))
    return parts, failed


def test_each_part_has_one_embeddings_file_and_at_most_one_dead_letter_file(tmp_path):
    rows = [json.dumps({"id": i, "text": f"text number {i}"}) for i in range(12)]
    mixed = [*rows[:3], "not json", *rows[3:7], json.dumps({"id": 7, "text": 7}), *rows[7:]]
    (tmp_path / "a.jsonl").write_text("\n".join(mixed) + "\n")
    (tmp_path / "b.jsonl").write_text('nope\n[1, 2]\n{"id": "x"\n')  # only bad lines
    nulls = [json.dumps({"id": 100 + i, "text": None}) for i in range(3)]
    (tmp_path / "c.jsonl").write_text("\n".join(nulls) + "\n")  # rows that all fail
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.embed", "--input", str(tmp_path / "*.jsonl"),
         "--output", str(out), "--no-progress"],
        capture_output=True, text=True, cwd=ROOT, env=processes.worker_env(), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "20 rows -> 12 embeddings, 8 dead letters (read 5, validation 3)" in done.stdout

    parts, failed = _names(out)
    assert len(parts) == 3 and len(failed) == 3, (parts, failed)
    # a.jsonl: one part of all its 14 lines, both bad lines in its one dead-letter file.
    (a_part,) = [p for p in parts if p.startswith("embeddings-a-")]
    assert a_part.endswith("-000000000000-000000000014.parquet"), a_part
    a_failed = (
        out
        / write.DEAD_LETTER_DIR
        / a_part.replace("embeddings-", "failed-").replace(".parquet", ".jsonl")
    )
    records = list(jobs.read_dead_letters(str(a_failed)))
    assert [(r.row, r.stage) for r in records] == [(3, "read"), (8, "read")]
    assert records[0].message.startswith(f"line 4 of {tmp_path / 'a.jsonl'}: ")
    assert pq.read_table(out / a_part).num_rows == 12
    # b.jsonl (bad lines only) and c.jsonl (rows that all failed): empty embeddings files.
    for stem, stage in (("b", "read"), ("c", "validation")):
        (part,) = [p for p in parts if p.startswith(f"embeddings-{stem}-")]
        assert pq.read_table(out / part).num_rows == 0, part
        (dead,) = [f for f in failed if f.startswith(f"failed-{stem}-")]
        records = list(jobs.read_dead_letters(str(out / write.DEAD_LETTER_DIR / dead)))
        assert len(records) == 3 and {r.stage for r in records} == {stage}, records


def test_an_input_of_no_rows_reads_back_as_a_dataset_of_no_embeddings(tmp_path, capsys):
    empty = {"id": pa.array([], pa.int64()), "text": pa.array([], pa.string())}
    pq.write_table(pa.table(empty), tmp_path / "empty.parquet")
    out = tmp_path / "out"

    summary = ft.run(tmp_path / "empty.parquet", out)

    assert (summary.rows, summary.batches) == (0, 0)
    assert "bucketed, padding - over 0 batches;" in capsys.readouterr().out  # not "nanx"
    table = pq.read_table(out)  # OUTPUT as a dataset, as docs/embed_text.md reads it
    assert table.num_rows == 0
    assert table.schema == jobs.embeddings_schema(pa.int64())
    (part,) = _names(out)[0]
    assert part.startswith("embeddings-empty-") and part.endswith(
        "-000000000000-000000000000.parquet"
    )


def test_a_run_whose_rows_all_fail_prints_no_padding_ratio(tmp_path, capsys):
    rows = [{"id": i, "text": None} for i in range(3)]
    source = ft.write_json_lines(tmp_path / "nulls.jsonl", rows)

    summary = ft.run(source, tmp_path / "out")

    assert (summary.dead_letters, summary.batches) == (3, 0)
    assert "bucketed, padding - over 0 batches;" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "out").schema == jobs.embeddings_schema(pa.int64())
