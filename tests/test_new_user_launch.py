"""What a new user meets at launch: the plan's paste line, launch errors, help texts,
misspelled flags and runners, and ``beam-jax report`` on every flagship's output."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import beam_jax
from beam_jax import jobs
from beam_jax._src.cli import main as cli
from pipelines import curate
from pipelines.embed import flags as embed_flags
from pipelines.embed import job as embed_job
from tests import processes

ROOT = pathlib.Path(__file__).resolve().parents[1]


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


# Each command as a new user types it, with a misspelled flag of each style (a dash, an
# underscore) and what the refusal must suggest for each.
_COMMANDS = {
    "python -m pipelines.embed": (
        ["-m", "pipelines.embed", "--batch-siz", "8", "--id_colum", "doc"],
        ["did you mean --batch_size for --batch-siz?", "did you mean --id_column for --id_colum?"],
    ),
    "beam-jax curate": (
        ["-m", "beam_jax", "curate", "--flip-fractio", "0.1", "--hash_bit", "4"],
        ["did you mean --flip_fraction for --flip-fractio?",
         "did you mean --hash_bits for --hash_bit?"],
    ),
    "python -m pipelines.curate": (
        ["-m", "pipelines.curate", "--no-progres", "--learning_rat", "0.1"],
        ["did you mean --no-progress for --no-progres?",
         "did you mean --learning_rate for --learning_rat?"],
    ),
    "beam-jax plan": (
        ["-m", "beam_jax", "plan", "--input", "x", "--colum", "t", "--max-bucket", "3",
         "--max_siz", "9"],
        ["did you mean --column for --colum?", "did you mean --max_buckets for --max-bucket?",
         "did you mean --max_size for --max_siz?"],
    ),
    "beam-jax report": (
        ["-m", "beam_jax", "report", "out", "--plto", "p.png", "--plot-", "x"],
        ["did you mean --plot for --plto?"],
    ),
}  # fmt: skip


def _run_all(argvs: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """Runs each command line (python's arguments) at once; their results by name."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=processes.worker_env(),
        )  # fmt: skip
        for name, argv in argvs.items()
    }
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


def test_each_command_refuses_a_misspelled_flag_of_each_style_with_the_closest():
    done = _run_all({name: argv for name, (argv, _) in _COMMANDS.items()})
    for name, (_, hints) in _COMMANDS.items():
        result = done[name]
        assert result.returncode == 2, (name, result.stderr)
        last = result.stderr.strip().splitlines()[-1]
        assert "unrecognized arguments" in last and all(h in last for h in hints), (name, last)


def test_every_command_prints_its_version():
    commands = {
        "embed": ["-m", "pipelines.embed", "--version"],
        "curate": ["-m", "beam_jax", "curate", "--version"],
        "plan": ["-m", "beam_jax", "plan", "--version"],
        "report": ["-m", "beam_jax", "report", "--version"],
        "beam-jax": ["-m", "beam_jax", "--version"],
    }
    for name, result in _run_all(commands).items():
        assert result.returncode == 0, (name, result.stderr)
        assert re.fullmatch(
            rf"beam-jax {re.escape(beam_jax.__version__)} \(apache-beam \S+, jax \S+, Python "
            r"\S+\)\n",
            result.stdout,
        ), (name, result.stdout)


def test_embed_takes_dashed_flags_that_it_used_to_ignore(tmp_path):
    source = tmp_path / "mine.parquet"
    texts = [" ".join(["word"] * (1 + i % 5)) for i in range(12)]
    pq.write_table(pa.table({"doc_id": list(range(12)), "body": texts}), source)
    out = tmp_path / "o7"
    done = _run_all({"embed": ["-m", "pipelines.embed", "--input", str(source), "--output",
                               str(out), "--id-column", "doc_id", "--text-column", "body",
                               "--batching", "buckets", "--batch-size", "2",
                               "--no-progress"]})["embed"]  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(pq.read_table(out).column("id").to_pylist()) == list(range(12))
    summary = json.loads((out / "_metrics.json").read_text())["summary"]
    # Two texts per device per batch (4 devices here): several batches, not the default's one.
    assert summary["batches"] >= 2, summary
    assert "progress" not in done.stdout.lower(), done.stdout


def test_beam_jax_names_the_closest_command():
    done = _run_all({"pla": ["-m", "beam_jax", "pla", "--input", "x"]})["pla"]
    assert done.returncode == 2 and "no command 'pla'; did you mean plan?" in done.stderr


def test_curate_reads_the_input_s_own_columns_named_by_flags(tmp_path):
    from beam_jax.text import labelled_corpus

    _, labelled = labelled_corpus(3)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"doc": f"r{i}", "body": t, "topic": lab}) + "\n"
                            for i, t, lab in labelled[:40]))  # fmt: skip
    out = tmp_path / "curated"
    argv = ["-m", "pipelines.curate", "--input", str(rows), "--output", str(out), "--passes", "1",
            "--id-column", "doc", "--text_column", "body", "--label-column", "topic",
            "--no-progress"]  # fmt: skip
    done = _run_all({"curate": argv})["curate"]
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("curate: 40 rows -> 40 records"), done.stdout
    scores = pq.read_table(next(out.glob("scores-*.parquet")))
    assert sorted(scores.column("id").to_pylist()) == sorted(f"r{i}" for i in range(40))
    # A Parquet input without the columns named: the flags that name them.
    pq.write_table(pa.table({"doc": ["a"], "body": ["x"], "label": ["l"]}), tmp_path / "in.parquet")
    with pytest.raises(SystemExit) as exit_:
        curate.main(["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "o")])
    assert "has no column 'id'" in str(exit_.value) and "--id_column" in str(exit_.value)


def test_keep_columns_carries_input_columns_to_the_output_with_their_types(tmp_path, capsys):
    source = tmp_path / "mine.parquet"
    carried = {
        "url": pa.array(["u0", "u1", "u2", None]),
        "score": pa.array([0.5, 1.5, 2.5, 3.5], pa.float32()),
        "tags": pa.array([["a"], [], ["b", "c"], None], pa.list_(pa.string())),
    }
    texts = ["a first text", None, "a third text", "the fourth"]  # row 1: a dead letter
    pq.write_table(pa.table({"doc": [10, 11, 12, 13], "body": texts, **carried}), source)
    out = tmp_path / "out"
    argv = ["-m", "pipelines.embed", "--input", str(source), "--output", str(out),
            "--id-column", "doc", "--text-column", "body", "--keep-columns", "url,score,tags",
            "--no-progress"]  # fmt: skip
    done = _run_all({"embed": argv})["embed"]
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out).sort_by("id")
    assert table.column_names == ["id", "embedding", "url", "score", "tags"]
    for name, column in carried.items():
        assert table.schema.field(name).type == column.type, name
        assert table.column(name).to_pylist() == column.take([0, 2, 3]).to_pylist(), name
    for argv, said in [
        (["--keep_columns", "url"], "--keep_columns carries an --input's columns"),
        (["--input", str(source), "--keep_columns", "id"], "other than its ids"),
    ]:
        with pytest.raises(SystemExit):
            embed_flags.parse_args(argv)
        assert said in capsys.readouterr().err


def test_categorical_columns_embed_as_their_values(tmp_path):
    """pandas categoricals (dictionary-encoded in Parquet) as ids, texts and carried
    columns: the run was refused at launch ("no usable id type"), and a categorical text
    column was planned from no sample; now the output is the plain columns' own."""
    texts = ["a first text", "the second", "a first text", None]  # row 3: a dead letter
    plain = {"doc": ["d0", "d1", "d2", "d3"], "body": texts, "lang": ["en", "fr", "en", "de"]}
    outputs = {}
    for name, columns in [
        ("plain", plain),
        ("categorical", {k: pa.array(v).dictionary_encode() for k, v in plain.items()}),
    ]:
        source, out = tmp_path / f"{name}.parquet", tmp_path / name
        pq.write_table(pa.table(columns), source)
        summary = embed_job.run(["--input", str(source), "--output", str(out), "--id_column", "doc",
                                 "--text_column", "body", "--keep_columns", "lang",
                                 "--no-progress"])  # fmt: skip
        assert (summary.rows, summary.results, summary.dead_letters) == (4, 3, 1), summary
        outputs[name] = pq.read_table(out).sort_by("id")
    assert outputs["categorical"].schema.field("id").type == pa.string()
    assert outputs["categorical"].column("id").to_pylist() == ["d0", "d1", "d2"]
    assert outputs["categorical"].column("lang").to_pylist() == ["en", "fr", "en"]
    got, want = (np.array(outputs[n].column("embedding").to_pylist()) for n in outputs)
    np.testing.assert_array_equal(got, want)


def test_keep_columns_from_json_lines_take_the_types_of_the_first_lines(tmp_path, capsys):
    rows = [{"id": i, "text": f"text {i}", "url": f"u{i}", "n": i * 2} for i in range(5)]
    source = tmp_path / "mine.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    embed_job.run(["--input", str(source), "--output", str(out), "--keep_columns", "url,n",
                   "--no-progress"])  # fmt: skip
    table = pq.read_table(out).sort_by("id")
    assert (
        table.schema.field("n").type == pa.int64() and table.schema.field("url").type == pa.string()
    )
    assert table.column("n").to_pylist() == [r["n"] for r in rows]


def test_keep_columns_carries_the_text_column_and_a_column_named_key(tmp_path):
    # "text" and "key" are also the names the job gives its own columns on the way: carried
    # under them, the run failed in its embedding step ('Field "text" exists 2 times').
    rows = [{"id": i, "text": f"text {i}", "key": f"k{i}"} for i in range(4)]
    parquet, jsonl = tmp_path / "mine.parquet", tmp_path / "mine.jsonl"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for source in (parquet, jsonl):
        out = tmp_path / f"out-{source.suffix[1:]}"
        embed_job.run(["--input", str(source), "--output", str(out), "--keep_columns",
                       "text,key", "--buckets", "16,256", "--no-progress"])  # fmt: skip
        table = pq.read_table(out).sort_by("id")
        assert table.column_names == ["id", "embedding", "text", "key"], source
        assert table.column("text").to_pylist() == [r["text"] for r in rows], source
        assert table.column("key").to_pylist() == [r["key"] for r in rows], source
