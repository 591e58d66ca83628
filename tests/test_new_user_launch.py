"""What a new user meets at launch: the plan's paste line, launch errors, help texts,
misspelled flags and runners, and ``beam-jax report`` on every flagship's output."""

from __future__ import annotations

import json
import pathlib
import shlex

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jax import jobs
from beam_jax._src.cli import main as cli
from pipelines import curate
from pipelines.embed import flags as embed_flags
from pipelines.embed import job as embed_job


def _texts_file(tmp_path: pathlib.Path, n: int = 300) -> pathlib.Path:
    """Texts of long-tailed lengths in words (most short, a few over 256 tokens)."""
    words = np.random.default_rng(0).zipf(1.5, n).clip(1, 600)
    path = tmp_path / "texts.parquet"
    texts = [" ".join(["word"] * int(k)) for k in words]
    pq.write_table(pa.table({"id": list(range(n)), "text": texts}), path)
    return path


def _paste_line(out: str) -> str | None:
    """The plan's line for the embed job, if it printed one."""
    for line in out.splitlines():
        if line.strip().startswith("--buckets"):
            return line.strip().split("    (")[0]
    return None


def test_the_plan_s_paste_line_for_embed_is_accepted_by_embed_s_own_flag_parser(tmp_path, capsys):
    source = _texts_file(tmp_path)
    argv = ["plan", "--input", str(source), "--column", "text", "--max-buckets", "6"]
    assert cli.main([*argv, "--tokenizer", "minilm"]) == 0
    line = _paste_line(capsys.readouterr().out)
    assert line is not None
    args, _ = embed_flags.parse_args(shlex.split(line))  # exits if the job refuses it
    assert max(args.buckets) == 256 and len(args.buckets) == 6
    # The same plan as JSON names the same line.
    assert cli.main([*argv, "--tokenizer", "minilm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["paste"]["flag"] == line


@pytest.mark.parametrize(
    "extra, why",
    [
        ([], "token counts of the model's tokenizer"),  # characters, not tokens
        (["--tokenizer", "minilm", "--max-size", "32"], "must end between 256"),
    ],
)
def test_the_plan_prints_no_embed_line_the_job_would_refuse(tmp_path, capsys, extra, why):
    source = _texts_file(tmp_path)
    assert cli.main(["plan", "--input", str(source), "--column", "text", *extra]) == 0
    out = capsys.readouterr().out
    assert _paste_line(out) is None and "no line for beam-jax embed" in out and why in out
    # What the plan would have suggested is indeed refused by the job.
    assert cli.main(["plan", "--input", str(source), "--column", "text", *extra, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["paste"]["flag"] is None and why in got["paste"]["no_flag"]
    bounds = got["plans"][-1]["boundaries"]
    with pytest.raises(SystemExit):
        embed_flags.parse_args(["--buckets", ",".join(map(str, bounds))])
    assert "--buckets must end between 256" in capsys.readouterr().err


def test_a_launch_error_is_never_cut_and_a_missing_column_names_the_flags(tmp_path, capsys):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"doc_key": [1, 2], "body": ["a", "b"]}), path)
    with pytest.raises(SystemExit) as exit_:
        embed_job.main(["--input", str(path), "--output", str(tmp_path / "out"), "--no-progress"])
    line = str(exit_.value)
    assert "it has ['doc_key', 'body']" in line
    assert "--text_column" in line and "--id_column" in line, line
    assert len(line) > 160 and "..." not in line.split("(traceback")[0]
    long = ValueError("x" * 300 + " fix: pass --flag")
    assert "fix: pass --flag" in jobs.failure_line("job", long)


def test_help_texts_say_what_the_default_does(capsys):
    with pytest.raises(SystemExit):
        embed_flags.parse_args(["--help"])
    embed = " ".join(capsys.readouterr().out.split())
    assert "(default: True)" not in embed and "(default: False)" not in embed
    assert "by default it is shown" in embed
    assert "the first N built-in texts (default: all of them)" in embed
    with pytest.raises(SystemExit):
        curate.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "seeds the flips and the init (default: 0)" in text


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["--runer", "DirectRunner"], "did you mean --runner for --runer?"),
        (["--runner=FnApiRuner"], "did you mean FnApiRunner?"),
        (["--runner", "Dataflw"], "did you mean DataflowRunner?"),
        (["--temp_locaton", "/tmp/x"], "did you mean --temp_location for --temp_locaton?"),
        (["--outptu", "x"], "did you mean --output for --outptu?"),
    ],
)
def test_misspelled_runners_and_pipeline_options_get_a_suggestion(argv, hint, capsys):
    with pytest.raises(SystemExit):
        embed_flags.parse_args(argv)
    assert hint in capsys.readouterr().err


@pytest.mark.parametrize(
    "runner", ["FnApiRunner", "direct", "DirectRunner", "PrismRunner", "Dataflow"]
)
def test_known_runners_pass(runner):
    _, options = embed_flags.parse_args([f"--runner={runner}"])
    assert options.get_all_options()["runner"] == runner


def test_report_works_on_curate_s_output_or_says_what_the_directory_lacks(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    from beam_jax.text import labelled_corpus

    _, labelled = labelled_corpus(3)
    rows.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "text": t, "label": lab}) + "\n"
            for i, t, lab in labelled[:40]
        )
    )
    out = tmp_path / "curated"
    curate.run(["--input", str(rows), "--output", str(out), "--passes", "1", "--no-progress"])
    capsys.readouterr()
    assert cli.main(["report", str(out)]) == 0
    report = capsys.readouterr().out
    assert report.startswith("curate: metrics") and "rows" in report and "40" in report
    record = json.loads((out / "_metrics.json").read_text())
    assert record["summary"]["results"] == 40 and record["buckets"], record
    # A directory without the file: what it lacks and what it holds.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "part.parquet").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"has no _metrics.json: it holds part.parquet"):
        cli.main(["report", str(tmp_path / "other")])


def test_the_plan_s_line_for_a_model_directory_names_it_and_embed_takes_it(tmp_path, capsys):
    from tests import tiny_families

    model = tiny_families.write_tiny_mpnet(tmp_path / "mpnet")  # max_seq_length 48, 64 tokens
    source = _texts_file(tmp_path, 100)
    argv = ["plan", "--input", str(source), "--column", "text", "--tokenizer", str(model)]
    assert cli.main([*argv, "--max-buckets", "3"]) == 0
    line = _paste_line(capsys.readouterr().out)
    assert line is not None and line.endswith(f"--model_dir {model}")
    args, _ = embed_flags.parse_args(shlex.split(line))
    assert max(args.buckets) == 48 and args.model_dir == str(model)
    # The model's own range: a plan ending past its 64 tokens gets no line.
    assert cli.main([*argv, "--max-size", "80"]) == 0
    out = capsys.readouterr().out
    assert _paste_line(out) is None and "must end between 48" in out and "and 64" in out
