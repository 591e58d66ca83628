"""The flagship as a whole process, phase by phase, and the device's share of a warm run.

    python bench/launch_timeline.py                          # 20,000 built-in texts, 2 runs
    python bench/launch_timeline.py --texts 1000000 --runs 3 --trace   # e.g. on a TPU host

Runs ``pipelines.embed`` (the in-memory FnApiRunner, the flagship's defaults) on the
built-in texts cycled to ``--texts``, in a new process per run: a first one with an empty
compilation cache (``cold``), then ``--runs`` with the cache it filled (``warm``). Each
prints when its phases began, in seconds from the process's start: ``jax`` imported,
``pipelines.embed`` imported (Beam, pyarrow, the tokenizer), ``run()`` called, the devices
opening and open (and which thread opened them), the first batch dispatched, the last
result fetched, ``run()`` returned and the process ended. A TPU takes seconds to open
(one v5e chip: about 2 s with the host buffer beam_jax gives it, 6-8 s with libtpu's
4 GiB); the launch should plan, read and tokenize meanwhile, and the first batch should
follow the opening by no more than the compiled programs' loading. ``--cache-dir`` keeps
the compilation cache, so that runs of several invocations (e.g. with other environment
settings) are warm alike. Each run writes to an empty output folder: none pays for deleting
the output of the run before it.

With ``--trace``, one more process runs the job twice and traces the second run with
``jax.profiler``: the batches the device ran (its trace's ``XLA Modules`` line, one event
per batch), their median, and the device's busy time over the window from its first batch
to its last: how much of a warm run the device was kept busy. A CPU's trace has no device
line; the row then says so.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import harness  # noqa: E402
from embed_runs import write_builtin_texts  # noqa: E402

PHASES = (
    ("jax", "jax imported"),
    ("job", "pipelines.embed imported"),
    ("run", "run() called"),
    ("opening", "devices opening"),
    ("open", "devices open"),
    ("first_dispatch", "first batch dispatched"),
    ("last_result", "last result fetched"),
    ("returned", "run() returned"),
    ("exited", "process ended"),
)


def _child(cfg_path: str, t0: float) -> None:
    """One run of the job, its phases timed from ``t0`` (when the parent started it)."""
    cfg = json.loads(Path(cfg_path).read_text())
    marks: dict = {}

    def mark(name: str) -> None:
        marks.setdefault(name, time.time() - t0)

    import jax

    mark("jax")
    local_devices = jax.local_devices

    def opening(*a, **k):  # the first caller opens the devices; JAX opens them once
        if "opening" not in marks:
            mark("opening")
            marks["opened_by"] = threading.current_thread().name
        out = local_devices(*a, **k)
        mark("open")
        return out

    jax.local_devices = opening
    from beam_jax._src.engine import batching

    dispatch = batching.BatchEngine._dispatch

    @functools.wraps(dispatch)
    def first_dispatch(self, batch):
        mark("first_dispatch")
        return dispatch(self, batch)

    batching.BatchEngine._dispatch = first_dispatch
    device_get = jax.device_get

    def fetched(x):
        out = device_get(x)
        marks["last_result"] = time.time() - t0
        return out

    jax.device_get = fetched
    from pipelines.embed import job

    mark("job")
    argv = ["--input", cfg["parquet"], "--output", cfg["output"], "--overwrite"]
    argv += ["--runner=FnApiRunner", "--compilation_cache_dir", cfg["cache"], *cfg["extra"]]
    if cfg["trace"]:
        job.run(argv)  # warm, untimed: the traced run below is the process's second
        harness.emit({"trace": _traced(lambda: job.run(argv), cfg["trace_dir"])})
        return
    mark("run")
    job.run(argv)
    mark("returned")
    harness.emit({"marks": marks})


def _traced(run, trace_dir: str) -> dict:
    """``run()`` under ``jax.profiler``: its wall time and the device's batches."""
    import jax

    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    options.host_tracer_level = 0
    jax.profiler.start_trace(trace_dir, profiler_options=options)
    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    jax.profiler.stop_trace()
    return {"wall_s": wall, **device_batches(trace_dir)}


def device_batches(trace_dir: str) -> dict:
    """From the newest trace under ``trace_dir``: the batches the devices ran (``XLA
    Modules`` events), their median, and the busy time over their window (first batch's
    start to last batch's end); ``{"batches": 0}`` where no device line exists (a CPU)."""
    import jax

    files = sorted(Path(trace_dir).rglob("*.xplane.pb"), key=os.path.getmtime)
    if not files:
        raise RuntimeError(f"jax.profiler wrote no trace under {trace_dir}")
    profile = jax.profiler.ProfileData.from_file(str(files[-1]))
    spans = sorted(
        (e.start_ns, e.start_ns + e.duration_ns)
        for plane in profile.planes
        if plane.name.startswith("/device:")
        for line in plane.lines
        if line.name == "XLA Modules"
        for e in line.events
    )
    if not spans:
        return {"batches": 0}
    busy, end = 0, spans[0][0]
    for s, e in spans:  # the union of the spans (several devices may overlap)
        busy += max(0, e - max(s, end))
        end = max(end, e)
    return {
        "batches": len(spans),
        "median_batch_ms": statistics.median(e - s for s, e in spans) / 1e6,
        "busy_s": busy / 1e9,
        "window_s": (end - spans[0][0]) / 1e9,
    }


def _run_child(cfg: dict, work: Path, timeout: float) -> dict:
    # Each run writes a new output: the run before's, replaced by --overwrite, would be
    # deleted as this one publishes (a 1,000,000-text output is 1.5 GB: 0.2-1.2 s).
    shutil.rmtree(cfg["output"], ignore_errors=True)
    path = work / "cfg.json"
    path.write_text(json.dumps(cfg))
    t0 = time.time()
    argv = [sys.executable, __file__, "--child", str(path), repr(t0)]
    out = harness.run_child(argv, timeout=timeout, env=harness.child_env(str(ROOT)))
    if "marks" in out:
        out["marks"]["exited"] = time.time() - t0
    return out


def _table(runs: list[tuple[str, dict]]) -> str:
    width = max(len(label) for _, label in PHASES) + 2
    lines = [f"{'s from the process start':<{width + 2}}" + "".join(f"{n:>9}" for n, _ in runs)]
    for key, label in PHASES:
        cells = "".join(
            f"{m[key]:9.2f}" if m.get(key) is not None else f"{'-':>9}" for _, m in runs
        )
        lines.append(f"  {label:<{width}}{cells}")
    openers = sorted({m.get("opened_by", "-") for _, m in runs})
    lines.append(f"  devices opened by: {', '.join(openers)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=20_000, help="built-in texts, cycled")
    parser.add_argument("--runs", type=int, default=2, help="warm runs, each a new process")
    parser.add_argument("--trace", action="store_true", help="also trace a warm run's device")
    parser.add_argument("--no-cold", action="store_true", help="leave out the cold run")
    parser.add_argument("--pipeline-args", default="", help="the flagship's extra flags")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per process")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--cache-dir", help="the compilation cache, kept (default: a new one, removed)"
    )
    args = parser.parse_args(argv)
    if args.texts < 1 or args.runs < 1:
        parser.error(f"--texts and --runs must be >= 1, got {args.texts} and {args.runs}")
    with tempfile.TemporaryDirectory(prefix="launch_timeline_") as tmp:
        work = Path(tmp)
        write_builtin_texts(work / "texts.parquet", args.texts)
        cfg = {
            "parquet": str(work / "texts.parquet"),
            "output": str(work / "out"),
            "cache": args.cache_dir or str(work / "cache"),
            "extra": args.pipeline_args.split(),
            "trace": False,
            "trace_dir": str(work / "trace"),
        }
        labels = ([] if args.no_cold else ["cold"]) + [f"warm {i + 1}" for i in range(args.runs)]
        runs = [(label, _run_child(cfg, work, args.timeout)["marks"]) for label in labels]
        missing = harness.uncompiled(env=harness.child_env(str(ROOT)))
        report: dict = {"texts": args.texts, "runs": dict(runs), "uncompiled": missing}
        print(f"{args.texts:,} texts; a new process per run\n" + _table(runs))
        print(harness.bytecode_line(missing))
        if args.trace:
            trace = _run_child({**cfg, "trace": True}, work, args.timeout)["trace"]
            report["trace"] = trace
            if trace["batches"]:
                print(
                    f"traced warm run (the process's second): {trace['wall_s']:.2f} s; the "
                    f"device ran {trace['batches']} batches (median {trace['median_batch_ms']:.2f}"
                    f" ms), busy {trace['busy_s']:.2f} s of the {trace['window_s']:.2f} s from "
                    f"its first to its last ({trace['busy_s'] / trace['window_s']:.0%})"
                )
            else:
                print(f"traced warm run: {trace['wall_s']:.2f} s; no device line in the trace")
    harness.write_json(args.json, report)
    return report


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], float(sys.argv[3]))
    else:
        main()
