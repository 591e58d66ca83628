"""Rounds in rotated order, medians with their spread, child processes that print as they
run, core pinning, a process tree's memory, the clock, and the JSON a run leaves.

``run_rounds`` runs each variant ``repeat`` times, round ``r`` starting at variant ``r mod
k``, so none always runs first (cold caches) or last (a machine warmed by the others), and
a noisy spell on a shared host falls on all alike.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULT = "RESULT "  # the line a child prints its result on


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """``names`` starting at ``round_index mod len(names)``: round r's order."""
    k = round_index % len(names) if names else 0
    return [*names[k:], *names[:k]]


def run_rounds(
    names: Sequence[str], repeat: int, run_one: Callable[[str, int], dict]
) -> tuple[dict[str, list[dict]], list[list[str]]]:
    """Runs every name ``repeat`` times, each round rotated; returns the runs per name and
    the order of each round."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    orders = []
    for r in range(repeat):
        orders.append(rotated(names, r))
        for name in orders[-1]:
            runs[name].append(run_one(name, r))
    return runs, orders


def summarize(runs: list[dict], key: str = "elapsed_s") -> dict:
    """The median run by ``key`` (the slower middle one for an even count) with
    ``spread`` = (slowest - fastest) / median, ``runs_s`` and ``repeats``; the other
    fields are the median run's, except ``peak_rss_mb`` (the largest)."""
    ordered = sorted(runs, key=lambda r: r[key])
    out = dict(ordered[len(ordered) // 2])
    middle = out[key]
    out["spread"] = (ordered[-1][key] - ordered[0][key]) / middle if middle else 0.0
    out["runs_s"] = [r[key] for r in runs]
    out["repeats"] = len(runs)
    if all("peak_rss_mb" in r for r in runs):
        out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    return out


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def write_json(path: str | None, report: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2, default=str))


def device() -> str:
    """The device this process's JAX computes on (its default backend), e.g. ``tpu (1 x TPU
    v5 lite)``: what a benchmark says it timed."""
    import jax

    devices = jax.devices()
    return f"{jax.default_backend()} ({len(devices)} x {devices[0].device_kind})"


# --- processes ----------------------------------------------------------------------------


def pin(cores: int | None) -> None:
    """Restricts this process (and what it starts) to its first ``cores`` usable cores."""
    if cores:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])


def emit(result: dict) -> None:
    """A child's last word: its result, on one line the parent finds."""
    print(RESULT + json.dumps(result), flush=True)


def child_env(**variables: str) -> dict:
    """This environment with the repository first on PYTHONPATH (and ``variables`` set).

    JAX_PLATFORMS is left as it is: a child computes on the default backend, the device
    the job would use."""
    env = dict(os.environ, **variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_child(
    argv: Sequence[str], *, timeout: float, env: dict | None = None, what: str = "a child"
) -> dict:
    """Runs ``argv`` in a fresh process, its output printed as it comes (indented), and
    returns the result it ``emit``-ted.

    Past ``timeout`` seconds the child is stopped with SIGABRT, which makes Python print
    every thread's stack (``PYTHONFAULTHANDLER`` is set): the error then says where it was.

    Raises:
        RuntimeError: the child failed, said nothing, or ran past ``timeout``.
    """
    env = dict(env if env is not None else os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    tail: collections.deque[str] = collections.deque(maxlen=400)
    results: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith(RESULT):
                results.append(line[len(RESULT) :])
            else:
                tail.append(line)
                print(f"    | {line}", end="", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        text = "".join(tail)
        top = text.rfind("Fatal Python error")  # the stacks, from their top
        dump = text[top:][:12000] if top >= 0 else text[-8000:]
        raise RuntimeError(
            f"{what} ran past its timeout of {timeout:g} s and was stopped; where its threads "
            f"were:\n{dump}"
        ) from None
    reader.join()
    if proc.returncode or not results:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{''.join(tail)[-4000:]}")
    return json.loads(results[-1])


LAUNCH_PACKAGES = ("numpy", "jax", "pyarrow", "tokenizers", "apache_beam", "beam_jax")


def uncompiled(packages: Sequence[str] = LAUNCH_PACKAGES, env: dict | None = None) -> list[str]:
    """The ``packages`` a fresh process with ``env`` would compile at import (no cached
    bytecode: installed with ``--no-compile`` where ``PYTHONDONTWRITEBYTECODE`` is set):
    a launch timed there is slower than a worker image's (1.0 s of 3.6 s on a TPU host)."""
    code = (
        "import importlib.util, json, os, sys\n"
        "out = []\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    if spec is not None and spec.cached and not os.path.exists(spec.cached):\n"
        "        out.append(name)\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(packages))],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout)


def bytecode_line(missing: Sequence[str]) -> str:
    """One line on :func:`uncompiled`'s answer, for a benchmark's table."""
    if not missing:
        return "bytecode: cached for every package the launch imports"
    return (
        f"bytecode: NOT cached for {', '.join(missing)}: every process here compiles them at "
        "import; `python -m compileall -q FOLDER` first, as an install that compiles would"
    )


# --- process-tree memory ------------------------------------------------------------------


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue  # the process ended
        # The command name may hold spaces and parentheses; fields resume after the last ")".
        children[int(text[text.rindex(")") + 2 :].split()[1])].append(int(text.split()[0]))
    out, todo = [], [root]
    while todo:
        out.append(todo.pop())
        todo.extend(children.get(out[-1], ()))
    return out


def _kb(path: str, field: str) -> int:
    with contextlib.suppress(OSError):  # the process ended between listing and reading
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    return 0


class TreeMemory:
    """Samples the summed RSS and PSS of a process and all its descendants from /proc (the
    summed RSS counts shared pages once per process; PSS splits them between sharers)."""

    def __init__(self, root: int | None = None, interval: float = 0.2):
        self.root = root or os.getpid()
        self.interval = interval
        self.peak_rss_kb = self.peak_pss_kb = self.peak_processes = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self):
        pids = _tree(self.root)
        self.peak_rss_kb = max(
            self.peak_rss_kb, sum(_kb(f"/proc/{p}/status", "VmRSS:") for p in pids)
        )
        self.peak_pss_kb = max(
            self.peak_pss_kb, sum(_kb(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
        )
        self.peak_processes = max(self.peak_processes, len(pids))
        self.samples += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


# --- the clock ----------------------------------------------------------------------------


def py_spy() -> str | None:
    """py-spy's path: ``$BEAM_JAX_PY_SPY``, else the one beside this interpreter or on PATH."""
    found = os.environ.get("BEAM_JAX_PY_SPY")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class _GilSampler:
    """Samples which thread holds the interpreter lock with ``py-spy record --gil``: the
    samples taken (idle threads excluded) over the rate are the seconds it was held."""

    RATE = 250

    def __init__(self, exe: str):
        self.out = tempfile.NamedTemporaryFile(suffix=".txt", delete=False).name
        # py-spy runs as this process's child; Yama lets a child trace its parent only
        # when the parent says so.
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(2**64 - 1), 0, 0, 0)
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(os.getpid()), "--gil", "--nonblocking",
             "--rate", str(self.RATE), "--format", "raw", "--output", self.out],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    def stop(self) -> float | None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
            text = Path(self.out).read_text()
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            return None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.out)
        samples = sum(int(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.strip())
        return samples / self.RATE


class Clock:
    """Wall and CPU time of this process (every thread), cores busy, and the seconds a
    thread held the interpreter lock (``gil_s``; None without py-spy)."""

    def __init__(self, gil: bool = True):
        exe = py_spy() if gil else None
        self._gil = _GilSampler(exe) if exe else None
        if self._gil is not None:
            time.sleep(0.3)  # py-spy attaches before the clock starts
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> dict:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() - self.cpu
        gil = self._gil.stop() if self._gil is not None else None
        return {"elapsed_s": wall, "cpu_s": cpu, "cores_busy": cpu / wall, "gil_s": gil}
