"""``bench/embed.py --profile``: the flagship as a whole process, phase by phase, with the
chip's trace of each run.

Each run is a new process running ``pipelines.embed`` (the in-memory FnApiRunner, the
flagship's defaults) on the benchmark's texts: a first one with an empty compilation cache
(``cold``), then ``--runs`` with the cache it filled (``warm``); each writes to an empty
output. A run marks, in seconds from its process's start: ``jax`` imported,
``pipelines.embed`` imported (Beam, pyarrow, the tokenizer), ``run()`` called, the devices
open (started as ``pipelines`` imports, as the command ``python -m pipelines.embed`` starts
it: ``pipelines/_open_early.py``; marked as ``run()`` is called where they opened before),
``run()`` returned, the trace written and read back (the profile's own
cost: seconds on a TPU for a million texts, so a process's end here is not a job's) and
the process ended. From the devices' opening to
``run()``'s end the process is traced with ``jax.profiler`` (its Python tracer off): from
the trace come the first batch's start and the last batch's end on the device (its ``XLA
Modules`` line, one event per batch), the batches' median, and the device's busy time over
the window from its first batch to its last (a batch before the trace started, within
the programs' loading after the opening, would be missed). A CPU's trace has no device
line: those cells then say ``-``. ``--profile_dir`` keeps the traces (for TensorBoard or
XProf).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

from bench._lib import harness

PHASES = (
    ("jax", "jax imported"),
    ("job", "pipelines.embed imported"),
    ("run", "run() called"),
    ("open", "devices open"),
    ("first_batch", "first batch on the device"),
    ("last_batch", "last batch done on the device"),
    ("returned", "run() returned"),
    ("traced", "trace written and read"),  # the profile's own cost, not the job's
    ("exited", "process ended"),
)
ANCHOR = "bench_profile_anchor"  # a host event of known time, to place the trace's events


def profiled_run(cfg: dict) -> dict:
    """One run of the job in this (fresh) process, its phases timed from ``cfg["t0"]``."""
    t0, marks = cfg["t0"], {}

    def mark(name: str) -> None:
        marks.setdefault(name, time.time() - t0)

    argv = ["--input", cfg["parquet"], "--output", cfg["out"], "--runner=FnApiRunner",
            "--compilation_cache_dir", cfg["cache_dir"], *cfg["pipeline_args"]]  # fmt: skip
    sys.orig_argv = [sys.executable, "-m", "pipelines.embed", *argv]  # the command's process
    import jax

    mark("jax")
    import pipelines  # noqa: F401  # the devices start opening, then Beam imports
    from beam_jax import jobs
    from pipelines.embed import job

    mark("job")
    anchor: list[float] = []

    def trace_once_open(opening: threading.Thread) -> None:
        opening.join()
        mark("open")
        # JAX opens its backends as a trace starts: started once the job's own opening (its
        # TPU host buffer sized first) is done, so the trace changes nothing before it.
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0
        options.host_tracer_level = 1  # user events (the anchor) and the host's dispatches
        jax.profiler.start_trace(cfg["trace_dir"], profiler_options=options)
        with jax.profiler.TraceAnnotation(ANCHOR):
            anchor.append(time.time() - t0)

    mark("run")
    tracer = threading.Thread(target=trace_once_open, args=(jobs.open_local_devices(),))
    tracer.start()
    job.run(argv)  # it opens the devices as the benchmark did: JAX opens them once
    mark("returned")
    tracer.join()
    if not anchor:
        raise RuntimeError("the trace did not start: the devices did not open (see above)")
    jax.profiler.stop_trace()
    trace = device_batches(cfg["trace_dir"])
    mark("traced")
    at, first, last = (trace.pop(k, None) for k in ("anchor_at", "first_s", "last_s"))
    if at is not None and first is not None:  # the trace's clock, placed by the anchor
        shift = anchor[0] - at
        marks["first_batch"], marks["last_batch"] = first + shift, last + shift
    return {"marks": marks, "trace": trace, "device": harness.device()}


def run(args, data: dict, work: Path) -> dict:
    """The runs ``args`` asks for (cold, then ``--runs`` warm), each a new process; prints
    the table and returns the report."""
    traces = Path(args.profile_dir or work / "traces")
    labels = ([] if args.no_cold else ["cold"]) + [f"warm {i + 1}" for i in range(args.runs)]
    print(f"{data['n']} texts from {data['source']}; a new process per run: "
          f"{', '.join(labels)}", flush=True)  # fmt: skip
    runs = []
    for label in labels:
        shutil.rmtree(work / "out", ignore_errors=True)  # each run writes a new output
        cfg = dict(data, out=str(work / "out"), threads=len(os.sched_getaffinity(0)),
                   pipeline_args=shlex.split(args.pipeline_args), t0=time.time(),
                   cache_dir=args.cache_dir or str(work / "cache"),
                   trace_dir=str(traces / label.replace(" ", "_")))  # fmt: skip
        (work / "cfg.json").write_text(json.dumps(cfg))
        argv = [sys.executable, "-m", "bench.embed", "--child", "profile", str(work / "cfg.json")]
        r = harness.run_child(argv, timeout=args.timeout, env=harness.child_env(), what=label)
        r["marks"]["exited"] = time.time() - cfg["t0"]
        print(f"  {label}: process {r['marks']['exited']:.2f} s on {r['device']}", flush=True)
        runs.append((label, r))
    missing = harness.uncompiled(env=harness.child_env())
    print(table(runs))
    print(harness.bytecode_line(missing))
    if args.profile_dir:
        print(f"traces kept in {traces}, a folder per run (TensorBoard's profile plugin, XProf)")
    return {"texts": data["n"], "source": data["source"], "runs": dict(runs),
            "uncompiled": missing, "summary": summary(runs)}  # fmt: skip


def device_batches(trace_dir: str) -> dict:
    """From the newest trace under ``trace_dir``: the batches the devices ran (``XLA
    Modules`` events), their median, the busy time over their window (first batch's start
    to last batch's end), and their first start and last end (seconds on the trace's clock,
    beside the anchor's); ``{"batches": 0}`` where no device line exists (a CPU)."""
    import jax

    files = sorted(Path(trace_dir).rglob("*.xplane.pb"), key=os.path.getmtime)
    if not files:
        raise RuntimeError(f"jax.profiler wrote no trace under {trace_dir}")
    profile = jax.profiler.ProfileData.from_file(str(files[-1]))
    spans, anchor = [], None
    for plane in profile.planes:
        for line in plane.lines:
            for e in line.events:
                if plane.name.startswith("/device:") and line.name == "XLA Modules":
                    spans.append((e.start_ns, e.start_ns + e.duration_ns))
                elif e.name == ANCHOR:
                    anchor = e.start_ns / 1e9
    spans.sort()
    out: dict = {"batches": len(spans), "anchor_at": anchor}
    if not spans:
        return out
    busy, end = 0, spans[0][0]
    for s, e in spans:  # the union of the spans (several devices may overlap)
        busy += max(0, e - max(s, end))
        end = max(end, e)
    return {
        **out,
        "median_batch_ms": statistics.median(e - s for s, e in spans) / 1e6,
        "busy_s": busy / 1e9,
        "window_s": (end - spans[0][0]) / 1e9,
        "first_s": spans[0][0] / 1e9,
        "last_s": end / 1e9,
    }


def table(runs: list[tuple[str, dict]]) -> str:
    """The phases of every run, in seconds from its process's start, and the device's share."""
    width = max(len(label) for _, label in PHASES) + 2
    lines = [f"{'s from the process start':<{width + 2}}" + "".join(f"{n:>9}" for n, _ in runs)]
    for key, label in PHASES:
        cells = "".join(
            f"{r['marks'][key]:9.2f}" if r["marks"].get(key) is not None else f"{'-':>9}"
            for _, r in runs
        )
        lines.append(f"  {label:<{width}}{cells}")
    for name, r in runs:
        t = r["trace"]
        lines.append(
            f"  {name}: the device ran {t['batches']} batches (median {t['median_batch_ms']:.2f}"
            f" ms), busy {t['busy_s']:.2f} s of the {t['window_s']:.2f} s from its first to its "
            f"last ({t['busy_s'] / t['window_s']:.0%})"
            if t["batches"]
            else f"  {name}: no device line in the trace (a CPU): no batch times"
        )
    return "\n".join(lines)


def summary(runs: list[tuple[str, dict]]) -> str:
    """The last warm run in one line: its first batch, opening and end, the device's share."""
    name, r = next((x for x in reversed(runs) if x[0].startswith("warm")), runs[-1])
    m, t = r["marks"], r["trace"]
    first = f"first batch {m['first_batch']:.1f} s, " if m.get("first_batch") else ""
    busy = f"; device busy {t['busy_s'] / t['window_s']:.0%}" if t["batches"] else ""
    own = m["traced"] - m["returned"]
    return (f"{name}: {first}devices open {m['open']:.1f} s, process {m['exited']:.1f} s "
            f"({own:.1f} s of it writing and reading the trace){busy}")  # fmt: skip
