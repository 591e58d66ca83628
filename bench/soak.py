"""Soak: a million small records, 1% of them bad, through the multi-process runner; none lost.

    python bench/soak.py --quick                              # 20,000 records
    python bench/soak.py --records 50000                      # about a minute on 2 cores
    python bench/soak.py --records 1000000 --baseline 100000  # the figures in reliability.md
    python bench/soak.py --records 1000000 --json soak.json

Records are ``(id, {"x": float32[L, 4]})``, L in 1..16, generated inside the pipeline.
A seeded 1% are bad in five kinds (complex dtype, wrong rank, a NaN under
``Validation(nonfinite="reject")``, too long, a kernel that raises at run time) and run
through ``RunKernel(...).with_exception_handling()`` on the FnApiRunner's
``multi_processing`` mode with 2 workers; the driver reads back every result and dead
letter and checks each id appears exactly once, the bad ones at their expected stage.
Memory: the peak summed RSS (and PSS) of the process tree, sampled every 0.2 s; throughput
over time: outputs each worker writes per second. ``--baseline N`` runs N records first,
each size in a fresh process, and prints the ratios. On a host with one accelerator, which
one process may hold, run the soak with ``JAX_PLATFORMS=cpu``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if not __package__:  # python bench/soak.py: the repository's root in the place of bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from beam_jax.testing import assert_conserved  # noqa: E402
from bench._lib import harness, soak_job  # noqa: E402

# ---- running -----------------------------------------------------------------------------


@contextlib.contextmanager
def _workers_can_import_this_module():
    # Worker processes unpickle the job's DoFns and functions from `bench._lib.soak_job`.
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.ROOT), old]))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _progress(tick_dir: Path, records: int, stop: threading.Event, every: float = 10) -> None:
    """Prints the outputs written so far every ``every`` seconds while the soak runs."""
    start = time.perf_counter()
    while not stop.wait(every):
        written = 0
        for path in tick_dir.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):  # a file being written
                written += sum(json.loads(path.read_text()).values())
        print(f"  {written:,} of {records:,} records written after "
              f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip


def run_soak(
    records: int,
    workdir: str | Path,
    *,
    workers: int = 2,
    seed: int = 0,
    bad_fraction: float = 0.01,
    chunk: int = 5000,
    slice_seconds: float | None = None,
) -> dict[str, Any]:
    """Runs the soak in this process and checks conservation; returns its figures.

    Raises:
        AssertionError: if any record is lost, duplicated, or dead-lettered unexpectedly.
    """
    workdir = Path(workdir)
    for sub in ("results", "dead", "ticks"):
        if (workdir / sub).exists():
            # Outputs of an earlier run would be counted as this run's.
            raise FileExistsError(f"{workdir / sub} exists; give an empty or new --workdir")
        (workdir / sub).mkdir(parents=True)
    bad = soak_job.bad_records(records, seed, bad_fraction)
    options = PipelineOptions(
        [
            "--runner=FnApiRunner",
            "--direct_running_mode=multi_processing",
            f"--direct_num_workers={workers}",
        ]
    )
    p = beam.Pipeline(options=options)
    soak_job.build(p, records, workdir, seed, bad, chunk)
    stop = threading.Event()
    progress = threading.Thread(target=_progress, args=(workdir / "ticks", records, stop))
    with _workers_can_import_this_module(), harness.TreeMemory() as memory:
        start = time.perf_counter()
        progress.start()
        try:
            result = p.run()
            result.wait_until_finish()
        finally:
            stop.set()
            progress.join()
        seconds = time.perf_counter() - start
    summary = assert_conserved(result)
    assert summary.elements == records, (summary.elements, records)
    assert summary.dead_letters == len(bad), (summary.dead_letters, len(bad))
    check_start = time.perf_counter()
    result_ids, dead = soak_job.read_written(workdir)
    soak_job.check_conservation(result_ids, dead, records, bad)
    by_kind = collections.Counter(bad.values())
    return {
        "records": records,
        "bad": len(bad),
        "bad_by_kind": dict(sorted(by_kind.items())),
        "workers": workers,
        "seconds": round(seconds, 1),
        "records_per_s": round(records / seconds),
        "check_seconds": round(time.perf_counter() - check_start, 1),
        "conserved": True,
        "results_written": int(result_ids.size),
        "dead_letters_written": len(dead),
        "dead_letters_by_stage": summary.dead_letters_by_stage,
        "kernel_calls": summary.kernel_calls,
        "compiles": summary.compiles,
        "peak_tree_rss_mb": round(memory.peak_rss_kb / 1024),
        "peak_tree_pss_mb": round(memory.peak_pss_kb / 1024),
        "peak_processes": memory.peak_processes,
        "memory_samples": memory.samples,
        "throughput": soak_job.throughput(workdir / "ticks", slice_seconds),
        "devices": sorted({p.read_text() for p in (workdir / "ticks").glob("device-*.txt")}),
    }


def _print_report(report: dict[str, Any]) -> None:
    t = report["throughput"]
    print(
        f"{report['records']:,} records ({report['bad']:,} bad: {report['bad_by_kind']}) on "
        f"{report['workers']} workers in {report['seconds']} s = "
        f"{report['records_per_s']:,} records/s; conservation checked on written ids "
        f"({report['results_written']:,} results + {report['dead_letters_written']:,} dead "
        f"letters {report['dead_letters_by_stage']}); the workers computed on "
        f"{', '.join(report['devices'])}"
    )
    print(
        f"peak memory of the process tree ({report['peak_processes']} processes): RSS "
        f"{report['peak_tree_rss_mb']} MB, PSS {report['peak_tree_pss_mb']} MB"
    )
    rates = " ".join(str(s["records_per_s"]) for s in t["slices"])
    print(f"records/s per {t['slice_seconds']} s slice: {rates}")
    print(f"steady throughput, last third / first third: {t['late_over_early']}")


def _run_child(records: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out = workdir / f"report-{records}.json"
    command = [
        sys.executable, "-m", "bench.soak",
        "--records", str(records),
        "--workers", str(args.workers),
        "--seed", str(args.seed),
        "--chunk", str(args.chunk),
        "--workdir", str(workdir / f"run-{records}"),
        "--json", str(out),
    ]  # fmt: skip
    if args.slice_seconds:
        command += ["--slice-seconds", str(args.slice_seconds)]
    subprocess.run(command, check=True, env=harness.child_env())
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="20,000 records")
    parser.add_argument(
        "--baseline",
        type=int,
        help="first run this many records; each size runs in a fresh process, and the peak "
        "memory and throughput ratios are printed",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=5000, help="records per Create element")
    parser.add_argument("--slice-seconds", type=float, help="default: the run's span / 20")
    parser.add_argument("--workdir", help="where outputs go (default: a temporary directory)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.records = 20_000
    logging.getLogger().setLevel(logging.WARNING)
    with contextlib.ExitStack() as stack:
        if args.workdir:
            workdir = Path(args.workdir)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
        if args.baseline:
            base = _run_child(args.baseline, args, workdir)
            main_run = _run_child(args.records, args, workdir)
            report = {
                "baseline": base,
                "main": main_run,
                "peak_rss_ratio": round(main_run["peak_tree_rss_mb"] / base["peak_tree_rss_mb"], 3),
                "peak_pss_ratio": round(main_run["peak_tree_pss_mb"] / base["peak_tree_pss_mb"], 3),
                "records_per_s_ratio": round(main_run["records_per_s"] / base["records_per_s"], 3),
            }
            print(
                f"{args.records:,} vs {args.baseline:,} records: peak tree RSS x"
                f"{report['peak_rss_ratio']}, PSS x{report['peak_pss_ratio']}, records/s "
                f"x{report['records_per_s_ratio']}"
            )
        else:
            report = run_soak(
                args.records,
                workdir,
                workers=args.workers,
                seed=args.seed,
                chunk=args.chunk,
                slice_seconds=args.slice_seconds,
            )
            _print_report(report)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
