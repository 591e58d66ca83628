"""The runner matrix on Prism, Beam's portable local runner, built from Beam's published Go
module at the installed SDK's version (``tools/runners.sh``, cached under ``.runners/``).

Every transform of ``tests._matrix_job`` (``RunKernel``, cross-bundle ``RunKernel``,
``RunKernelOnArrow``, ``ReduceKernel`` global and windowed), with bad records, runs once on
the FnApiRunner and on Prism in batch and streaming mode; outputs and dead letters must be
byte-identical. A ``TestStream`` of small bundles runs on Prism too, and the flagship
(``python -m pipelines.embed``) runs with ``--runner=PrismRunner --prism_location``, as
a user would, and must write the same bytes as on the FnApiRunner.

Prism runs in its own process group on a free port; the group is killed after the module
and must be empty afterwards. Start-up is awaited by polling the port, never by sleeping.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

import beam_jax as bj
from pipelines.embed import job as embed_text
from tests import _matrix_job as matrix
from tests import _runner_job as job
from tests import flagship as ft
from tests.kill_after_parts import KillAfterParts
from tests.processes import (
    free_port,
    group_members,
    port_open,
    process_group,
    wait_until,
    worker_pool,
)

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120
JOB_TIMEOUT_MS = 300_000


@pytest.fixture(scope="module")
def prism_binary() -> str:
    """The prism binary matching the installed Beam SDK; built by ``go install`` if missing."""
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "runners.sh"), "path", "prism"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    if proc.returncode != 0:
        pytest.fail(f"tools/runners.sh could not provide prism:\n{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def prism(prism_binary, tmp_path_factory) -> str:
    """A Prism job service on localhost, for the whole module: its endpoint."""
    port = free_port()
    log = str(tmp_path_factory.mktemp("prism") / "prism.log")
    cmd = [prism_binary, f"--job_port={port}", "--serve_http=false", "--log_kind=text"]
    with process_group(
        cmd, log, lambda _: f"localhost:{port}" if port_open(port) else None,
        timeout_s=START_TIMEOUT_S,
    ) as endpoint:  # fmt: skip
        yield endpoint


# Prism 2.77 loses elements when it splits a running bundle of a splittable DoFn (Create
# and file reads are ones): with downstream work slow enough to trigger a split, a few
# elements never arrive. Turning those splits off is what docs/runners.md tells users to do.
NO_SPLIT = "--experiments=prism_disable_sdf_split"


def _on_prism(endpoint: str, *extra: str) -> list[str]:
    return [
        "--runner=PortableRunner",
        f"--job_endpoint={endpoint}",
        "--environment_type=LOOPBACK",
        NO_SPLIT,
        *extra,
    ]


@pytest.fixture(scope="module")
def matrix_runs(tmp_path_factory, prism):
    """``runs(name)``: ``(outputs, result)`` of the matrix job on one runner, run once."""
    tmp = tmp_path_factory.mktemp("matrix")
    parquet = str(tmp / "in.parquet")
    matrix.write_parquet(parquet)
    options = {
        "fnapi": ["--runner=FnApiRunner"],
        "prism": _on_prism(prism),
        "prism_streaming": _on_prism(prism, "--streaming"),
    }
    done = {}

    def runs(name: str):
        if name not in done:
            out = str(tmp / name)
            result = matrix.run(options[name], out, parquet, timeout_ms=JOB_TIMEOUT_MS)
            done[name] = (matrix.read_outputs(out), result)
        return done[name]

    return runs


def _expected_total(ids) -> np.ndarray:
    return np.sum([job.expected_sum(i) for i in ids], axis=0, dtype=np.float64).astype(np.float32)


def test_the_reference_outputs_are_right(matrix_runs):
    outputs, result = matrix_runs("fnapi")
    dead = job.expected_dead_letters()
    good = sorted(set(range(job.N)) - set(dead))
    for branch in ("run", "cross_bundle", "arrow"):
        assert [json.loads(line)["id"] for line in outputs[branch]] == sorted(good, key=str)
        assert outputs[branch] == outputs["run"], branch
    for branch in matrix.BRANCHES:
        got = {
            json.loads(line)["key"]: json.loads(line)["stage"] for line in outputs[f"{branch}_dead"]
        }
        assert got == dead, branch
    (total,) = [json.loads(line) for line in outputs["reduce"]]
    assert total["count"] == len(good)
    assert [float.fromhex(v) for v in total["sum"]["values"]] == _expected_total(good).tolist()
    windows = sorted(json.loads(line)["window"] for line in outputs["reduce_windowed"])
    assert windows == [0.0, 20.0, 40.0], "one reduction per window"
    for line in outputs["reduce_windowed"]:
        r = json.loads(line)
        ids = [i for i in good if r["window"] <= i < r["window"] + matrix.WINDOW_S]
        assert r["count"] == len(ids)
        assert [float.fromhex(v) for v in r["sum"]["values"]] == _expected_total(ids).tolist()
    for branch in matrix.BRANCHES:
        summary = bj.summarize(result, namespace=branch)
        assert summary.elements == job.N and summary.conserved, (branch, summary)


@pytest.mark.parametrize("runner", ["prism", "prism_streaming"])
def test_prism_gives_the_fnapi_runners_bytes(matrix_runs, runner):
    reference, _ = matrix_runs("fnapi")
    outputs, result = matrix_runs(runner)
    for name in reference:
        assert outputs[name] == reference[name], (runner, name)
    for branch in matrix.BRANCHES:
        summary = bj.summarize(result, namespace=branch)
        assert summary.elements == job.N and summary.dead_letters == 10, (branch, summary)
        assert summary.conserved, (branch, summary)
    cross = bj.summarize(result, namespace="cross_bundle").buffering
    assert cross.waited == job.N - 7, cross  # every valid element went through a buffer


def test_test_stream_of_small_bundles_on_prism(matrix_runs, prism):
    """Bundles of 5 elements with the watermark advanced per window: cross-bundle RunKernel
    and the windowed ReduceKernel give the FnApiRunner's lines, one reduction per window."""
    reference, _ = matrix_runs("fnapi")
    stream = _TestStream()
    for start in range(0, job.N, 5):
        stream.add_elements(
            [window.TimestampedValue(job.make_element(i), i) for i in range(start, start + 5)]
        )
        if (start + 5) % matrix.WINDOW_S == 0:
            stream.advance_watermark_to(start + 5)
    stream.advance_watermark_to_infinity()

    p = beam.Pipeline(options=PipelineOptions(_on_prism(prism, "--streaming")))
    events = p | stream | beam.WindowInto(window.FixedWindows(matrix.WINDOW_S))
    options = matrix._options("stream", job.OUTPUT_SPEC)
    results, dead = (
        events
        | "Run"
        >> bj.RunKernel(job.kernel, keyed=True, **options)
        .with_cross_bundle_batching(max_wait_s=1.0, shards=2)
        .with_exception_handling()
    )
    totals, reduce_dead = (
        events
        | "Reduce"
        >> bj.ReduceKernel(
            matrix.sum_kernel, keyed=True, **matrix._options("stream_reduce")
        ).with_exception_handling()
    )
    assert_that(results | "Lines" >> beam.Map(job.result_line), equal_to(reference["run"]))
    assert_that(
        dead | "DeadLines" >> beam.Map(job.dead_letter_line),
        equal_to(reference["run_dead"]),
        label="Dead",
    )
    assert_that(
        totals | "Totals" >> beam.Map(matrix.reduction_line),
        equal_to(reference["reduce_windowed"]),
        label="Totals",
    )
    assert_that(
        reduce_dead | "ReduceDead" >> beam.Map(job.dead_letter_line),
        equal_to(reference["reduce_windowed_dead"]),
        label="ReduceDead",
    )
    result = p.run()
    assert (
        result.wait_until_finish(duration=JOB_TIMEOUT_MS) == beam.runners.runner.PipelineState.DONE
    )
    summary = bj.summarize(result, namespace="stream")
    assert summary.conserved and summary.buffering.waited == job.N - 7, summary


def _embed(out: pathlib.Path, source: pathlib.Path, *flags: str) -> str:
    """``python -m pipelines.embed`` in its own process group; the group must end
    with it (PrismRunner stops the prism it started when the job's process exits)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pipelines.embed", "--input", str(source),
           "--output", str(out), *flags]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=JOB_TIMEOUT_MS / 1000)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert wait_until(lambda: not group_members(proc.pid), 30), "the job left processes"
    assert proc.returncode == 0, log
    return log


def _files(out: pathlib.Path) -> dict[str, bytes]:
    """Every output file but the run's own report and metrics (they hold timings)."""
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and not p.name.startswith("_embed_text") and p.name != "_metrics.json"
    }


def test_flagship_on_prism_writes_the_fnapi_runners_bytes(tmp_path, prism_binary):
    rows = [{"id": f"doc-{i}", "text": f"Row {i} is a short sentence about the pipeline."}
            for i in range(12)]  # fmt: skip
    rows += [{"id": "n42", "text": 42}, {"id": "missing"}, {"id": "long", "text": "word " * 300}]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join([json.dumps(r) for r in rows] + ["not JSON"]) + "\n")

    _embed(tmp_path / "fnapi", source, "--runner=FnApiRunner")
    _embed(
        tmp_path / "prism",
        source,
        "--runner=PrismRunner",
        f"--prism_location={prism_binary}",
        NO_SPLIT,
    )

    want, got = _files(tmp_path / "fnapi"), _files(tmp_path / "prism")
    assert any(name.startswith("embeddings-") for name in want), sorted(want)
    assert any(name.startswith("_failed/") for name in want), sorted(want)
    assert got == want
    failed = [json.loads(line) for name, data in want.items() if name.startswith("_failed/")
              for line in data.decode().splitlines()]  # fmt: skip
    assert sorted(str(f["key"]) for f in failed) == ["None", "missing", "n42"]


@pytest.fixture
def pool(tmp_path):
    """A pool of SDK worker processes (each job's workers are its children): its address."""

    with worker_pool(str(tmp_path / "worker_pool.log"), START_TIMEOUT_S) as address:
        yield address


def test_a_killed_worker_fails_the_prism_job_and_a_rerun_completes_it(
    tmp_path, monkeypatch, prism, pool
):
    """An SDK worker SIGKILLed after writing 5 of 20 parts: Prism fails the job (it does not
    retry bundles), nothing is published, and the same command again reuses the written
    parts and gives every row exactly once, as an uninterrupted run does."""
    rows = [
        {"id": i, "text": f"Row {i} is a short sentence about the pipeline."} for i in range(60)
    ]
    rows[7]["text"] = 7  # one bad row
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    flags = ["--rows_per_part", "3"]  # 20 parts (0-2, 3-5, ...): the bad row stays in its part
    on_prism = [
        "--runner=PortableRunner",
        f"--job_endpoint={prism}",
        "--environment_type=EXTERNAL",
        f"--environment_config={pool}",
        NO_SPLIT,
    ]

    def run(out):
        args = ["--input", str(source), "--output", str(out), *flags, *on_prism]
        return embed_text.run(args)

    reference = tmp_path / "uninterrupted"
    parts = run(reference).parts_written
    assert parts == 20, parts
    marker = tmp_path / "killed"
    killer = functools.partial(KillAfterParts, marker=str(marker), after=5)
    monkeypatch.setattr(embed_text, "EmbedParts", killer)  # SIGKILL after 5 parts, once
    out = tmp_path / "out"

    with pytest.raises(Exception):  # noqa: B017 - the runner's own error type varies
        run(out)

    assert marker.exists(), "no worker was killed"
    assert int(marker.read_text()) != os.getpid(), "the kill must hit a worker process"
    written = sorted((out / "_unfinished").glob("embeddings-*.parquet"))
    assert 5 <= len(written) < parts, len(written)
    assert not list(out.glob("embeddings-*")), "nothing is published by a failed job"

    summary = run(out)  # the same command again

    assert summary.parts_reused == len(written), summary
    assert summary.parts_written == parts - len(written), summary
    assert sorted(_parts(out)) == sorted(_parts(reference))
    table, failed = ft.read_outputs(out)
    want, want_failed = ft.read_outputs(reference)
    assert sorted(ft.ids(table)) == sorted(ft.ids(want)) == [i for i in range(60) if i != 7]
    got, expected = _files(out), _files(reference)
    assert got.keys() == expected.keys()  # the same parts and dead-letter files
    for name, data in expected.items():
        if not name.startswith("embeddings-"):
            assert got[name] == data, name  # dead letters byte for byte
            continue
        # The parts the rerun wrote ran in other batches than the uninterrupted run's, and
        # XLA:CPU picks its dot algorithm by shape (batches of 8 rows or fewer differ from
        # larger ones by an ulp or so): the same ids in the same order, values that close.
        mine, theirs = (
            pq.read_table(pa.BufferReader(got[name])),
            pq.read_table(pa.BufferReader(data)),
        )
        assert mine.schema == theirs.schema and ft.ids(mine) == ft.ids(theirs), name
        np.testing.assert_allclose(
            np.stack(mine.column("embedding").to_numpy(zero_copy_only=False)),
            np.stack(theirs.column("embedding").to_numpy(zero_copy_only=False)),
            rtol=1e-5, atol=1e-6, err_msg=name,
        )  # fmt: skip
    assert [d["id"] for d in failed] == [d["id"] for d in want_failed] == [7]


def _parts(out: pathlib.Path) -> list[str]:
    return [p.name for p in out.glob("embeddings-*.parquet")]


def test_runners_script_starts_and_stops_prism(prism_binary, tmp_path):
    """``tools/runners.sh start prism PORT`` returns once the port listens; ``stop`` ends the
    process group it started."""
    port = free_port()
    env = dict(os.environ, PYTHON=sys.executable, RUNNERS_DIR=str(tmp_path))
    # The script builds prism into RUNNERS_DIR; give it the built one instead of a rebuild.
    target = tmp_path / pathlib.Path(prism_binary).parent.name
    target.mkdir()
    (target / "prism").symlink_to(prism_binary)
    script = ["bash", str(ROOT / "tools" / "runners.sh")]

    def call(*args):
        return subprocess.run([*script, *args], env=env, capture_output=True, text=True,
                              timeout=START_TIMEOUT_S + 30)  # fmt: skip

    started = call("start", "prism", str(port))
    try:
        assert started.returncode == 0, started.stderr
        assert port_open(port)
        assert f"--job_endpoint=localhost:{port}" in started.stdout
        pid = int((tmp_path / "prism.pid").read_text())
        assert call("start", "prism", str(port)).returncode != 0, "a second start is refused"
    finally:
        stopped = call("stop", "prism")
    assert stopped.returncode == 0, stopped.stderr
    assert wait_until(lambda: not group_members(pid), 30)
    assert not port_open(port)
    assert not (tmp_path / "prism.pid").exists()
