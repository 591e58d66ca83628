"""What every benchmark here shares: rounds in rotated order, medians with their spread,
fresh processes, core pinning, a process tree's memory, the clock (wall, CPU, cores busy,
interpreter lock held) and the JSON a run leaves.

A benchmark names its variants; ``run_rounds`` runs each of them ``repeat`` times, every
round in a rotated order (round ``r`` starts at variant ``r mod k``), so no variant always
runs first (cold caches) or last (a machine warmed by the others), and a noisy spell on a
shared host falls on all of them alike. ``summarize`` reports the median run, its spread
((slowest - fastest) / median) and every run's time.
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

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
        order = rotated(names, r)
        orders.append(order)
        for name in order:
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


# --- processes ----------------------------------------------------------------------------


def pin(cores: int | None) -> None:
    """Restricts this process (and what it starts) to its first ``cores`` usable cores."""
    if cores:
        usable = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, usable[:cores])


def emit(result: dict) -> None:
    """A child's last word: its result, on one line the parent finds."""
    print(RESULT + json.dumps(result), flush=True)


def run_child(
    argv: Sequence[str], *, timeout: float, env: dict | None = None, what: str = "a child"
) -> dict:
    """Runs ``argv`` in a fresh process and returns the result it ``emit``-ted; raises with
    the end of its stderr when it fails or says nothing."""
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def child_env(*paths: str) -> dict:
    """This environment with ``paths`` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH")]))
    return env


LAUNCH_PACKAGES = ("numpy", "jax", "pyarrow", "tokenizers", "apache_beam", "beam_jax")


def uncompiled(packages: Sequence[str] = LAUNCH_PACKAGES, env: dict | None = None) -> list[str]:
    """The ``packages`` whose modules a fresh process with ``env`` would compile at import:
    their ``__init__`` has no cached bytecode where that process looks for it.

    An install compiles its modules (pip does by default) and a process writes what it
    compiled beside the source, so this is empty unless both fail: packages installed
    without compiling (``pip install --no-compile``) where ``PYTHONDONTWRITEBYTECODE`` is
    set or the folder is read-only. Then every process compiles them again (Beam's modules
    added 1.0 s to a 3.6 s import on one TPU v5e host: ``bench/imports.py``), and a launch
    timed there is slower than a worker image's.
    """
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
        "import (installed without compiling, and PYTHONDONTWRITEBYTECODE set or the folder "
        "read-only); `python -m compileall -q FOLDER` first, as an install that compiles would"
    )


def write_json(path: str | None, report: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2, default=str))


# --- process-tree memory ------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue  # the process ended
        # The command name may hold spaces and parentheses; fields resume after the last ")".
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children[ppid].append(int(text[: text.index(" ")]))
    return children


def _tree(root: int) -> list[int]:
    children, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _kb(path: str, field: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass  # the process ended between listing and reading
    return 0


class TreeMemory:
    """Samples the summed RSS and PSS of a process and all its descendants from /proc.

    RSS counts pages shared between processes (libraries, copy-on-write) once per process, so
    the summed RSS is an upper bound; PSS splits each shared page between its sharers.
    """

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
        rss = sum(_kb(f"/proc/{p}/status", "VmRSS:") for p in pids)
        pss = sum(_kb(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
        self.peak_rss_kb = max(self.peak_rss_kb, rss)
        self.peak_pss_kb = max(self.peak_pss_kb, pss)
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
        self.exe = exe
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


def per_item_us(result: dict, items: int) -> dict:
    """CPU and interpreter-lock microseconds per item from a ``Clock`` result."""
    gil = result.get("gil_s")
    return {
        "cpu_us_per_item": 1e6 * result["cpu_s"] / items,
        "gil_us_per_item": None if gil is None else 1e6 * gil / items,
    }


@contextlib.contextmanager
def timed() -> Iterator[dict]:
    """``with timed() as t:`` ... ``t["s"]``: wall seconds of the block."""
    out: dict = {}
    start = time.perf_counter()
    try:
        yield out
    finally:
        out["s"] = time.perf_counter() - start
