"""A ``dask.distributed`` cluster of separate processes on localhost, for tests/test_dask.py.

A scheduler (``dask scheduler``) and two worker processes of one thread each
(``dask worker --nworkers 2 --nthreads 1``, each under its nanny, which restarts a worker
that dies) listen on 127.0.0.1 only, on free ports, so concurrent test runs never meet.
Each runs in its own process group, killed when the block ends; no process may be left.
Start-up is awaited by asking the scheduler how many workers it has, never by sleeping.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator

from tests.processes import free_port, port_open, process_group, wait_until, worker_env

WORKERS = 2
START_TIMEOUT_S = 120
# Dask retries a task whose worker died under it up to `allowed-failures` times (Dask's
# default: 3). One retry is enough to test both outcomes of a killed worker: one kill is
# retried and the job completes; a second kill of the same task fails the job.
ALLOWED_FAILURES = 1


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A running cluster: its scheduler's address, and a client of the test process's own
    (not the process's default client) to watch it with."""

    address: str
    client: object  # distributed.Client

    def options(self, *extra: str) -> list[str]:
        """Pipeline options that run a job on this cluster with beam_jax's DaskRunner."""
        return [
            "--runner=beam_jax.runners.DaskRunner",
            f"--dask_client_address={self.address}",
            *extra,
        ]

    def wait_for_workers(self, n: int = WORKERS, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until ``n`` workers are registered (a killed one is restarted by its nanny)."""
        self.client.wait_for_workers(n, timeout=timeout_s)

    def wait_idle(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until no task runs on any worker: a failed job's tasks that were running when it
        was cancelled end in their own time (Dask cannot interrupt them)."""
        idle = wait_until(lambda: not any(self.client.processing().values()), timeout_s)
        assert idle, f"tasks still running after {timeout_s} s: {self.client.processing()}"

    def worker_pids(self) -> set[int]:
        """The process ids of the registered workers."""
        import os

        return set(self.client.run(os.getpid).values())


@contextlib.contextmanager
def dask_cluster(log_dir: str, workers: int = WORKERS) -> Iterator[Cluster]:
    """A scheduler and ``workers`` worker processes until the block ends."""
    from distributed import Client

    env = worker_env()
    env["DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"] = str(ALLOWED_FAILURES)
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = [
        sys.executable, "-m", "distributed.cli.dask_scheduler",
        "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
    ]  # fmt: skip
    workers_cmd = [
        sys.executable, "-m", "distributed.cli.dask_worker", address,
        "--nworkers", str(workers), "--nthreads", "1", "--host", "127.0.0.1",
        "--no-dashboard", "--local-directory", log_dir, "--death-timeout", "60",
    ]  # fmt: skip
    with (
        process_group(
            scheduler,
            f"{log_dir}/scheduler.log",
            lambda _: address if port_open(port) else None,
            env=env,
            timeout_s=START_TIMEOUT_S,
        ),
        process_group(
            workers_cmd,
            f"{log_dir}/workers.log",
            lambda log: address if log.count("Registered to:") >= workers else None,
            env=env,
            timeout_s=START_TIMEOUT_S,
        ),
    ):
        client = Client(address, set_as_default=False, timeout=START_TIMEOUT_S)
        try:
            cluster = Cluster(address, client)
            cluster.wait_for_workers(workers)
            yield cluster
        finally:
            client.close()
