"""The flagship's terminal through the real command: a launch line read in one glance (the
plan's details behind --verbose), and a progress line that counts every outcome (read,
validation, kernel) of the total the launch knows and ends equal to the summary."""

from __future__ import annotations

import gzip
import json
import pathlib
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from beam_jax import jobs
from beam_jax._src.jobs.progress import progress_line
from tests import processes

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRESS = re.compile(
    r"^embed_text: (?P<rows>[\d,]+)(?: of (?P<total>~?[\d,]+) rows? \((?P<share>\d+)%\)| rows?), "
    r"(?P<dead>[\d,]+) dead letters?(?:, (?P<files>\d+) unreadable files?)?, \d+ s"
)
SUMMARY = re.compile(
    r"^embed_text: (?P<rows>[\d,]+) rows? -> [\d,]+ embeddings?, (?P<dead>[\d,]+) dead letters?"
    r"(?: \([^)]*\))?(?:, (?P<files>\d+) unreadable files?)?;"
)


def test_progress_line_words():
    exact, estimate = jobs.RowCount(100, exact=True), jobs.RowCount(100)
    line = progress_line("job", 59, 1, 30.0, exact)
    assert line == "job: 60 of 100 rows (60%), 1 dead letter, 30 s, about 20 s left"
    assert progress_line("job", 100, 0, 50.0, estimate).startswith(
        "job: 100 of ~100 rows (99%), 0 dead letters"
    )  # an estimate reached is not the end
    assert progress_line("job", 98, 2, 50.0, exact, final=True) == (
        "job: 100 of 100 rows (100%), 2 dead letters, 50 s"
    )
    assert progress_line("job", 1, 0, 2.0, jobs.RowCount(), unreadable=2) == (
        "job: 1 row, 0 dead letters, 2 unreadable files, 2 s"
    )
    assert progress_line("job", 110, 0, 9.0, estimate, final=True).startswith("job: 110 rows,")
    assert "left" in progress_line("job", 10, 0, 3600.0, exact)  # "about 9 h left"


def _embed(*argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.embed", *argv, "--progress_seconds", "0.1"],
        capture_output=True, text=True, cwd=ROOT, env=processes.worker_env(), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _last(pattern: re.Pattern, text: str) -> re.Match:
    found = [m for line in text.splitlines() if (m := pattern.match(line.strip("\r")))]
    assert found, text[-3000:]
    return found[-1]


def test_progress_ends_equal_to_the_summary_on_an_input_with_read_failures(tmp_path):
    lines = [json.dumps({"id": i, "text": f"text number {i} " * (1 + i % 5)}) for i in range(40)]
    lines[7] = "not json"  # a read failure: a row and a dead letter
    lines[20] = json.dumps({"id": 20, "text": 5})  # a field of another type: likewise
    lines[30] = json.dumps({"id": 30, "text": None})  # a validation failure
    (tmp_path / "good.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    (tmp_path / "cut.jsonl.gz").write_bytes(b"this is not gzip")  # an unreadable file
    done = _embed("--input", str(tmp_path / "*.jsonl.gz"), "--output", str(tmp_path / "out"))
    summary = _last(SUMMARY, done.stdout)
    progress = _last(PROGRESS, done.stderr)
    assert (summary["rows"], summary["dead"], summary["files"]) == ("40", "3", "1"), done.stdout
    assert progress.group("rows", "dead", "files") == summary.group("rows", "dead", "files")
    # Compressed JSON lines: no total known at launch, so no share is made up.
    assert progress["total"] is None and "an unknown number of rows" in done.stdout
    # The dead letters are where the summary says, each naming its line from 1.
    dead = list(jobs.read_dead_letters(str(tmp_path / "out" / "_failed" / "*.jsonl")))
    messages = sorted(d.message for d in dead if d.stage == "read" and d.row is not None)
    assert any(m.startswith(f"line 8 of {tmp_path / 'good.jsonl.gz'}") for m in messages), messages


def test_the_launch_line_reads_in_a_glance_and_verbose_gives_the_plan_s_details(tmp_path):
    texts = [f"text number {i} " * (1 + i % 9) for i in range(30)]
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": range(30), "text": texts}), source, row_group_size=10)
    plain = _embed("--input", str(source), "--output", str(tmp_path / "a"))
    launch = plain.stdout.splitlines()[0]
    assert launch.startswith(f"embed_text: 30 rows of {source} -> {tmp_path / 'a'}: "), launch
    assert len(launch) - len(str(source)) - len(str(tmp_path / "a")) < 130, launch
    assert "MFLOP" not in plain.stdout and "planned from" not in plain.stdout
    progress = _last(PROGRESS, plain.stderr)
    assert (progress["rows"], progress["total"], progress["share"]) == ("30", "30", "100")

    verbose = _embed("--input", str(source), "--output", str(tmp_path / "b"), "--verbose")
    assert verbose.stdout.splitlines()[0] == launch.replace(
        str(tmp_path / "a"), str(tmp_path / "b")
    )
    details = verbose.stdout.splitlines()[1]
    assert "planned from 30 texts for 30 rows" in details and "MFLOP" in details, details
