"""beam_jax.jobs: a job's staged output directory, progress, console and metrics report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax import jobs
from beam_jax._src.jobs import output_dir
from beam_jax._src.jobs.console import verbose_requested
from beam_jax._src.jobs.flags import reject_unknown_flags

LAYOUT = jobs.OutputLayout(
    published=r"^(part-\d+\.txt|_failed/f-\d+\.jsonl)$",
    record="_my_job.json",
    resumable=True,
    parts=r"^part-\d+\.txt$",
    dead_letters=r"^_failed/f-\d+\.jsonl$",
)


def _tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _stage(output: jobs.OutputDir, name: str, data: bytes) -> None:
    path = f"{output.staging}/{name}"
    if "/" in name:
        os.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    jobs.write_atomically(path, data)


def test_a_layout_says_which_files_are_the_job_s_and_is_checked():
    assert LAYOUT.ours.match("part-1.txt") and LAYOUT.ours.match("_my_job.json")
    assert LAYOUT.ours.match("_metrics.json") and not LAYOUT.ours.match("notes.txt")
    plain = jobs.OutputLayout(published=re.compile(r"^a\.txt$"), record="_a.json")
    assert plain.parts is plain.published and not plain.resumable
    with pytest.raises(ValueError, match="record must be a file name that published"):
        jobs.OutputLayout(published=r".*", record="_a.json")
    with pytest.raises(TypeError, match="regular expression .* got int 3"):
        jobs.OutputLayout(published=3, record="_a.json")
    with pytest.raises(TypeError, match="must be a OutputLayout, got str"):
        jobs.OutputDir("out", layout="parts")


def test_publishing_replaces_only_the_job_s_files_and_resumes_the_same_job(tmp_path):
    root = tmp_path / "out"
    output = jobs.OutputDir(str(root) + "/", layout=LAYOUT)
    assert output.path == str(root)
    assert output.prepare({"inputs": ["a"]}, overwrite=False) == []
    _stage(output, "part-0.txt", b"zero")
    # Rerun of the same job: the finished part is reused; another job is refused.
    assert output.prepare({"inputs": ["a"]}, overwrite=False) == ["part-0.txt"]
    with pytest.raises(jobs.OutputExistsError, match="another job .*input files"):
        output.prepare({"inputs": ["b"]}, overwrite=False)
    _stage(output, "part-1.txt", b"one")
    _stage(output, "_failed/f-1.jsonl", b'{"id": 1}\n{"id": 2}')
    path, count = output.collect_dead_letters()
    assert count == 2 and path.endswith("_unfinished/dead_letters.jsonl")
    assert output.publish({"rows": 3}) == ["_failed/f-1.jsonl", "part-0.txt", "part-1.txt"]
    assert json.loads((root / "_my_job.json").read_text()) == {"rows": 3}
    assert not (root / "_unfinished").exists()

    # A second run: refused without overwrite; with it, the job's old files go and a
    # file that is not the job's stays.
    (root / "notes.txt").write_bytes(b"mine")
    with pytest.raises(jobs.OutputExistsError, match="already holds 5 files.*--overwrite"):
        output.prepare({"inputs": ["c"]}, overwrite=False)
    assert output.prepare({"inputs": ["c"]}, overwrite=True) == []
    _stage(output, "part-7.txt", b"seven")
    assert _tree(root)["part-0.txt"] == b"zero"  # kept until the run succeeds
    output.publish({"rows": 1})
    assert sorted(_tree(root)) == ["_my_job.json", "notes.txt", "part-7.txt"]


class _Killed(BaseException):
    """The process killed (nothing after it runs, as with ``os._exit``)."""


def test_a_publish_cut_short_is_finished_with_its_metrics_for_the_same_job(tmp_path, monkeypatch):
    root = tmp_path / "out"
    output = jobs.OutputDir(str(root), layout=LAYOUT)
    output.prepare({"inputs": ["a"]}, overwrite=False)
    _stage(output, "part-0.txt", b"zero")
    jobs.write_metrics({"summary": {"rows": 1}, "buckets": {}}, output.staging)
    write = output_dir.write_atomically

    def killed_at_the_record(path, data):
        if path.endswith("/_my_job.json"):
            raise _Killed
        write(path, data)

    monkeypatch.setattr(output_dir, "write_atomically", killed_at_the_record)
    with pytest.raises(_Killed):
        output.publish({"rows": 1})
    monkeypatch.undo()
    cut = _tree(root)
    assert "part-0.txt" in cut and "_metrics.json" in cut and "_my_job.json" not in cut

    assert output.finish_publishing({"inputs": ["b"]}) is None  # another job's publish
    assert _tree(root) == cut
    assert output.finish_publishing({"inputs": ["a"]}) == {"rows": 1}
    assert sorted(_tree(root)) == ["_metrics.json", "_my_job.json", "part-0.txt"]
    assert json.loads(_tree(root)["_metrics.json"])["summary"] == {"rows": 1}
    assert output.finish_publishing({"inputs": ["a"]}) is None  # finished: nothing left


def test_a_file_opened_atomically_appears_whole_or_not_at_all(tmp_path):
    """What the block writes appears under the name only when the block ends; a block that
    raises leaves the name as it was and no temporary file behind."""
    path = tmp_path / "part.parquet"
    table = pa.table({"id": [1, 2, 3]})
    with jobs.open_atomically(str(path)) as f:
        pq.write_table(table, f)  # streamed into the file, no copy in memory
        assert not path.exists() and len(list(tmp_path.iterdir())) == 1
    assert pq.read_table(path).equals(table)
    with pytest.raises(RuntimeError, match="cut short"):
        with jobs.open_atomically(str(path)) as f:
            f.write(b"half a file")
            raise RuntimeError("cut short")
    assert pq.read_table(path).equals(table)  # the earlier file, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["part.parquet"]


def test_one_dead_letter_over_the_threshold_is_counted_in_the_singular(tmp_path):
    output = jobs.OutputDir(str(tmp_path / "out"), layout=LAYOUT)
    output.prepare({"inputs": ["a"]}, overwrite=False)
    _stage(output, "_failed/f-0.jsonl", b'{"id": 1}\n')
    with pytest.raises(bj.DeadLetterThresholdError, match="The 1 dead letter is in "):
        output.check_threshold({"rows": (1, 10), "files": (0, 1)}, 0.01)


def test_over_the_threshold_nothing_is_published_and_a_failure_says_what_is_kept(tmp_path):
    output = jobs.OutputDir(str(tmp_path / "out"), layout=LAYOUT)
    output.prepare({"inputs": ["a"]}, overwrite=False)
    _stage(output, "part-0.txt", b"zero")
    _stage(output, "_failed/f-0.jsonl", b'{"id": 1}\n{"id": 2}\n')
    output.check_threshold({"rows": (2, 100), "files": (0, 0)}, 0.05)  # 2% <= 5%
    with pytest.raises(bj.DeadLetterThresholdError) as over:
        output.check_threshold({"rows": (2, 100), "files": (1, 4)}, 0.01)
    message = str(over.value)
    assert message.startswith("2 of 100 rows failed (2.00%) and 1 of 4 files failed (25.00%)")
    assert "The 2 dead letters are in" in message and "without recomputing them" in message
    assert not (tmp_path / "out" / "part-0.txt").exists()

    error = RuntimeError("a worker died")
    output.explain_failure(error, "my_job", reused=1)
    assert "my_job: the job failed, so nothing was published" in error.__notes__[0]
    assert "1 parts are kept" in error.__notes__[0] and "resumes" in error.__notes__[0]


def test_counted_progress_is_read_back_on_the_driver(tmp_path):
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        batches = p | beam.Create([[1, 2], [3], [4, 5, 6]])
        _ = batches | "Done" >> beam.ParDo(jobs.CountProgress(str(tmp_path), "done", size=len))
        _ = batches | "Dead" >> beam.ParDo(jobs.CountProgress(str(tmp_path), "dead"))
        assert_that(batches | beam.Map(len), equal_to([2, 1, 3]))
    assert jobs.read_counts(str(tmp_path)) == {"done": 6, "dead": 3}

    class Lines:
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text

        def flush(self):
            pass

    stream = Lines()
    printer = jobs.ProgressPrinter("my_job", str(tmp_path), stream, seconds=60).start()
    printer.stop()
    # Every row ended as a result or a dead letter; the last line, the final counts.
    assert re.match(r"my_job: 9 rows, 3 dead letters, \d+ s\n$", stream.text), stream.text


def test_the_console_keeps_logs_in_a_file_and_says_what_failed(tmp_path, capfd):
    parser = argparse.ArgumentParser()
    jobs.add_flags(parser)
    args, rest = parser.parse_known_args(["--progress_seconds=0.5", "--runner=FnApiRunner"])
    assert args.progress and args.progress_seconds == 0.5 and not args.verbose
    with pytest.raises(RuntimeError) as failure:
        with jobs.RunConsole("my_job", args, PipelineOptions(rest), str(tmp_path)) as console:
            console.say("step 1 done")
            os.write(2, b"a worker's log line\n")  # worker processes inherit fd 2
            raise RuntimeError("disk full while running 'Write/Part'")
    err = capfd.readouterr().err
    assert err == "step 1 done\n"  # the worker's line went to the log file
    log = (tmp_path / "_unfinished" / "run.log").read_text()
    assert "a worker's log line" in log and "Traceback" in log
    line = jobs.failure_line("my_job", failure.value)
    assert line.startswith("my_job failed in step 'Write/Part': RuntimeError: disk full")
    assert line.endswith(f"(traceback and worker logs in {tmp_path}/_unfinished/run.log)")
    remote = jobs.RunConsole("my_job", args, PipelineOptions(["--runner=DataflowRunner"]), "gs://b")
    assert not remote.local and remote.log_path is None and not remote.show_progress
    assert verbose_requested(["--verbose"]) and not verbose_requested([])


@dataclasses.dataclass(frozen=True)
class _Summary:
    rows: int
    seconds: float
    kernel: bj.Summary | None = None

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else float("nan")


def test_the_metrics_report_is_standard_json_that_beam_jax_report_reads(tmp_path):
    from beam_jax._src.cli.report import load_metrics

    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        _ = p | beam.Create([1])
    result = p.run()  # an empty kernel namespace: no buckets
    record = jobs.metrics_record("my_job", _Summary(rows=4, seconds=0.0), result)
    assert record["summary"] == {"rows": 4, "seconds": 0.0, "rows_per_second": None}
    assert record["pipeline"] == "my_job" and record["buckets"] == {}
    path = jobs.write_metrics(record, str(tmp_path))
    assert path == f"{tmp_path}/_metrics.json"
    assert load_metrics(str(tmp_path)) == record
    with pytest.raises(TypeError, match="dataclass instance .* got dict"):
        jobs.metrics_record("my_job", {"rows": 4}, None)


def test_the_command_line_refuses_what_neither_the_job_nor_beam_knows(capsys):
    parser = argparse.ArgumentParser(formatter_class=jobs.DefaultsHelpFormatter)
    parser.add_argument("--passes", type=jobs.positive_int, default=3, help="passes")
    parser.add_argument("--buckets", type=jobs.int_list, default=(8, 16), help="buckets")
    args, rest = parser.parse_known_args(["--buckets", "4,8", "--direct_num_workers", "2"])
    reject_unknown_flags(parser, rest)  # Beam's flags pass
    assert args.buckets == (4, 8) and args.passes == 3
    assert "(default: 3)" in parser.format_help() and "(default: 8,16)" in parser.format_help()
    for argv, said in [
        (["--pases", "2"], "did you mean --passes for --pases?"),
        (["-x"], "unrecognized arguments: -x"),
        (["stray"], "unrecognized arguments: stray"),
    ]:
        _, rest = parser.parse_known_args(argv)
        with pytest.raises(SystemExit):
            reject_unknown_flags(parser, rest)
        assert said in capsys.readouterr().err
    for bad in (["--passes", "0"], ["--buckets", "a,b"], ["--buckets", ","]):
        with pytest.raises(SystemExit):
            parser.parse_known_args(bad)
