"""Processes that tests start: find them, wait for them, stop them, and check none is left.

Services (job services, worker pools, runner binaries) run in their own process group, so
one ``killpg`` stops the service and every worker it started; the ``/proc`` walk finds what
a test left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence


def worker_env() -> dict[str, str]:
    """The environment of processes we start: this venv's python first on PATH (a worker
    pool runs ``python`` from PATH), the repo and tests importable, four CPU devices."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(here), here, *filter(None, [env.get("PYTHONPATH")])]
    )
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    env["JAX_PLATFORMS"] = "cpu"
    return env


def proc_table() -> dict[int, tuple[int, int, str]]:
    """``{pid: (ppid, pgrp, state)}`` of every live (non-zombie) process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # it exited while we looked
        # The command name may hold spaces and parentheses; the fields after its last ')' don't.
        fields = stat[stat.rindex(")") + 2 :].split()
        state, ppid, pgrp = fields[0], int(fields[1]), int(fields[2])
        if state not in ("Z", "X"):
            table[int(entry)] = (ppid, pgrp, state)
    return table


def descendants(pid: int) -> set[int]:
    table = proc_table()
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, (ppid, _, _) in table.items() if ppid in frontier} - out
        out |= frontier
    return out


def group_members(pgrp: int) -> set[int]:
    return {p for p, (_, g, _) in proc_table().items() if g == pgrp}


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, the whole process group ``proc`` leads; reap ``proc``."""
    for sig, grace_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if wait_until(lambda: proc.poll() is not None and not group_members(proc.pid), grace_s):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def process_group(
    cmd: Sequence[str],
    log_path: str,
    ready: Callable[[str], str | None],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 60,
) -> Iterator[str]:
    """Run ``cmd`` in its own process group until the block ends.

    ``ready(log_text)`` returns the service's address once it is up (it may also look
    elsewhere, e.g. poll a port). The group (the service and any workers it started) is
    killed on the way out, and must be empty afterwards.

    Raises:
        RuntimeError: the service exited, or was not ready within ``timeout_s``; the message
            holds its log.
    """
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        address = None

        def up() -> bool:
            nonlocal address
            with open(log_path) as f:
                address = ready(f.read())
            return address is not None or proc.poll() is not None

        wait_until(up, timeout_s)
        if address is None:
            with open(log_path) as f:
                raise RuntimeError(
                    f"{cmd[0]} did not start within {timeout_s}s (exit {proc.poll()}):\n{f.read()}"
                )
        yield address
    finally:
        kill_group(proc)
    left = group_members(proc.pid)
    assert not left, f"{cmd[0]} left processes {sorted(left)} behind"


def worker_pool(log_path: str, timeout_s: float) -> contextlib.AbstractContextManager[str]:
    """Beam's SDK worker pool (``worker_pool_main``) in its own process group: its address.

    It is ready when its port accepts connections. (It announces itself only in an INFO log
    line, which reaches no handler unless an import happened to configure logging.)
    """
    port = free_port()

    def ready(_log: str) -> str | None:
        return f"localhost:{port}" if port_open(port) else None

    cmd = [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main"]
    return process_group(
        [*cmd, f"--service_port={port}"], log_path, ready, env=worker_env(), timeout_s=timeout_s
    )
