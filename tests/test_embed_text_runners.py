"""The flagship is correct however its steps are fused, and a failing job ends with its error.

Tokenizing, embedding and writing a part are one step (``EmbedParts``), so an ``accelerator``
resource hint on it (which gives it an environment of its own, so no runner fuses it with
its neighbours), Prism, or a Reshuffle between every pair of the job's steps change no
byte of its output. A job that fails in a step ends with its error and status 1, never an
abort at exit. Its dead letters are ``FailedElement`` records, one JSON line each.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

import beam_jax as bj
from beam_jax.text import MAX_TOKENIZED_CHARS
from pipelines.embed import job as embed_text
from tests import flagship as ft
from tests.processes import free_port, port_open, process_group

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Parts of 4 rows; float32 matmuls, as these runs are compared to 1e-5 and batched
# otherwise: with bfloat16 (`--matmuls auto` on a CPU with AMX) other batches round
# otherwise by up to about 1e-3.
PARTS = ("--rows_per_part", "4", "--matmuls", "float32")
T4 = "type:nvidia-tesla-t4;count:1"
NO_SPLIT = "--experiments=prism_disable_sdf_split"  # as tests/test_prism.py runs it


def _files(out: pathlib.Path) -> dict[str, bytes]:
    """The output's parts and dead letters (not the run's record, which holds timings)."""
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in out.rglob("*")
        if p.is_file() and not p.name.startswith("_embed_text") and p.name != "_metrics.json"
    }


def _parquet(out: pathlib.Path) -> dict[str, list]:
    return {p.name: pq.read_table(p).to_pylist() for p in sorted(out.glob("embeddings-*.parquet"))}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> pathlib.Path:
    """Two files: good rows, and each kind of bad row (the tokenize step's, the reader's)."""
    where = tmp_path_factory.mktemp("in")
    rows = [{"id": i, "text": t} for i, t in enumerate(ft.texts(20))]
    rows[3] = {"id": 3}  # no text: validation
    rows[8] = {"id": 8, "text": 8}  # not a string: the reader's
    rows[11] = {"id": 11, "text": "word" + " " * (MAX_TOKENIZED_CHARS + 10) + "word"}  # tokenize
    ft.write_json_lines(where / "a.jsonl", [*rows, b"not JSON"])  # a line that is no row
    other = [{"id": 100 + i, "text": t} for i, t in enumerate(ft.texts(7))]
    ft.write_json_lines(where / "b.jsonl", other)
    return where / "*.jsonl"


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("fused") / "out"
    summary = ft.run(source, out, *PARTS)
    assert summary.conserved and summary.dead_letters == 4, summary
    return out


def test_an_accelerator_hint_on_the_fnapi_runner_writes_the_same_bytes(source, reference, tmp_path):
    summary = ft.run(source, tmp_path / "out", *PARTS, "--accelerator", T4)

    assert summary.conserved and summary.results == 24
    got, want = _files(tmp_path / "out"), _files(reference)
    assert sorted(got) == sorted(want) and any(n.startswith("_failed/") for n in want)
    assert _parquet(tmp_path / "out") == _parquet(reference)
    assert got == want


def test_a_reshuffle_between_every_pair_of_steps_writes_the_same_bytes(
    source, reference, tmp_path, monkeypatch
):
    # As on a multi-worker runner: the reader's paths and batches, and the parts, each
    # cross a Reshuffle; the model's worker starts in the pipeline's first stage.
    monkeypatch.setattr(embed_text.jobs, "single_worker_here", lambda options: False)
    monkeypatch.setattr(embed_text.jobs, "workers_here", lambda options: False)
    graph = _spy_graph(monkeypatch)

    ft.run(source, tmp_path / "out", *PARTS)

    shuffles = [label for label in graph if label.endswith("Reshuffle") or "Spread" in label]
    assert "StartEmbedWorker" in graph and "Read/SpreadParts" in graph, sorted(graph)
    assert len(shuffles) >= 2, shuffles
    assert _files(tmp_path / "out") == _files(reference)


def _spy_graph(monkeypatch) -> list[str]:
    """The labels of every transform the job builds (filled when it is built)."""
    graph = []
    build = embed_text._build

    def spy(pipeline, *args, **kwargs):
        out = build(pipeline, *args, **kwargs)
        todo = list(pipeline.transforms_stack[0].parts)
        while todo:
            node = todo.pop()
            graph.append(node.full_label)
            todo += node.parts
        return out

    monkeypatch.setattr(embed_text, "_build", spy)
    return graph


def test_bundles_in_threads_of_this_process_write_the_same_embeddings(
    source, reference, tmp_path, monkeypatch
):
    # The in-memory FnApiRunner running 3 bundles at once, as an accelerator worker's one
    # SDK process runs bundles in its harness threads: the parts are spread over them,
    # and the worker this process started (the model loaded, its shapes compiled) is the
    # one every thread's step takes.
    from beam_jax._src.transforms import base

    started = []
    monkeypatch.setattr(base, "_start", lambda *a, f=base._start: started.append(a[0]) or f(*a))
    graph = _spy_graph(monkeypatch)

    summary = ft.run(source, tmp_path / "out", *PARTS, "--direct_num_workers=3")

    assert summary.conserved and summary.results == 24
    assert "Read/SpreadParts" in graph and "StartEmbedWorker" not in graph, sorted(graph)
    assert len(started) == 1, started  # started once, here, before the pipeline ran
    _assert_same_embeddings(tmp_path / "out", reference)  # other batches: last bits differ


def _assert_same_embeddings(out: pathlib.Path, reference: pathlib.Path) -> None:
    """The same files, dead letters byte for byte, each part's ids in order and its vectors
    within 1e-5 (batched otherwise, they round otherwise in the last bits)."""
    got, want = _files(out), _files(reference)
    assert sorted(got) == sorted(want)
    assert {n: b for n, b in got.items() if n.startswith("_failed/")} == {
        n: b for n, b in want.items() if n.startswith("_failed/")
    }
    for name, rows in _parquet(reference).items():
        table = pq.read_table(out / name)
        assert table.column("id").to_pylist() == [r["id"] for r in rows], name
        vectors = np.array(table.column("embedding").to_pylist())
        np.testing.assert_allclose(vectors, [r["embedding"] for r in rows], atol=1e-5)


def _prism_binary() -> str | None:
    runners = pathlib.Path(os.environ.get("RUNNERS_DIR", ROOT / ".runners"))
    found = sorted(runners.glob("prism-v*/prism"))
    return str(found[-1]) if found else None


def test_on_prism_the_accelerator_hint_writes_the_same_bytes(source, reference, tmp_path):
    prism = _prism_binary()
    if prism is None:
        pytest.skip("Prism is not built here: `make runners` (tools/runners.sh) builds it")
    # Prism bundles the parts as it likes (batches of other sizes round otherwise in the
    # last bits, as on any runner): its runs with and without the hint are compared byte
    # for byte, and with the FnApiRunner's run part by part. The test starts and stops its
    # own Prism: the one PrismRunner starts lives until this process exits, and is left
    # behind when a test worker is made to exit without its exit handlers.
    port = free_port()
    cmd = [prism, f"--job_port={port}", "--serve_http=false", "--log_kind=text"]
    ready = lambda _: f"localhost:{port}" if port_open(port) else None  # noqa: E731
    with process_group(cmd, str(tmp_path / "prism.log"), ready, timeout_s=120) as endpoint:
        flags = ["--runner=PortableRunner", f"--job_endpoint={endpoint}",
                 "--environment_type=LOOPBACK", NO_SPLIT]  # fmt: skip
        ft.run(source, tmp_path / "plain", *PARTS, *flags)
        ft.run(source, tmp_path / "hinted", *PARTS, *flags, "--accelerator", T4)

    assert _files(tmp_path / "hinted") == _files(tmp_path / "plain")
    _assert_same_embeddings(tmp_path / "hinted", reference)


def test_dead_letters_are_failed_elements_with_their_origin(reference):
    lines = ft.dead_letter_lines(reference)
    records = [bj.FailedElement.from_dict(json.loads(line)) for line in lines]

    got = [(r.key, pathlib.Path(r.source).name, r.row, r.stage) for r in records]
    assert sorted(got, key=repr) == sorted(
        [
            (3, "a.jsonl", 3, "validation"),
            (8, "a.jsonl", 8, "read"),
            (11, "a.jsonl", 11, "tokenize"),
            (None, "a.jsonl", 20, "read"),
        ],
        key=repr,
    )


def test_the_dead_letters_name_the_id_file_and_row(reference):
    _, failed = ft.read_outputs(reference)

    got = [(d["id"], pathlib.Path(d["file"]).name, d["row"], d["stage"]) for d in failed]
    assert sorted(got, key=repr) == sorted(
        [
            (3, "a.jsonl", 3, "validation"),
            (8, "a.jsonl", 8, "read"),
            (11, "a.jsonl", 11, "tokenize"),
            (None, "a.jsonl", 20, "read"),
        ],
        key=repr,
    )


_FAILING_JOB = """
import sys
from pipelines.embed import read

def broken(*args):
    raise RuntimeError("the reader broke (simulated)")

read._builtin_part = broken  # fails the read step while the model's shapes compile
from pipelines.embed.job import main
main(sys.argv[1:])
"""


def test_a_job_that_fails_in_a_step_ends_with_its_error_and_status_1(tmp_path):
    out = tmp_path / "out"
    flags = ["--builtin_texts", "3000", "--batching", "buckets", "--output", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    proc = subprocess.run(
        [sys.executable, "-c", _FAILING_JOB, *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "embed_text failed in step" in proc.stderr and "the reader broke" in proc.stderr
    assert "terminate called" not in proc.stderr
    assert not list(out.glob("embeddings-*")), "nothing is published by a failed job"
