"""Texts planned alike whatever holds them: a Parquet ``string``, ``large_string``,
``binary`` (UTF-8) or dictionary (a pandas categorical) column, or JSON lines; and
``beam-jax plan`` on JSON lines with bad lines skips and counts them as the jobs do, naming
the first by its line number from 1."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jax._src.arrow.texts import utf8_texts
from beam_jax._src.cli import main as cli
from beam_jax.text import builtin_corpus
from pipelines.embed import flags as embed_flags
from pipelines.embed import plan as embed_plan
from pipelines.embed.parts import Inputs
from tests import processes

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXTS = [t for _, t in builtin_corpus(120)] + ["café ünïcode ✓ " * 3, "x"]
KINDS = {
    "string": pa.string(),
    "large_string": pa.large_string(),
    "binary": pa.binary(),
    "dictionary": pa.dictionary(pa.int32(), pa.string()),
}


def _inputs(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    """The same rows as Parquet with each text type, and as JSON lines."""
    out = {}
    for name, kind in KINDS.items():
        values = [t.encode() for t in TEXTS] if kind == pa.binary() else TEXTS
        path = tmp_path / f"{name}.parquet"
        table = pa.table({"id": range(len(TEXTS)), "text": pa.array(values, kind)})
        pq.write_table(table, path, row_group_size=50)
        out[name] = path
    out["jsonl"] = tmp_path / "rows.jsonl"
    out["jsonl"].write_text(
        "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS))
    )
    return out


def test_utf8_texts_reads_strings_and_bytes_alike_and_leaves_out_invalid_bytes():
    categorical = pa.dictionary(pa.int16(), pa.string())
    for kind in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), categorical):
        values = [t.encode() for t in TEXTS] if "binary" in str(kind) else TEXTS
        texts, invalid = utf8_texts(
            pa.chunked_array([pa.array(values[:5], kind), pa.array(values[5:], kind)])
        )
        assert texts.type == pa.large_string() and texts.to_pylist() == TEXTS and invalid == 0
    bad = pa.array([b"ok", b"\xff", None, b"\xc3\xa9"], pa.binary())
    assert utf8_texts(bad)[0].to_pylist() == ["ok", "é"] and utf8_texts(bad)[1] == 1
    with pytest.raises(TypeError, match="expected a string or binary column of texts, got int64"):
        utf8_texts(pa.array([1, 2]))


def test_the_launch_plan_is_the_same_for_every_text_type(tmp_path):
    plans = {}
    for name, path in _inputs(tmp_path).items():
        args, _ = embed_flags.parse_args(["--input", str(path), "--output", str(tmp_path / "o")])
        plan = embed_plan.plan_for(args, Inputs.from_args(args))
        plans[name] = (plan.sample, plan.describe())
    for name in ("binary", "dictionary"):  # not planned from nothing
        assert plans[name][0] == len(TEXTS), plans[name]
    assert all(p == plans["string"] for p in plans.values()), plans


def test_beam_jax_plan_gives_the_same_plan_for_every_text_type(tmp_path, capsys):
    got = {}
    for name, path in _inputs(tmp_path).items():
        argv = ["plan", "--input", str(path), "--column", "text", "--tokenizer", "minilm"]
        assert cli.main([*argv, "--max_buckets", "3", "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        got[name] = {k: plan[k] for k in ("lengths", "plans", "packing", "paste")}
    assert got["binary"]["lengths"]["rows"] == len(TEXTS)
    assert all(g == got["string"] for g in got.values()), got
    # Through the command itself, on the binary column: its plan equals the string one's.
    done = subprocess.run(
        [sys.executable, "-m", "beam_jax", "plan", "--input", str(tmp_path / "binary.parquet"),
         "--column", "text", "--tokenizer", "minilm", "--max-buckets", "3", "--json"],
        capture_output=True, text=True, cwd=ROOT, env=processes.worker_env(), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert {k: plan[k] for k in got["string"]} == got["string"]


def test_beam_jax_plan_skips_bad_json_lines_and_names_the_first_from_one(tmp_path):
    lines = [json.dumps({"id": i, "content": "word " * (i % 7 + 1)}) for i in range(70)]
    lines[62] = json.dumps({"id": 62, "content": 5})  # a number where the texts are strings
    lines.insert(10, "not json")  # line 11
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    argv = [sys.executable, "-m", "beam_jax", "plan", "--input", str(path), "--column", "content"]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, cwd=ROOT,
                          env=processes.worker_env(), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["lengths"]["rows"] == 69
    assert plan["skipped"]["lines"] == 2
    assert plan["skipped"]["first"].startswith(f"11 of {path}: the line is not valid JSON")
    warning = done.stderr.strip().splitlines()[-1]
    assert warning.startswith(
        f"warning: skipped 2 lines that are no row (the first: line 11 of {path}"
    )
    # The line that changed type alone: named by its line from 1 (63), with the type expected.
    del lines[10]
    path.write_text("\n".join(lines) + "\n")
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                          env=processes.worker_env(), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "69 values" in done.stdout
    assert "skipped 1 line that is no row (the first: line 63 of" in done.stderr, done.stderr
    assert "content: string" in done.stderr
