"""The host on one core against two, and the interpreter lock it holds per text.

    python bench/host_cores.py                      # 100,000 texts, 3 rounds, 1 and 2 cores
    python bench/host_cores.py --texts 200000 --rounds 5 --cores 1,2 --json out.json

Runs ``bench/embed_text.py``'s ``host_only`` (the flagship with a kernel that takes no time:
read Parquet, tokenize, pack, lay out, gather, write) in a new process per run, pinned to
the first ``c`` usable cores for each ``c`` in ``--cores``, and once more on all of them
with ``py-spy record --gil`` sampling which thread holds the interpreter lock (py-spy from
``$BEAM_JAX_PY_SPY``, beside this interpreter or on PATH; without it that run is left out).
The sampled run is apart from the timed ones, so py-spy's own CPU does not slow them.
Rounds rotate the order of the settings. Prints, for each, the median run (``run()``
called to the job finished), texts/s, cores busy (the run's CPU over its wall), the launch
(``run()`` called to the first part tokenized) and the process's (from the process started
to the first part tokenized); then the rate on the most cores over the rate on the fewest,
and the lock's microseconds per text, with the machine's fingerprint and load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import harness  # noqa: E402

GIL = "gil"  # the setting sampled with py-spy


def _child(cfg_path: str) -> None:
    cfg = json.loads(Path(cfg_path).read_text())
    root = Path(cfg["root"])  # the checkout whose job runs (this one or --baseline)
    sys.path[:0] = [str(root / "bench"), str(root)]
    try:  # this tree's variants, or an older checkout's embed_text before they moved
        from embed_variants import host_only
    except ImportError:
        from embed_text import _host_only as host_only

    harness.pin(cfg["threads"])
    import pipelines.embed.job  # noqa: F401  (the imports before the clock: run() alone)

    sampler = _Sampler(harness.py_spy(), cfg.get("gil_raw")) if cfg["gil"] else None
    if sampler is not None:
        time.sleep(0.3)  # py-spy attaches before the clock starts
    out = host_only(cfg, [])
    out["gil_s"] = None if sampler is None else sampler.stop()
    out["gil_launch_s"] = None if sampler is None else sampler.launch_s
    harness.emit(out)


class _Sampler(harness._GilSampler):
    """``harness``'s sampler, which also counts the launch's samples apart and keeps the
    raw stacks at ``keep`` (if given) to read where the lock goes."""

    def __init__(self, exe: str, keep: str | None):
        super().__init__(exe)
        self.keep = keep
        self.launch_s: float | None = None

    def stop(self) -> float | None:
        self.proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.proc.wait(timeout=30)
            text = Path(self.out).read_text()
            if self.keep:
                Path(self.keep).write_text(text)
            self.launch_s = _launch_samples(text) / self.RATE
        return super().stop()


def _launch_samples(raw: str) -> int:
    """py-spy raw stacks' samples in the job's launch: in ``run()`` but not in a bundle
    (flags, model, plan, the graph built, the runner's own work before and between
    bundles); the rest is the bundles' thread and the job's own threads."""
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if "(pipelines/embed/job.py" in stack and "process_bundle" not in stack:
            samples += int(count)
    return samples


def _run(setting: str, data: dict, how: tuple, tmp: Path, round_: int, args) -> dict:
    import embed_runs

    root, cores, gil = how
    name = setting.replace(" ", "_").replace("/", "_")
    out = tmp / f"{name}-{round_}"
    cfg = dict(
        data,
        root=str(root),
        threads=cores,
        gil=gil,
        gil_raw=str(Path(args.gil_stacks) / f"{name}-{round_}.txt")
        if args.gil_stacks and gil
        else None,
        out=str(out),
        pipeline_args=["--compilation_cache_dir", str(tmp / "jax-cache")],
    )
    cfg_path = tmp / f"{name}-{round_}.json"
    cfg_path.write_text(json.dumps(cfg))
    os.sync()  # earlier runs' outputs flushed before this one (see embed_runs.run)
    launched = time.time()
    result = harness.run_child(
        [sys.executable, __file__, "--child", str(cfg_path)],
        timeout=args.timeout,
        env=embed_runs._env(cores),
        what=f"host_only on {setting}",
    )
    first = result.pop("first_part_epoch", None)
    result["process_launch_s"] = None if first is None else first - launched
    result["load"] = os.getloadavg()[0]
    subprocess.run(["rm", "-rf", str(out)], check=False)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=100_000, help="texts (default 100,000)")
    parser.add_argument("--rounds", type=int, default=3, help="turns per setting (median)")
    parser.add_argument("--cores", default="1,2", help="core counts to pin to (default 1,2)")
    parser.add_argument(
        "--baseline", help="another checkout (e.g. a git worktree of main) run side by side"
    )
    parser.add_argument("--no-gil", action="store_true", help="leave out the sampled runs")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--gil-stacks", help="keep the sampled runs' raw py-spy stacks here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return {}
    usable = len(os.sched_getaffinity(0))
    cores = sorted({int(c) for c in args.cores.split(",") if c})
    if not cores or cores[0] < 1 or cores[-1] > usable or args.texts < 1 or args.rounds < 1:
        parser.error(
            f"--cores must name 1..{usable} cores and --texts, --rounds be >= 1; got "
            f"{args.cores!r}, {args.texts}, {args.rounds}"
        )
    if args.baseline and not (Path(args.baseline) / "pipelines" / "embed").is_dir():
        parser.error(f"--baseline must be a checkout of this project, got {args.baseline!r}")
    import embed_runs
    from fingerprint import fingerprint, format_fingerprint

    gil = not args.no_gil and harness.py_spy() is not None
    if not args.no_gil and not gil:
        print("note: no py-spy (set BEAM_JAX_PY_SPY); the lock is not sampled")
    if args.gil_stacks:
        Path(args.gil_stacks).mkdir(parents=True, exist_ok=True)
    trees = {"": HERE.parent}
    if args.baseline:
        trees = {"baseline ": Path(args.baseline).resolve(), "this tree ": HERE.parent}
    settings = {}  # name -> (checkout, cores, sampled)
    for prefix, root in trees.items():
        settings.update({f"{prefix}{c} cores": (root, c, False) for c in cores})
        if gil:
            settings[f"{prefix}{cores[-1]} cores, {GIL}"] = (root, cores[-1], True)
    with tempfile.TemporaryDirectory(prefix="bench_host_cores_") as tmp:
        tmp = Path(tmp)
        data = embed_runs.write_data(tmp, args.texts)
        data.pop("st_slots_by_length", None)
        for root in trees.values():  # not counted: the compilation cache filled, files cached
            _run("warm", data, (root, cores[-1], False), tmp, 0, args)
        runs, _ = harness.run_rounds(
            list(settings), args.rounds, lambda s, r: _run(s, data, settings[s], tmp, r, args)
        )
    n = args.texts
    results = {}
    for setting, rs in runs.items():
        median = harness.summarize(rs, key="seconds")
        results[setting] = {
            "cores": settings[setting][1],
            "seconds_median": median["seconds"],
            "seconds_all": [round(r["seconds"], 2) for r in rs],
            "texts_per_s": n / median["seconds"],
            "cores_busy": median["run_cpu_s"] / median["seconds"],
            "launch_s_median": harness.median([r["launch_s"] for r in rs]),
            "process_launch_s_median": harness.median([r["process_launch_s"] for r in rs]),
            "load_all": [round(r["load"], 1) for r in rs],
        }
        if settings[setting][2]:
            held = [r["gil_s"] for r in rs if r.get("gil_s") is not None]
            after = [r["gil_s"] - r["gil_launch_s"] for r in rs if r.get("gil_launch_s")]
            results[setting]["gil_s_all"] = [round(g, 2) for g in held]
            results[setting]["gil_us_per_text"] = 1e6 * harness.median(held) / n
            results[setting]["gil_after_launch_us_per_text"] = (
                1e6 * harness.median(after) / n if after else float("nan")
            )
    machine = fingerprint()
    print(
        f"host_only, {n} texts, {args.rounds} rounds in rotated order, a new process per run "
        "pinned to the first N cores; launch: run() called to the first part tokenized"
    )
    print(
        f"{'':24} {'median s':>8} {'texts/s':>8} {'busy':>5} {'launch s':>8} "
        f"{'process start to 1st part s':>27}  runs (s); load"
    )
    for setting, r in results.items():
        print(
            f"{setting:24} {r['seconds_median']:8.2f} {r['texts_per_s']:8.0f} "
            f"{r['cores_busy']:5.2f} {r['launch_s_median']:8.2f} "
            f"{r['process_launch_s_median']:27.2f}  {r['seconds_all']}; {r['load_all']}"
        )
    ratios = {}
    for prefix in trees:
        few = results[f"{prefix}{cores[0]} cores"]["seconds_median"]
        most = results[f"{prefix}{cores[-1]} cores"]["seconds_median"]
        ratios[prefix.strip() or "this tree"] = few / most
        print(f"{prefix}{cores[-1]} cores over {cores[0]}: {few / most:.2f}x (medians)")
    for setting, r in results.items():
        if "gil_us_per_text" in r:
            print(
                f"{setting}: interpreter lock held {r['gil_us_per_text']:.2f} us per text in "
                f"run(), {r['gil_after_launch_us_per_text']:.2f} in its bundles and threads "
                f"(py-spy --gil, {harness._GilSampler.RATE} Hz; runs {r['gil_s_all']} s)"
            )
    print(format_fingerprint(machine))
    report = {
        "texts": n,
        "rounds": args.rounds,
        "results": results,
        "ratios": ratios,
        "fingerprint": machine,
    }
    harness.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
