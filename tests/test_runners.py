"""The same job on every runner that runs here: in-process, multi-process, portable.

The portable tests start Beam's Python job service and an EXTERNAL worker pool, each in its
own process group on a port the OS picks, and kill those groups in a ``finally``; every run
then checks that no process it started (services, SDK workers) is left.

Each runner runs the job once per module; the matrix test reuses those runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import NamedTuple

import pytest

import beam_jax as bj
from tests import _runner_job as job
from tests.processes import descendants as _descendants
from tests.processes import process_group, worker_env, worker_pool
from tests.processes import wait_until as _wait_until

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 60
JOB_TIMEOUT_MS = 120_000


def _service(
    module: str, args: list[str], log_path: str, ready: Callable[[str], str | None]
) -> contextlib.AbstractContextManager[str]:
    """Run ``python -m module args`` in its own process group until the block ends."""
    return process_group(
        [sys.executable, "-m", module, *args],
        log_path,
        ready,
        env=worker_env(),
        timeout_s=START_TIMEOUT_S,
    )


def _job_service(tmp: str) -> contextlib.AbstractContextManager[str]:
    port_file = os.path.join(tmp, "job_service.port")

    def ready(_log: str) -> str | None:
        if not os.path.exists(port_file):
            return None
        with open(port_file) as f:
            return f"localhost:{f.read().strip()}"

    return _service(
        "apache_beam.runners.portability.local_job_service_main",
        ["--port=0", f"--port_file={port_file}", f"--staging_dir={os.path.join(tmp, 'staging')}"],
        os.path.join(tmp, "job_service.log"),
        ready,
    )


def _worker_pool(tmp: str) -> contextlib.AbstractContextManager[str]:
    return worker_pool(os.path.join(tmp, "worker_pool.log"), START_TIMEOUT_S)


def _run_in_process(out: str, tmp: str) -> bj.Summary:
    return bj.summarize(job.run(["--runner=FnApiRunner"], out))


def _run_multi_processing(out: str, tmp: str) -> bj.Summary:
    options = [
        "--runner=FnApiRunner",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    ]
    return bj.summarize(job.run(options, out))


def _run_portable_external(out: str, tmp: str) -> bj.Summary:
    with _job_service(tmp) as endpoint, _worker_pool(tmp) as pool:
        options = [
            "--runner=PortableRunner",
            f"--job_endpoint={endpoint}",
            "--environment_type=EXTERNAL",
            f"--environment_config={pool}",
        ]
        # Metrics are read from the job service, so before it stops.
        return bj.summarize(job.run(options, out, timeout_ms=JOB_TIMEOUT_MS))


def _run_portable_loopback(out: str, tmp: str) -> bj.Summary:
    with _job_service(tmp) as endpoint:
        options = [
            "--runner=PortableRunner",
            f"--job_endpoint={endpoint}",
            "--environment_type=LOOPBACK",
        ]
        return bj.summarize(job.run(options, out, timeout_ms=JOB_TIMEOUT_MS))


RUNNERS = {
    "in_process": _run_in_process,
    "multi_processing": _run_multi_processing,
    "portable_external": _run_portable_external,
    "portable_loopback": _run_portable_loopback,
}


class Run(NamedTuple):
    out: str  # the output directory
    summary: bj.Summary


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Callable[[str], Run]:
    """``outputs(runner)``: the job run on ``runner``, once per module.

    Each run checks that every process started for it (services, SDK workers) is gone.
    """
    done: dict[str, Run] = {}

    def get(runner: str) -> Run:
        if runner not in done:
            tmp = str(tmp_path_factory.mktemp(runner))
            out = os.path.join(tmp, "out")
            before = _descendants(os.getpid())
            try:
                summary = RUNNERS[runner](out, tmp)
            finally:
                # The runner itself stops multi-processing SDK workers; make sure, and clean
                # up after it if it didn't.
                _wait_until(lambda: not _descendants(os.getpid()) - before, 10)
                left = _descendants(os.getpid()) - before
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            assert not left, f"{runner} left processes {sorted(left)} behind"
            done[runner] = Run(out, summary)
        return done[runner]

    return get


def _check_job_outputs(run: Run) -> None:
    out = run.out
    results = [json.loads(line) for line in job.read_lines(out, "results")]
    dead = [json.loads(line) for line in job.read_lines(out, "dead_letters")]
    expected_dead = job.expected_dead_letters()
    assert {d["key"]: d["stage"] for d in dead} == expected_dead
    assert len(dead) == len(expected_dead), "one dead letter per failed element"
    assert sorted(r["id"] for r in results) == sorted(set(range(job.N)) - set(expected_dead))
    for r in results:
        got = [float.fromhex(v) for v in r["sum"]["values"]]
        assert got == job.expected_sum(r["id"]).tolist(), r["id"]
        length, _ = job.make_element(r["id"])[1]["x"].shape
        assert r["rows"]["shape"] == [length, job.D], "rows are cut back to the element's length"
    assert run.summary.elements == job.N, run.summary
    assert run.summary.dead_letters == len(expected_dead) and run.summary.conserved, run.summary


@pytest.mark.parametrize("runner", ["multi_processing", "portable_external"])
def test_job_runs_in_worker_processes(outputs, runner):
    run = outputs(runner)
    _check_job_outputs(run)
    pids = job.loading_pids(run.out)
    assert pids and os.getpid() not in pids, "parameters were loaded in this process"


def test_every_runner_gives_identical_bytes(outputs):
    reference = outputs("in_process")
    _check_job_outputs(reference)
    assert job.loading_pids(reference.out) == {os.getpid()}
    for runner in RUNNERS:
        assert job.read_outputs(outputs(runner).out) == job.read_outputs(reference.out), runner
        assert outputs(runner).summary.conserved, (runner, outputs(runner).summary)
