"""Batch sizes fitted to memory against fixed batch sizes, on bench/run.py's heavy kernel.

    python bench/fit_batch.py                        # 20,000 records, ~3 min on 2 cores
    python bench/fit_batch.py --elements 4000 --repeat 1 --fixed 32,64 --budgets-mib 64

Every variant runs ``RunKernel`` end to end on the FnApiRunner over the same records (as
``bench/run.py``'s ``beam_jax`` variant), each in a fresh process, with the same compile
budget: one batch size per bucket, so each run compiles one shape per bucket (8). The fixed
variants pad every batch to one size (``Bucketing(batch_sizes=(size,))``); the default is
``fixed 32`` (``Bucketing``'s default ``batch_size``, padded to one size); the fit variants
choose per bucket among ``--candidates`` by XLA's memory analysis within a stated budget
(``FitToMemory(budget_bytes=..., one_size=True)``), whose search compiles are counted in
their ``compiles`` (the run's 8 shapes are among them). Outputs are checked against
``fixed 32``'s. ``steady/s`` is measured: each child process, after its first run, runs
the same configuration again with every compile in JAX's persistent compilation cache (as
a rerun of the job, or a long job past its start, sees it); the fit's search, which compiles
several shapes per bucket, then loads them instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]


def _bucketing(cfg: dict, batch_sizes):
    import beam_jax as bj

    return bj.Bucketing(
        boundaries={"L": tuple(cfg["boundaries"])},
        batch_size=max(batch_sizes),
        batch_sizes=tuple(batch_sizes),
        max_padded_size=cfg.get("max_padded_size"),
    )


def _child(cfg_path: str) -> None:
    import apache_beam as beam
    from data import warm
    from kernels import KERNELS, load_params
    from variants import SPEC, CollectRows, ReadRecord, _indices, _pipeline

    import beam_jax as bj
    from beam_jax._src.kernel.cache import enable_compilation_cache

    cfg = json.loads(Path(cfg_path).read_text())
    enable_compilation_cache(cfg["cache_dir"])

    def once(outdir: str) -> dict:
        fit = None
        if cfg["budget"] is not None:
            fit = bj.FitToMemory(budget_bytes=cfg["budget"], one_size=True)
        warm(os.path.join(cfg["workdir"], "values.f32"))
        start = time.perf_counter()
        p = _pipeline()
        records = _indices(p, cfg["n"]) | "Read" >> beam.ParDo(ReadRecord(cfg["workdir"], True))
        results, _ = (
            records
            | bj.RunKernel(
                KERNELS["heavy"],
                spec=SPEC,
                bucketing=_bucketing(cfg, cfg["batch_sizes"]),
                load_params=load_params,
                keyed=True,
                fit_to_memory=fit,
            ).with_exception_handling()
        )
        _ = results | "Collect" >> beam.ParDo(CollectRows(outdir, "pairs"))
        result = p.run()
        result.wait_until_finish()
        elapsed = time.perf_counter() - start
        s = bj.summarize(result)
        if not s.conserved or s.dead_letters or s.out_of_memory:
            raise RuntimeError(f"lost, rejected or out-of-memory elements: {s}")
        return {"elapsed_s": elapsed, "s": s}

    first = once(cfg["outdir"])
    steady_dir = cfg["outdir"] + "_steady"
    os.makedirs(steady_dir, exist_ok=True)
    again = once(steady_dir)  # the same configuration, its compiles now cached
    s = first["s"]
    out = {
        "elapsed_s": first["elapsed_s"],
        "steady_s": again["elapsed_s"],
        "steady_compile_s": again["s"].compile_seconds,
        "compiles": s.compiles,
        "compile_s": s.compile_seconds,
        "padding_ratio": s.padding_ratio,
    }
    print("RESULT " + json.dumps(out), flush=True)


def _run(cfg: dict, tmp: Path, timeout: float) -> dict:
    path = tmp / f"{cfg['name']}.json"
    path.write_text(json.dumps(cfg))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(HERE / "fit_batch.py"), "--child", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{cfg['name']} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def _chosen(base: dict, budget: int, candidates) -> dict:
    """The fit's per-bucket choice and analysed bytes, as a worker computes them."""
    from kernels import KERNELS, load_params
    from variants import SPEC

    import beam_jax as bj
    from beam_jax.internal import fit_plan

    options = bj.KernelOptions(
        bucketing=_bucketing(base, candidates),
        load_params=load_params,
        fit_to_memory=bj.FitToMemory(budget_bytes=budget, one_size=True),
    )
    report = fit_plan(KERNELS["heavy"], SPEC, options)
    rows = [r for r in report.table() if r["chosen"]]
    return {
        "limits": [r["batch_size"] for r in rows],
        "total_mib": [round(r["total_bytes"] / 2**20, 1) for r in rows],
        "hidden_mib": [round(r["hidden_bytes"] / 2**20, 1) for r in rows],
        "search_compiles": report.compiles,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--elements", type=int, default=20_000)
    parser.add_argument("--fixed", default="16,32,64,128,256", help="fixed batch sizes")
    parser.add_argument("--budgets-mib", default="16,64,256", help="fit budgets, MiB")
    parser.add_argument("--candidates", default="8,16,32,64,128,256,512")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved; median reported")
    parser.add_argument("--workdir", help="data directory (default: a temp dir, reused)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return {}

    import numpy as np
    from data import MAX_LEN, generate
    from run import _check, _load_outputs

    import beam_jax as bj

    workdir = Path(
        args.workdir or Path(tempfile.gettempdir()) / f"beam_jax_bench_0_{args.elements}"
    )
    meta = generate(workdir, args.elements, 0)
    lengths = np.load(workdir / "lengths.npy")
    boundaries = [int(b) for b in bj.plan_boundaries(lengths[:4096], 8, max_size=MAX_LEN)]
    base = {"workdir": str(workdir), "n": meta["n"], "boundaries": boundaries}
    candidates = [int(c) for c in args.candidates.split(",")]
    variants = {}
    for f in (int(x) for x in args.fixed.split(",")):
        variants[f"fixed {f}"] = {"batch_sizes": [f], "budget": None}
    if "fixed 32" not in variants:
        variants = {"fixed 32": {"batch_sizes": [32], "budget": None}, **variants}
    chosen = {}
    for mib in (int(x) for x in args.budgets_mib.split(",")):
        name = f"fit {mib} MiB"
        variants[name] = {"batch_sizes": candidates, "budget": mib << 20}
        chosen[name] = _chosen(base, mib << 20, candidates)
    print(f"{meta['n']} records, buckets {boundaries}", flush=True)
    for name, c in chosen.items():
        print(f"  {name}: batch limits {c['limits']}, analysed MiB {c['total_mib']}", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for _ in range(args.repeat):  # interleaved, so a noisy spell hits every variant
            for name, v in sorted(variants.items(), key=lambda kv: kv[0] != "fixed 32"):
                outdir = tmp / name.replace(" ", "_")
                outdir.mkdir(exist_ok=True)
                for old in outdir.glob("*.npz"):
                    old.unlink()
                cfg = {
                    **base,
                    **v,
                    "name": name.replace(" ", "_"),
                    "outdir": str(outdir),
                    # One cache per variant and repeat: each child starts cold, runs warm.
                    "cache_dir": str(tmp / f"cache-{name.replace(' ', '_')}-{len(runs[name])}"),
                }
                r = _run(cfg, tmp, args.timeout)
                runs[name].append(r)
                print(f"  {name}: {meta['n'] / r['elapsed_s']:.0f} records/s", flush=True)
                if name == "fixed 32":
                    reference = _load_outputs(outdir)
                else:
                    r["check"] = _check(name, reference, outdir, meta["n"])
    results = {}
    for name, rs in runs.items():
        ordered = sorted(rs, key=lambda r: r["elapsed_s"])
        r = dict(ordered[len(ordered) // 2])
        r["elements_per_s"] = meta["n"] / r["elapsed_s"]
        # Steady state, measured: the median of the second (cache-warm) runs.
        r["steady_per_s"] = meta["n"] / float(np.median([x["steady_s"] for x in rs]))
        r["runs_s"] = [round(x["elapsed_s"], 2) for x in rs]
        r.update(chosen.get(name, {}))
        results[name] = r
    fixed = [n for n in results if n.startswith("fixed")]
    best_fixed = max(fixed, key=lambda n: results[n]["elements_per_s"])
    best_steady = max(fixed, key=lambda n: results[n]["steady_per_s"])
    default = results["fixed 32"]
    print(
        f"\n{'variant':14} {'records/s':>9} {'x default':>9} {'x best':>6} "
        f"{'compiles':>8} {'compile s':>9} {'steady/s':>8} {'x default':>9} {'x best':>6} "
        f"{'padding':>7}  batch limits per bucket"
    )
    for name, r in results.items():
        limits = r.get("limits", variants[name]["batch_sizes"])
        print(
            f"{name:14} {r['elements_per_s']:9.0f} "
            f"{r['elements_per_s'] / default['elements_per_s']:9.3f} "
            f"{r['elements_per_s'] / results[best_fixed]['elements_per_s']:6.3f} "
            f"{r['compiles']:8d} {r['compile_s']:9.1f} {r['steady_per_s']:8.0f} "
            f"{r['steady_per_s'] / default['steady_per_s']:9.3f} "
            f"{r['steady_per_s'] / results[best_steady]['steady_per_s']:6.3f} "
            f"{r['padding_ratio']:7.3f}  {limits}"
        )
    print(f"best fixed: {best_fixed} end to end, {best_steady} in steady state")
    from fingerprint import fingerprint, format_fingerprint

    print(f"medians of {args.repeat} runs each; {format_fingerprint(fingerprint())}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
