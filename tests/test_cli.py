"""The ``beam-jax`` command on real Parquet and JSON-lines files, its plots, and its report
of a real run's metrics."""

from __future__ import annotations

import importlib
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomllib

import beam_jax as bj
from beam_jax._src.cli import main as cli
from beam_jax._src.cli import plan, report
from beam_jax.internal import padding_ratio
from tests import flagship as ft


# Only the plotting tests need matplotlib (the [plot] extra); the others run without it.
def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


needs_matplotlib = pytest.mark.skipif(
    not _importable("matplotlib.image"), reason="needs matplotlib (the [plot] extra)"
)

ROOT = pathlib.Path(__file__).parent.parent
RED = np.array([0xC4, 0x4E, 0x52]) / 255  # the boundary lines' colour
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _lengths(n: int = 400, seed: int = 0) -> np.ndarray:
    """Long-tailed lengths, as tokens of prose are."""
    return np.random.default_rng(seed).zipf(1.6, n).clip(1, 300).astype(np.int64) + 3


def _plan_json(capsys, *argv) -> dict:
    assert cli.main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _red_columns(png: pathlib.Path, left_fraction: float) -> int:
    """Vertical runs of the boundary colour in the left part of the image: drawn lines."""
    from matplotlib import image as matplotlib_image

    image = matplotlib_image.imread(png)[..., :3]
    part = image[:, : int(image.shape[1] * left_fraction)]
    red = (np.abs(part - RED) < 0.08).all(axis=-1).sum(axis=0) >= 20
    return int(np.count_nonzero(np.diff(red.astype(int)) == 1) + red[0])


def test_the_console_script_is_declared_and_every_subcommand_has_help(capsys):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["beam-jax"].partition(":")
    assert (module, function) == ("beam_jax._src.cli.main", "main")
    for command in (["--help"], ["plan", "--help"], ["report", "--help"], ["embed", "--help"],
                    ["curate", "--help"]):  # fmt: skip
        with pytest.raises(SystemExit) as done:
            cli.main(command)
        assert done.value.code == 0, command
        out = capsys.readouterr().out
        assert "usage:" in out, command
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = capsys.readouterr().out
    assert all(name in top for name in ("plan", "report", "embed", "curate"))


def test_plan_of_a_parquet_list_column_gives_the_planner_s_boundaries_for_each_budget(
    tmp_path, capsys
):
    lengths = _lengths()
    values = pa.array([np.zeros(n, np.int32) for n in lengths], pa.list_(pa.int32()))
    pq.write_table(
        pa.table({"id": np.arange(len(lengths)), "tokens": values}), tmp_path / "a.parquet"
    )
    got = _plan_json(capsys, "--input", str(tmp_path / "a.parquet"), "--column", "tokens",
                     "--max-buckets", "5")  # fmt: skip
    assert got["lengths"]["rows"] == len(lengths) and got["lengths"]["max"] == lengths.max()
    assert [p["num_buckets"] for p in got["plans"]] == [1, 2, 3, 4, 5]
    for p in got["plans"]:
        expected = bj.plan_boundaries(lengths, p["num_buckets"])
        assert tuple(p["boundaries"]) == expected
        assert p["padding_ratio"] == pytest.approx(padding_ratio(lengths, expected))
        assert sum(b["elements"] for b in p["buckets"]) == len(lengths)
    ratios = [p["padding_ratio"] for p in got["plans"]]
    assert ratios == sorted(ratios, reverse=True) and ratios[0] > ratios[-1]


def test_plan_shows_the_packed_plans_beside_the_buckets_as_the_packer_runs_them(tmp_path, capsys):
    lengths = _lengths()
    values = pa.array([np.zeros(n, np.int32) for n in lengths], pa.list_(pa.int32()))
    pq.write_table(pa.table({"tokens": values}), tmp_path / "a.parquet")
    argv = ["--input", str(tmp_path / "a.parquet"), "--column", "tokens", "--max-buckets", "3",
            "--pack-buffer", "200"]  # fmt: skip
    got = _plan_json(capsys, *argv)
    assert [p["compile_budget"] for p in got["packing"]] == [1, 2, 3]
    for p in got["packing"]:
        assert 1 <= len(p["shapes"]) <= p["compile_budget"]
        chosen = bj.plan_packing(
            np.maximum(lengths, 1), max_size=int(lengths.max()),
            compile_budget=p["compile_budget"], buffer_size=200, max_rows_per_batch=64,
            length_classes=False,
        )  # fmt: skip
        assert [tuple(s) for s in p["shapes"]] == chosen.packing.shapes()
        assert p["padding_ratio"] == pytest.approx(chosen.padding_ratio)
    assert cli.main(["plan", *argv]) == 0
    text = capsys.readouterr().out
    assert "packed (records end to end in rows, 200 records packed together" in text
    assert "row length x rows" in text


@needs_matplotlib
def test_plan_of_json_lines_texts_in_tokens_draws_one_line_per_boundary(tmp_path, capsys):
    rows = [{"id": i, "text": " ".join(["word"] * int(n))} for i, n in enumerate(_lengths(300))]
    source = ft.write_json_lines(tmp_path / "rows.jsonl", rows)
    png = tmp_path / "plan.png"
    assert cli.main(["plan", "--input", str(source), "--column", "text", "--tokenizer",
                     "minilm", "--max-buckets", "4", "--plot", str(png)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    # "word" is one token; [CLS] and [SEP] add two, and the flagship truncates at 256.
    tokens = np.minimum(_lengths(300) + 2, 256)
    best = bj.plan_boundaries(tokens, 4)
    line = next(r for r in out.splitlines() if r.split()[:1] == ["4"])
    assert line.split() == ["4", f"{padding_ratio(tokens, best):.2f}", ",".join(map(str, best))]
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert _red_columns(png, left_fraction=0.58) == len(best)
    # The same through the figure: the boundaries as vertical lines, the curve over 1..4.
    fig = plan.plot_plan(tokens, plan.plan_budgets(tokens, 4), str(tmp_path / "again.png"))
    hist, curve = fig.axes
    assert sorted(line.get_xdata()[0] for line in hist.lines) == list(best)
    assert list(curve.lines[0].get_xdata()) == [1, 2, 3, 4]


def test_plan_reads_a_file_whose_name_holds_glob_characters(tmp_path, capsys):
    source = tmp_path / "texts [v1].jsonl"
    source.write_text('{"text": "abc"}\n{"text": "abcdef"}\n')
    assert cli.main(["plan", "--input", str(source), "--column", "text"]) == 0
    assert "text: 2 values" in capsys.readouterr().out


def test_plan_of_json_lines_chars_and_a_wrong_column_or_measure(tmp_path, capsys):
    source = ft.write_json_lines(tmp_path / "rows.jsonl",
                                 [{"id": i, "text": "x" * (i + 1)} for i in range(20)])  # fmt: skip
    got = _plan_json(capsys, "--input", str(source), "--column", "text", "--max-buckets", "2")
    assert got["lengths"]["min"] == 1 and got["lengths"]["max"] == 20
    assert got["plans"][1]["boundaries"] == list(bj.plan_boundaries(np.arange(1, 21), 2))
    with pytest.raises(SystemExit, match=r"no column 'txt'; it has \['id', 'text'\]"):
        cli.main(["plan", "--input", str(source), "--column", "txt"])
    with pytest.raises(SystemExit, match="--measure list needs a list column"):
        cli.main(["plan", "--input", str(source), "--column", "text", "--measure", "list"])
    for measure in ("auto", "chars", "list"):
        with pytest.raises(SystemExit) as raised:
            cli.main(["plan", "--input", str(source), "--column", "id", "--measure", measure])
        assert str(raised.value) == (
            "beam-jax plan: the column is int64, which has no lengths to measure: plan "
            "measures a list column (--measure list: its lists' lengths) or a string column "
            "(--measure chars, bytes or tokens: its texts'); pass such a column with --column"
        )
    with pytest.raises(SystemExit, match="matches no file"):
        cli.main(["plan", "--input", str(tmp_path / "none-*.parquet"), "--column", "text"])


def test_plan_with_a_kernel_lists_each_shape_s_analysed_bytes_and_the_batch_limits(
    tmp_path, capsys
):
    lengths = _lengths(300)
    values = pa.array([np.zeros(n, np.int32) for n in lengths], pa.list_(pa.int32()))
    pq.write_table(pa.table({"x": values}), tmp_path / "a.parquet")
    argv = ["--input", str(tmp_path / "a.parquet"), "--column", "x", "--max-buckets", "3",
            "--kernel", "tests.cli_kernels:attention", "--memory-budget-mib", "4"]  # fmt: skip
    got = _plan_json(capsys, *argv)
    memory = got["memory"]
    budget = 4 << 20
    assert memory["budget_bytes"] == budget and memory["axis"] == "L"
    assert memory["boundaries"] == got["plans"][-1]["boundaries"]
    limits = [memory["limits"][str(b)] for b in memory["boundaries"]]
    assert limits == sorted(limits, reverse=True) and limits[-1] < limits[0]  # attention
    for b, limit in zip(memory["boundaries"], limits, strict=True):
        rows = {r["batch_size"]: r for r in memory["rows"] if r["bucket"] == [b]}
        assert all(r["limit"] == limit for r in rows.values())
        assert rows[limit]["chosen"] and rows[limit]["total_bytes"] <= budget
        assert rows[limit]["total_bytes"] == (
            rows[limit]["argument_bytes"] + rows[limit]["output_bytes"]
            + rows[limit]["temp_bytes"] + rows[limit]["hidden_bytes"]
            + rows[limit]["generated_code_bytes"] - rows[limit]["alias_bytes"]
        )  # fmt: skip
        above = [s for s in rows if s > limit]
        if limit < 64:  # the next allowed size was analysed and does not fit
            assert above and rows[min(above)]["total_bytes"] > budget
            assert not rows[min(above)]["fits"]

    assert cli.main(["plan", *argv]) == 0
    text = capsys.readouterr().out
    assert "memory of tests.cli_kernels:attention" in text
    assert "total_mib" in text and "trusted" in text and "fits" in text
    assert (
        "batch limit per bucket: "
        + ", ".join(f"{b}: {v}" for b, v in zip(memory["boundaries"], limits, strict=True))
        in text
    )
    if jax.default_backend() == "cpu":  # CPU devices report no memory: a budget is needed
        with pytest.raises(SystemExit, match="needs --memory_budget_mib"):
            cli.main(["plan", *argv[:-2]])
    with pytest.raises(
        SystemExit, match=r"neither 'minilm', a model directory, a registered name \(none"
    ):
        cli.main(["plan", *argv[:-3], "nope", "--memory-budget-mib", "4"])
    assert "warning" not in text  # every bucket's limit fits
    assert cli.main(["plan", *argv[:-1], "0.0001"]) == 0  # not even one record fits
    text = capsys.readouterr().out
    buckets = ", ".join(map(str, memory["boundaries"]))
    assert f"warning: the smallest batch of bucket(s) {buckets} does not fit the budget" in text


@needs_matplotlib
def test_a_run_s_metrics_file_feeds_the_report_and_its_plot(tmp_path, capsys):
    rows = [{"id": i, "text": t} for i, t in enumerate(ft.texts(12))] + [{"id": 99, "text": None}]
    out = tmp_path / "out"
    # A cache of its own: the programs other tests stored would load untraced.
    cache = ("--compilation_cache_dir", str(tmp_path / "cache"))
    summary = ft.run(ft.write_json_lines(tmp_path / "in.jsonl", rows), out, "--no-progress", *cache)
    capsys.readouterr()
    record = json.loads((out / "_metrics.json").read_text())
    assert record["pipeline"] == "embed_text" and record["summary"]["results"] == 12
    assert sum(b["elements"] for b in record["buckets"].values()) == summary.results
    stages = record["summary"]["dead_letters_by_stage"]
    assert sum(stages.values()) == 1  # the null text
    (stage,) = [s for s, n in stages.items() if n]

    png = tmp_path / "report.png"
    assert cli.main(["report", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "per bucket:" in text and f"{stage}: 1" in text
    traced = record["kernel"]["compile_trace_seconds"]
    assert 0 < traced <= record["summary"]["compile_seconds"]
    (line,) = [line for line in text.splitlines() if line.strip().startswith("of it tracing")]
    assert line.split()[-1] == f"{traced:,.2f}"
    for label, b in record["buckets"].items():
        assert any(line.split()[:2] == [label, str(b["elements"])] for line in text.splitlines())
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    fig = report.plot_report(record, str(tmp_path / "again.png"))
    elements = fig.axes[0]
    assert [p.get_height() for p in elements.patches] == [
        b["elements"] for b in record["buckets"].values()
    ]
    assert [t.get_text() for t in fig.axes[4].get_xticklabels()] == list(
        record["summary"]["dead_letters_by_stage"]
    )
    with pytest.raises(SystemExit, match="not a run's metrics file"):
        cli.main(["report", str(out / "_embed_text.json")])
    lines = ft.write_json_lines(tmp_path / "rows.jsonl", [{"id": 1}, {"id": 2}])
    with pytest.raises(SystemExit) as raised:
        cli.main(["report", str(lines)])
    assert str(raised.value) == (
        f"beam-jax report: {lines} is not a run's metrics file: it does not read as one JSON "
        "object (Extra data: line 2 column 1 (char 10)). Give the OUTPUT directory of a "
        "finished run, or its OUTPUT/_metrics.json"
    )
    assert "none" not in [t.get_text() for t in fig.axes[4].texts]

    # A run without dead letters: the panel says so, as the text report does.
    clean = json.loads(json.dumps(record))
    clean["summary"]["dead_letters_by_stage"] = {s: 0 for s in stages}
    clean["summary"]["dead_letters"] = 0
    fig = report.plot_report(clean, str(tmp_path / "clean.png"))
    assert [t.get_text() for t in fig.axes[4].texts] == ["none"]
    assert report.render(clean).endswith("dead letters by stage:\n  none")


def test_beam_jax_help_prints_no_warning():
    done = subprocess.run([sys.executable, "-m", "beam_jax", "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "plan" in done.stdout
    assert done.stderr == "", done.stderr


def test_plan_warns_of_values_over_max_size_and_prints_lines_to_paste(tmp_path, capsys):
    lengths = np.array([5, 9, 30, 64, 70, 200, 300], np.int64)
    values = pa.array([np.zeros(n, np.int32) for n in lengths], pa.list_(pa.int32()))
    pq.write_table(pa.table({"tokens": values}), tmp_path / "a.parquet")
    argv = ["plan", "--input", str(tmp_path / "a.parquet"), "--column", "tokens",
            "--max-buckets", "3", "--max-size", "64"]  # fmt: skip
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "warning: 3 of 7 values (42.9%) are longer than --max_size 64" in captured.err
    best = bj.plan_boundaries(np.minimum(lengths, 64), 3, max_size=64)
    python = f'bj.Bucketing(boundaries={{"L": {tuple(best)!r}}})'
    assert python in captured.out
    bucketing = eval(python, {"bj": bj})  # the pasted line is valid Python
    assert bucketing.boundaries["L"] == tuple(best)
    # List lengths are no token counts of a model: no flag line for the embed job.
    assert "  --buckets " not in captured.out and "no line for beam-jax embed" in captured.out
    got = _plan_json(capsys, *argv[1:])
    assert got["over_max_size"] == 3 and got["paste"]["flag"] is None
    # Nothing over: no warning.
    assert cli.main(argv[:-1] + ["300"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_every_flag_of_every_command_has_help(capsys):
    from pipelines import curate
    from pipelines.embed import flags as embed_text_flags

    parsers = [embed_text_flags._parser()]
    with pytest.raises(SystemExit):
        curate.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "(default: " in out and "--flip_fraction" in out
    top = cli._parser()
    for action in top._subparsers._group_actions[0].choices.values():
        parsers.append(action)
    for parser in parsers:
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{parser.prog} {action.option_strings} has no help"


def test_embed_help_names_the_command_it_was_run_as(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["/usr/local/bin/beam-jax", "embed", "--help"])
    with pytest.raises(SystemExit):
        cli.main(["embed", "--help"])
    assert capsys.readouterr().out.startswith("usage: beam-jax embed")
    monkeypatch.setattr("sys.argv", ["/usr/local/bin/beam-jax", "curate", "--help"])
    with pytest.raises(SystemExit):
        cli.main(["curate", "--help"])
    assert capsys.readouterr().out.startswith("usage: beam-jax curate")


def test_plan_takes_a_sentence_transformers_model_directory_as_tokenizer_and_kernel(
    tmp_path, capsys
):
    """A model directory needs no entry point: its tokenizer counts tokens as the encoder
    embeds them (truncated at its max_seq_length), and its encoder is the kernel analysed."""
    from tests.tiny_bert import write_tiny_bert

    model = write_tiny_bert(tmp_path / "model")  # max_seq_length 32
    words = np.random.default_rng(0).integers(0, 50, 120)
    rows = [{"id": i, "text": " ".join(["cat"] * int(n))} for i, n in enumerate(words)]
    source = ft.write_json_lines(tmp_path / "rows.jsonl", rows)
    got = _plan_json(capsys, "--input", str(source), "--column", "text", "--tokenizer",
                     str(model), "--max-buckets", "2", "--max-size", "32")  # fmt: skip
    tokens = np.minimum(words + 2, 32)
    assert got["lengths"]["min"] == tokens.min() and got["lengths"]["max"] == 32
    assert got["plans"][1]["boundaries"] == list(bj.plan_boundaries(tokens, 2, max_size=32))

    values = pa.array([np.zeros(n, np.int32) for n in tokens], pa.list_(pa.int32()))
    pq.write_table(pa.table({"input_ids": values}), tmp_path / "ids.parquet")
    got = _plan_json(capsys, "--input", str(tmp_path / "ids.parquet"), "--column", "input_ids",
                     "--max-buckets", "2", "--max-size", "32", "--kernel", str(model),
                     "--memory-budget-mib", "64", "--batch-size", "8")  # fmt: skip
    memory = got["memory"]
    assert memory["axis"] == "L" and memory["boundaries"] == got["plans"][-1]["boundaries"]
    assert all(memory["limits"][str(b)] == 8 for b in memory["boundaries"])  # all fit 64 MiB
    # A directory this encoder cannot read is refused with the reason.
    (model / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(SystemExit, match=r"has model_type 't5', which the encoder"):
        cli.main(["plan", "--input", str(tmp_path / "ids.parquet"), "--column", "input_ids",
                  "--kernel", str(model), "--memory-budget-mib", "64"])  # fmt: skip


def test_kernels_and_tokenizers_registered_by_other_packages_load_by_name(
    tmp_path, capsys, monkeypatch
):
    """The entry-point groups stay open to other packages (here registered in the test)."""
    from importlib import metadata

    from beam_jax._src.cli import registry

    kernel, tokenizer = registry.KERNELS, registry.TOKENIZERS
    points = {
        kernel: [metadata.EntryPoint("mine", "tests.cli_kernels:attention", kernel)],
        tokenizer: [metadata.EntryPoint("words", "tests.cli_kernels:word_counts", tokenizer)],
    }
    real = metadata.entry_points
    monkeypatch.setattr(
        registry.metadata,
        "entry_points",
        lambda group: points[group] if group in points else real(group=group),
    )
    words = [3, 5, 5, 9]
    rows = [{"id": i, "text": " ".join(["w"] * n)} for i, n in enumerate(words)]
    source = ft.write_json_lines(tmp_path / "rows.jsonl", rows)
    got = _plan_json(capsys, "--input", str(source), "--column", "text", "--tokenizer", "words")
    assert (got["lengths"]["min"], got["lengths"]["max"]) == (3, 9)
    values = pa.array([np.zeros(n, np.float32) for n in words], pa.list_(pa.float32()))
    pq.write_table(pa.table({"x": values}), tmp_path / "a.parquet")
    argv = ["--input", str(tmp_path / "a.parquet"), "--column", "x", "--max-buckets", "2"]
    got = _plan_json(capsys, *argv, "--kernel", "mine", "--memory-budget-mib", "4")
    assert got["memory"]["axis"] == "L"
    with pytest.raises(SystemExit, match=r"a registered name \('mine'\) nor 'module:attr'"):
        cli.main(["plan", "--input", str(tmp_path / "a.parquet"), "--column", "x",
                  "--kernel", "nope", "--memory-budget-mib", "4"])  # fmt: skip
