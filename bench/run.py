r"""beam_jax against the physical limit and against stock Beam, on the same data, in one run.

    python bench/run.py --quick                  # 20,000 records, 3 rounds
    python bench/run.py --elements 200000 --repeat 3
    python bench/run.py --elements 200000 --kernels light \
        --variants beam_jax_arrow,beam_jax_arrow_binary   # each against its serial bound
    python bench/run.py --json out.json          # {"results": {kernel: {variant: {...}}},
                                                 #  "ratios": {...}, "serial_bounds": {...},
                                                 #  "strongest_stock": {...}, "fingerprint": {...}}

Every variant runs on the same records, in a fresh process (its peak RSS its own), each
round in a rotated order (``harness.run_rounds``), and reports its median over the rounds
with the spread. Each is printed against the strongest stock Beam peer of that run (the
fastest ``stock_*`` variant: Beam's own length buckets, tuned as Beam's docs advise, or
the naive ones if they win) and against ``limit``: the same jitted kernel over
pre-bucketed, pre-padded batches, its compiles done before its clock (reported beside).
``limit`` and the read of each variant's own input file (``read_only*``) always run with
it, so after the table each variant's serial bound 1 / (1/limit + 1/read) is printed with
the variant's rate over it. Variants run as the library's jobs launch
(``beam_jax.jobs.freeze_startup_objects`` and ``prompt_bundle_ends``); every variant's
outputs are checked against ``limit``'s before the table is printed. With py-spy
installed (beside the interpreter, on PATH or ``$BEAM_JAX_PY_SPY``) each run also reports
the microseconds per record a thread held the interpreter lock.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import harness  # noqa: E402

VARIANT_NAMES = (
    "limit",
    "read_only",
    "read_only_binary",
    "read_only_raw",
    "beam_jax",
    "beam_jax_arrow",
    "beam_jax_arrow_binary",
    "stock_beam",
    "stock_beam_tuned",
    "stock_beam_buckets",
    "stock_runinference",
    "stock_runinference_tuned",
    "beam_jax_runinference",
)
# The I/O bound of each variant: its own input file, read and decoded alone.
READ_OF = {
    "beam_jax": "read_only_raw",
    "beam_jax_arrow": "read_only",
    "beam_jax_arrow_binary": "read_only_binary",
    "stock_beam": "read_only_raw",
    "stock_beam_tuned": "read_only_raw",
    "stock_beam_buckets": "read_only_raw",
    "stock_runinference": "read_only_raw",
    "stock_runinference_tuned": "read_only_raw",
    "beam_jax_runinference": "read_only_raw",
}
# The variants that batch records of one length bucket together (the limit's buckets).
LENGTH_BUCKETED = (
    "beam_jax",
    "beam_jax_arrow",
    "beam_jax_arrow_binary",
    "stock_beam_buckets",
    "stock_runinference",
    "stock_runinference_tuned",
    "beam_jax_runinference",
)
# The data file each variant reads (``values.f32`` otherwise): only those are written.
FILE_OF = {
    "read_only": "data.parquet",
    "beam_jax_arrow": "data.parquet",
    "read_only_binary": "data_binary.parquet",
    "beam_jax_arrow_binary": "data_binary.parquet",
}
READ_ONLY = ("read_only", "read_only_binary", "read_only_raw")
# The Arrow front end's target: at least this fraction of its serial bound on either file.
SERIAL_TARGET = 0.85
SERIAL_TARGET_VARIANTS = ("beam_jax_arrow", "beam_jax_arrow_binary")
# The stock Beam peers; the headline is against the fastest of them in the same run.
STOCK = tuple(v for v in VARIANT_NAMES if v.startswith("stock_"))
# The strongest (length-bucketed, fixed batch) stock peers, the naive ones a second row.
STRONG_STOCK = ("stock_beam_buckets", "stock_runinference_tuned")
# Ratios printed beside the headline: each of ours against its own front end's peer.
RATIOS = (
    ("beam_jax", "stock_beam_buckets"),
    ("beam_jax", "stock_beam_tuned"),
    ("beam_jax", "stock_beam"),
    ("beam_jax_runinference", "stock_runinference_tuned"),
    ("beam_jax_runinference", "stock_runinference"),
    ("beam_jax_arrow_binary", "beam_jax_arrow"),
)
KERNEL_NAMES = ("heavy", "light")
FIELDS = (
    "elements_per_s",
    "spread",
    "ratio_to_stock",
    "ratio_to_limit",
    "ratio_to_bound",
    "ratio_to_serial_bound",
    "serial_bound_per_s",
    "host_us_per_record",
    "host_cpu_us_per_record",
    "cpu_us_per_record",
    "gil_us_per_record",
    "cores_busy",
    "mfu",
    "compiles",
    "compile_s",
    "padding_ratio",
    "peak_rss_mb",
)


def _variant(kernel: str, variant: str, cfg: dict) -> dict:
    """Runs ``variant`` as the library's jobs run (``beam_jax.jobs``): the objects alive at
    its start out of the garbage collector's full passes (one such pass over the ~256,000
    objects of jax, Beam and pyarrow took ~0.12 s of a 3.4 s Beam variant, while Beam
    built its graph), and each bundle ending when its last step does."""
    from variants import VARIANTS

    from beam_jax import jobs

    with jobs.freeze_startup_objects(), jobs.prompt_bundle_ends():
        return VARIANTS[variant](kernel, cfg)


def _child(kernel: str, variant: str, cfg_path: str) -> None:
    cfg = json.loads(Path(cfg_path).read_text())
    harness.emit(_run_in_process(kernel, variant, cfg))


def _run_in_process(kernel: str, variant: str, cfg: dict) -> dict:
    out = _variant(kernel, variant, cfg)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["elements"] = cfg["n"]
    return out


def _run_child(kernel: str, variant: str, cfg: dict, tmp: Path, timeout: float) -> dict:
    cfg_path = tmp / f"{kernel}-{variant}.json"
    cfg_path.write_text(json.dumps(cfg))
    return harness.run_child(
        [sys.executable, str(HERE / "run.py"), "--child", kernel, variant, str(cfg_path)],
        timeout=timeout,
        env=harness.child_env(str(ROOT)),
        what=f"{kernel}/{variant}",
    )


def _load_outputs(outdir: Path):
    import numpy as np

    ids, values = [], []
    for path in glob.glob(str(outdir / "*.npz")):
        with np.load(path) as f:
            ids.append(f["ids"])
            values.append(f["values"])
    ids, values = np.concatenate(ids), np.concatenate(values)
    order = np.argsort(ids, kind="stable")
    return ids[order], values[order]


def _check(name: str, reference, outdir: Path, n: int) -> str:
    """Every record exactly once, outputs equal to the limit's (float tolerance)."""
    import numpy as np

    ids, values = _load_outputs(outdir)
    if not np.array_equal(ids, np.arange(n)):
        raise AssertionError(f"{name}: expected ids 0..{n - 1} once each, got {len(ids)} rows")
    ref_ids, ref_values = reference
    err = np.abs(values - ref_values[:n])
    tol = 2e-4 + 2e-4 * np.abs(ref_values[:n])
    if not (err <= tol).all():
        raise AssertionError(f"{name}: outputs differ from limit's by up to {err.max():.3g}")
    return f"max |diff| {err.max():.2g}"


def _config(args, workdir: Path, meta: dict) -> dict:
    import numpy as np
    from data import MAX_LEN

    import beam_jax as bj

    lengths = np.load(workdir / "lengths.npy")
    # Plan buckets from a fixed prefix, so 20,000 and 200,000 records get the same shapes.
    sample = lengths[: args.plan_sample]
    bounds = bj.plan_boundaries(sample, args.num_buckets, max_size=MAX_LEN)
    return {
        "workdir": str(workdir),
        "n": meta["n"],
        "boundaries": list(bounds),
        "batch_size": args.batch_size,
        "batch_sizes": [args.batch_size] if args.one_batch_size else None,
        "max_padded_size": args.max_padded_size,
    }


def _run_variant(args, cfg: dict, kernel: str, variant: str, tmp: Path) -> dict:
    run_cfg = dict(cfg)
    outdir = tmp / f"{kernel}-{variant}"
    shutil.rmtree(outdir, ignore_errors=True)
    outdir.mkdir()
    run_cfg["outdir"] = str(outdir)
    # Every run starts with nothing of the earlier runs' outputs left to write to the
    # disk, as on an idle machine (see bench/embed_text.py's _run).
    os.sync()
    if args.in_process:
        r = _run_in_process(kernel, variant, run_cfg)
    else:
        r = _run_child(kernel, variant, run_cfg, tmp, args.timeout)
    print(
        f"  {kernel}/{variant}: {r['elements'] / r['elapsed_s']:.0f} records/s "
        f"({r['elapsed_s']:.1f}s)",
        flush=True,
    )
    return r


def _summarize_runs(runs: list[dict]) -> dict:
    """The median run by time with its spread (``harness.summarize``) and its rate."""
    r = harness.summarize(runs)
    r["elements_per_s"] = r["elements"] / r["elapsed_s"]
    n = r["elements"]
    r["cpu_us_per_record"] = 1e6 * r["cpu_s"] / n
    r["gil_us_per_record"] = None if r.get("gil_s") is None else 1e6 * r["gil_s"] / n
    r.setdefault("compile_s", None)
    return r


def strongest_stock(rows: dict) -> str | None:
    """The fastest stock Beam variant of a kernel's rows (None when none ran)."""
    stock = [v for v in rows if v in STOCK]
    return max(stock, key=lambda v: rows[v]["elements_per_s"]) if stock else None


def _bounds(rows: dict) -> None:
    """Adds each variant's bounds, host cost per record and ratios, in place.

    ``x bound``: rate / min(limit, the read of the variant's own file) — the slower of
    compute and I/O, as if they overlapped perfectly. ``x serial``: rate / (1 / (1/limit +
    1/read)) — the rate if reading and compute took turns; above 1 means they overlap.
    ``host us/rec``: the variant's wall (and CPU) time per record minus the limit's: what
    the host adds per record on top of the kernel, the figure that decides whether an
    accelerator is fed.
    """
    limit = rows["limit"]
    limit_rate = limit["elements_per_s"]
    peer = strongest_stock(rows)
    for variant, r in rows.items():
        r["ratio_to_limit"] = r["elements_per_s"] / limit_rate
        r["ratio_to_stock"] = (
            None if peer is None else r["elements_per_s"] / rows[peer]["elements_per_s"]
        )
        read = rows.get(READ_OF.get(variant, variant)) if variant != "limit" else None
        bound = limit_rate if read is None else min(limit_rate, read["elements_per_s"])
        if variant in READ_ONLY:
            bound = r["elements_per_s"]
        r["ratio_to_bound"] = r["elements_per_s"] / bound
        if read is not None and variant not in READ_ONLY:
            serial = serial_bound(limit_rate, read["elements_per_s"])
            r["serial_bound_per_s"] = serial
            r["ratio_to_serial_bound"] = r["elements_per_s"] / serial
        else:
            r["serial_bound_per_s"] = r["ratio_to_serial_bound"] = None
        if variant == "limit" or variant in READ_ONLY:
            r["host_us_per_record"] = r["host_cpu_us_per_record"] = None
        else:
            per = 1e6 / r["elements"]
            limit_per = 1e6 / limit["elements"]
            r["host_us_per_record"] = r["elapsed_s"] * per - limit["elapsed_s"] * limit_per
            r["host_cpu_us_per_record"] = r["cpu_s"] * per - limit["cpu_s"] * limit_per


def serial_bound(limit_rate: float, read_rate: float) -> float:
    """Records/s if reading the input and running the kernel took turns: 1 / (1/limit +
    1/read). On two cores the decode and the kernel share the cores; on an accelerator they
    can overlap, and a variant then beats this bound."""
    return 1 / (1 / limit_rate + 1 / read_rate)


def _serial_bounds(results: dict) -> dict:
    """Per ``kernel/variant`` with its read measured: the serial bound and the rate over it."""
    out = {}
    for kernel, rows in results.items():
        for variant, r in rows.items():
            if r.get("serial_bound_per_s") is None:
                continue
            read = READ_OF[variant]
            target = SERIAL_TARGET if variant in SERIAL_TARGET_VARIANTS else None
            out[f"{kernel}/{variant}"] = {
                "read": read,
                "limit_per_s": rows["limit"]["elements_per_s"],
                "read_per_s": rows[read]["elements_per_s"],
                "bound_per_s": r["serial_bound_per_s"],
                "elements_per_s": r["elements_per_s"],
                "ratio": r["ratio_to_serial_bound"],
                "target": target,
                "meets_target": None if target is None else r["ratio_to_serial_bound"] >= target,
            }
    return out


def _serial_table(bounds: dict) -> str:
    lines = [
        "serial bounds, 1 / (1/limit + 1/read of the variant's own file), records/s (the "
        "target is for --elements 200000 --kernels light):",
        f"  {'kernel/variant':30} {'read':17} {'limit':>9} {'read/s':>9} {'bound':>9} "
        f"{'measured':>9} {'x serial':>8}  target",
    ]
    for key, b in bounds.items():
        target = "-"
        if b["target"] is not None:
            verdict = "met" if b["meets_target"] else "NOT met"
            target = f">= {b['target']:.2f}: {verdict}"
        lines.append(
            f"  {key:30} {b['read']:17} {b['limit_per_s']:9.0f} {b['read_per_s']:9.0f} "
            f"{b['bound_per_s']:9.0f} {b['elements_per_s']:9.0f} {b['ratio']:8.3f}  {target}"
        )
    return "\n".join(lines)


def _ratios(results: dict) -> dict:
    out = {}
    for kernel, rows in results.items():
        peer = strongest_stock(rows)
        pairs = [(v, peer) for v in rows if peer and v not in STOCK and v not in READ_ONLY]
        for variant, baseline in [*pairs, *RATIOS]:
            if variant in rows and baseline in rows:
                key = f"{kernel}/{variant}_vs_{baseline}"
                out[key] = rows[variant]["elements_per_s"] / rows[baseline]["elements_per_s"]
    return out


def _fmt(value, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}{spec}}"


def _table(results: dict) -> str:
    header = (
        f"{'kernel':7} {'variant':24} {'records/s':>10} {'spread':>7} {'x stock':>8} "
        f"{'x limit':>8} {'x bound':>8} {'x serial':>8} {'cpu us':>7} {'gil us':>7} "
        f"{'cores':>5} {'MFU %':>6} {'compiles':>8} {'compile s':>9} {'padding':>8} "
        f"{'RSS MB':>7} {'records':>7}  check"
    )
    lines = [header, "-" * len(header)]
    for kernel, rows in results.items():
        for variant, r in rows.items():
            mfu = None if r.get("mfu") is None else 100 * r["mfu"]
            lines.append(
                f"{kernel:7} {variant:24} {r['elements_per_s']:10.0f} "
                f"{100 * r['spread']:6.0f}% {_fmt(r['ratio_to_stock'], '.3f', 8)} "
                f"{r['ratio_to_limit']:8.3f} "
                f"{r['ratio_to_bound']:8.3f} {_fmt(r['ratio_to_serial_bound'], '.3f', 8)} "
                f"{r['cpu_us_per_record']:7.0f} {_fmt(r['gil_us_per_record'], '.0f', 7)} "
                f"{r['cores_busy']:5.2f} {_fmt(mfu, '.1f', 6)} "
                f"{str(r['compiles']):>8} {_fmt(r['compile_s'], '.2f', 9)} "
                f"{r['padding_ratio']:8.3f} {r['peak_rss_mb']:7.0f} "
                f"{r['elements']:7d}  {r.get('check', '')}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--elements", type=int, default=20_000, help="records (default 20,000)")
    parser.add_argument("--quick", action="store_true", help="20,000 records")
    parser.add_argument("--kernels", default=",".join(KERNEL_NAMES))
    parser.add_argument("--variants", default=",".join(VARIANT_NAMES))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--workdir", help="data directory (default: a temp dir, reused)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-buckets", type=int, default=8, help="compile budget per axis")
    parser.add_argument("--plan-sample", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-padded-size", type=int, default=32768)
    parser.add_argument(
        "--one-batch-size",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one batch size per bucket: bundle tails pad to a full batch",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="rounds: every variant runs once per round, each round in a rotated order; "
        "the median is reported (default 3)",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per variant")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every variant in this process (fast smoke test; RSS is then cumulative)",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return {}
    if args.quick:
        args.elements = 20_000
    kernels = [k for k in args.kernels.split(",") if k]
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANT_NAMES:
            parser.error(f"unknown variant {v!r}; choose from {VARIANT_NAMES}")
    # The bounds run with every variant, side by side: the limit and each one's own read.
    reads = [READ_OF[v] for v in variants if v in READ_OF and READ_OF[v] not in variants]
    variants = [v for v in ("limit", *dict.fromkeys(reads)) if v not in variants] + variants

    import numpy as np
    from data import generate
    from fingerprint import fingerprint, format_fingerprint
    from kernels import model_flops

    workdir = Path(
        args.workdir or Path(tempfile.gettempdir()) / f"beam_jax_bench_{args.seed}_{args.elements}"
    )
    started = time.perf_counter()
    files = tuple(dict.fromkeys(FILE_OF.get(v, "values.f32") for v in variants))
    meta = generate(workdir, args.elements, args.seed, files)
    cfg = _config(args, workdir, meta)
    print(
        f"data: {meta['n']} records, {meta['tokens']} rows of {64} floats, in {workdir} "
        f"({time.perf_counter() - started:.1f}s); buckets {cfg['boundaries']}",
        flush=True,
    )
    machine = fingerprint()
    peak_fp32 = machine["peak_gflops"].get("fp32")
    lengths = np.load(workdir / "lengths.npy")
    results: dict = {}
    orders: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for kernel in kernels:
            runs, orders[kernel] = harness.run_rounds(
                variants, args.repeat, lambda v, _r, k=kernel: _run_variant(args, cfg, k, v, tmp)
            )
            results[kernel] = {}
            reference = None
            for variant in variants:
                r = _summarize_runs(runs[variant])
                outdir = tmp / f"{kernel}-{variant}"
                r["mfu"] = None
                if variant == "limit":
                    reference = _load_outputs(outdir)
                    r["check"] = "reference"
                elif variant in READ_ONLY:
                    r["check"] = "I/O only"
                else:
                    r["check"] = _check(f"{kernel}/{variant}", reference, outdir, r["elements"])
                if variant not in READ_ONLY:
                    flops = model_flops(kernel, lengths[: r["elements"]])
                    r["mfu"] = flops / r["elapsed_s"] / (peak_fp32 * 1e9) if peak_fp32 else None
                results[kernel][variant] = r
            _bounds(results[kernel])
    ratios = _ratios(results)
    bounds = _serial_bounds(results)
    peers = {k: strongest_stock(rows) for k, rows in results.items()}
    print()
    print(_table(results))
    print(
        f"\nmedians of {args.repeat} rounds, each in a rotated order, every variant on the "
        f"same {meta['n']} records; x stock: against the fastest stock Beam variant "
        f"({', '.join(f'{k}: {v}' for k, v in peers.items())}); x limit: against the kernel "
        f"alone, its compiles excluded (compile s); {format_fingerprint(machine)}"
    )
    for key, value in ratios.items():
        print(f"  {key}: {value:.2f}x")
    if bounds:
        print(_serial_table(bounds))
    print(f"total {time.perf_counter() - started:.0f}s")
    out = {
        k: {
            v: {f: r[f] for f in (*FIELDS, "elements", "elapsed_s", "cpu_s", "runs_s", "repeats")}
            for v, r in rows.items()
        }
        for k, rows in results.items()
    }
    out = {
        "results": out,
        "ratios": ratios,
        "serial_bounds": bounds,
        "strongest_stock": peers,
        "orders": orders,
        "fingerprint": machine,
    }
    harness.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
