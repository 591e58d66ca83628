"""A run's terminal: progress on a multi-process run (and none when switched off), quiet
logs, one line when the job fails, and an output directory that reads as one dataset."""

from __future__ import annotations

import json
import re

import pyarrow.json as pj
import pyarrow.parquet as pq
import pytest

from beam_jax import jobs
from pipelines.embed import job as embed_text
from pipelines.embed import write as tp
from tests import flagship as ft

PROGRESS = re.compile(
    r"^embed_text: ([\d,]+)(?: of ~?[\d,]+ rows? \(\d+%\)| rows?), ([\d,]+) dead letters?, "
)


def _progress_lines(err: str) -> list[tuple[int, int]]:
    found = [PROGRESS.match(line) for line in err.splitlines()]
    return [(int(m[1].replace(",", "")), int(m[2].replace(",", ""))) for m in found if m]


def _stdout(out: str) -> list[str]:
    """stdout less the launch line (``embed_text: 60 rows of IN -> OUT: texts ...``)."""
    lines = out.strip().splitlines()
    assert len(lines) >= 1 and re.match(r"embed_text: \S+ rows? of .* -> ", lines[0]), lines
    return lines[1:]


def _rows(n: int) -> list[dict]:
    rows = [{"id": i, "text": t} for i, t in enumerate(ft.texts(n))]
    rows[3]["text"] = None  # one dead letter (an empty text would be embedded)
    return rows


@pytest.mark.slow
def test_a_multiprocess_run_shows_progress_from_its_workers_and_nothing_else(tmp_path, capfd):
    source = ft.write_json_lines(tmp_path / "in.jsonl", _rows(60))
    out = tmp_path / "out"
    summary = embed_text.run(["--input", str(source), "--output", str(out),
                              "--direct_running_mode=multi_processing", "--direct_num_workers=2",
                              "--rows_per_part=10", "--progress_seconds=0.2"])  # fmt: skip
    captured = capfd.readouterr()
    counts = _progress_lines(captured.err)
    assert counts, captured.err
    # Counted in the worker processes (a retried bundle may count twice, never less).
    assert counts[-1][0] >= summary.rows == 60 and counts[-1][1] >= 1
    assert all(a[0] <= b[0] for a, b in zip(counts, counts[1:], strict=False))
    # Nothing else on the terminal: the workers' and Beam's logs went to the run's log.
    others = [line for line in captured.err.splitlines() if not PROGRESS.match(line)]
    assert others == [], others
    assert _stdout(captured.out) == [str(summary)]

    # The output directory is one Parquet dataset; the dead letters load back beside it.
    table = pq.read_table(out)
    assert table.num_rows == 59 and table.column_names == ["id", "embedding"]
    dead = pj.read_json(out / tp.DEAD_LETTER_DIR / next(iter(
        p.name for p in (out / tp.DEAD_LETTER_DIR).iterdir())))  # fmt: skip
    assert dead.column("key").to_pylist() == [3]


def test_no_progress_switches_it_off_and_verbose_shows_beam_s_logs(tmp_path, capfd, caplog):
    source = ft.write_json_lines(tmp_path / "in.jsonl", _rows(8))
    summary = ft.run(source, tmp_path / "out", "--no-progress", "--progress_seconds=0.1")
    captured = capfd.readouterr()
    assert _progress_lines(captured.err) == [] and captured.err == ""
    assert _stdout(captured.out) == [str(summary)]
    # With progress on (in process, from the same files) and --verbose: Beam's INFO logs too.
    ft.run(source, tmp_path / "again", "--progress_seconds=0.1", "--verbose")
    err = capfd.readouterr().err
    assert _progress_lines(err)[-1] == (8, 1)
    # (pytest's handler takes the records that a plain run prints to stderr)
    infos = [
        r for r in caplog.records if r.name.startswith("apache_beam") and r.levelname == "INFO"
    ]
    assert infos and not (tmp_path / "again" / "_unfinished").exists()


def test_a_failed_job_ends_with_one_line_naming_the_step_and_the_log(tmp_path, monkeypatch, capfd):
    def broken(self, part):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(tp.PartWriter, "_write", broken)
    source = ft.write_json_lines(tmp_path / "in.jsonl", _rows(4))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as failed:
        embed_text.main(["--input", str(source), "--output", str(out), "--runner=FnApiRunner"])
    line = str(failed.value.code)
    log = out / "_unfinished" / "run.log"
    assert "\n" not in line and line.startswith("embed_text failed in step 'Embed'")
    assert "OSError: disk full (injected)" in line and f"worker logs in {log}" in line
    text = log.read_text()
    assert "Traceback" in text and "disk full (injected)" in text
    assert "Traceback" not in capfd.readouterr().err  # the traceback is in the log only


def test_progress_counts_sum_the_workers_files_and_skip_torn_ones(tmp_path):
    (tmp_path / "done-1-a.json").write_text("5")
    (tmp_path / "done-2-b.json").write_text("7")
    (tmp_path / "dead-1-c.json").write_text("1")
    (tmp_path / "done-3-d.json").write_text("")  # being replaced: counted next time
    (tmp_path / "done-4-e.json.tmp").write_text("100")
    assert jobs.read_counts(str(tmp_path)) == {"done": 12, "dead": 1}
    assert json.dumps(jobs.read_counts(str(tmp_path / "gone"))) == "{}"
