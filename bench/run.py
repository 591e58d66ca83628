r"""beam_jax against the physical limit and against stock Beam, on the same data, in one run.

    python bench/run.py --quick                  # 2,000 records, one round
    python bench/run.py --elements 200000 --repeat 3
    python bench/run.py --elements 200000 --kernels light \
        --variants beam_jax_arrow,beam_jax_arrow_binary   # each against its serial bound
    python bench/run.py --json out.json          # {"results": {kernel: {variant: {...}}},
                                                 #  "ratios", "strongest_stock", "fingerprint"}

Two kernels (``heavy``: masked self-attention plus MLP; ``light``: a masked mean-pool and
one matmul) over long-tailed ``(L, 64)`` records (``bench/_lib/records.py``). Each variant
(``bench/_lib/variants.py``) runs in a fresh process, rounds rotated, on its default
backend; its median is set against the fastest stock Beam variant (``x stock``) and against
``limit`` (``x limit``: the jitted kernel over pre-padded batches, compiles excluded).
``x bound`` and ``x serial`` divide by the slower of the limit and the variant's own read
(``read_only*``), and by their serial sum (above 1: reading and computing overlap); ``host
us`` is the wall time per record added to the limit's. Variants launch as the library's
jobs do; every output is checked against ``limit``'s. With py-spy (on PATH or
``$BEAM_JAX_PY_SPY``), ``gil us`` is the time per record a thread held the interpreter lock.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # python bench/run.py: the repository's root in the place of bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench._lib import harness  # noqa: E402

# The variants, and the I/O bound of each: its own input file, read and decoded alone.
READ_OF = {
    "limit": None,
    "read_only": None,
    "read_only_binary": None,
    "read_only_raw": None,
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
VARIANT_NAMES = tuple(READ_OF)
READ_ONLY = ("read_only", "read_only_binary", "read_only_raw")
STOCK = tuple(v for v in VARIANT_NAMES if v.startswith("stock_"))
# The variants that batch records of one length bucket together (the limit's buckets).
LENGTH_BUCKETED = ("beam_jax", "beam_jax_arrow", "beam_jax_arrow_binary", "stock_beam_buckets",
                   "stock_runinference", "stock_runinference_tuned",
                   "beam_jax_runinference")  # fmt: skip
# The data file each variant reads (``values.f32`` otherwise): only those are written.
FILE_OF = {"read_only": "data.parquet", "beam_jax_arrow": "data.parquet",
           "read_only_binary": "data_binary.parquet",
           "beam_jax_arrow_binary": "data_binary.parquet"}  # fmt: skip
KERNEL_NAMES = ("heavy", "light")
COLUMNS = (  # (header, field, format, width) of the table
    ("records/s", "elements_per_s", ".0f", 10), ("spread", "spread", ".0%", 7),
    ("x stock", "ratio_to_stock", ".3f", 8), ("x limit", "ratio_to_limit", ".3f", 8),
    ("x bound", "ratio_to_bound", ".3f", 8), ("x serial", "ratio_to_serial_bound", ".3f", 8),
    ("host us", "host_us_per_record", ".0f", 8), ("cpu us", "cpu_us_per_record", ".0f", 7),
    ("gil us", "gil_us_per_record", ".0f", 7), ("cores", "cores_busy", ".2f", 5),
    ("MFU", "mfu", ".1%", 6), ("compiles", "compiles", "", 8), ("compile s", "compile_s", ".2f", 9),
    ("padding", "padding_ratio", ".3f", 8), ("RSS MB", "peak_rss_mb", ".0f", 7),
)  # fmt: skip


def _variant(kernel: str, variant: str, cfg: dict) -> dict:
    """Runs ``variant`` as the library's jobs run (``beam_jax.jobs``): the objects alive at
    its start out of the garbage collector's full passes, and each bundle ending when its
    last step does."""
    from beam_jax import jobs
    from bench._lib.stock import STOCK_VARIANTS
    from bench._lib.variants import VARIANTS

    with jobs.freeze_startup_objects(), jobs.prompt_bundle_ends():
        return {**VARIANTS, **STOCK_VARIANTS}[variant](kernel, cfg)


def _run_in_process(kernel: str, variant: str, cfg: dict) -> dict:
    out = _variant(kernel, variant, cfg)
    out["device"] = harness.device()
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["elements"] = cfg["n"]
    return out


def _run_variant(args, cfg: dict, kernel: str, variant: str, tmp: Path) -> dict:
    outdir = tmp / f"{kernel}-{variant}"
    shutil.rmtree(outdir, ignore_errors=True)
    outdir.mkdir()
    cfg = dict(cfg, outdir=str(outdir))
    os.sync()  # every run starts with nothing of the earlier runs' outputs left to write
    if args.in_process:
        r = _run_in_process(kernel, variant, cfg)
    else:
        path = tmp / f"{kernel}-{variant}.json"
        path.write_text(json.dumps(cfg))
        argv = [sys.executable, "-m", "bench.run", "--child", kernel, variant, str(path)]
        what = f"{kernel}/{variant}"
        r = harness.run_child(argv, timeout=args.timeout, env=harness.child_env(), what=what)
    print(f"  {kernel}/{variant}: {r['elements'] / r['elapsed_s']:.0f} records/s "
          f"({r['elapsed_s']:.1f}s) on {r['device']}", flush=True)  # fmt: skip
    return r


def _check(name: str, reference, outdir: Path, n: int) -> str:
    """Every record exactly once, outputs equal to the limit's (float tolerance)."""
    import numpy as np

    files = [np.load(p) for p in sorted(outdir.glob("*.npz"))]
    ids = np.concatenate([f["ids"] for f in files])
    values = np.concatenate([f["values"] for f in files])[np.argsort(ids, kind="stable")]
    if not np.array_equal(np.sort(ids), np.arange(n)):
        raise AssertionError(f"{name}: expected ids 0..{n - 1} once each, got {len(ids)} rows")
    if reference is None:
        return values
    err = np.abs(values - reference)
    if not (err <= 2e-4 + 2e-4 * np.abs(reference)).all():
        raise AssertionError(f"{name}: outputs differ from limit's by up to {err.max():.3g}")
    return f"max |diff| {err.max():.2g}"


def strongest_stock(rows: dict) -> str | None:
    """The fastest stock Beam variant of a kernel's rows (None when none ran)."""
    stock = [v for v in rows if v in STOCK]
    return max(stock, key=lambda v: rows[v]["elements_per_s"]) if stock else None


def serial_bound(limit_rate: float, read_rate: float) -> float:
    """Records/s if reading the input and running the kernel took turns: 1 / (1/limit +
    1/read). On two cores the decode and the kernel share the cores; on an accelerator they
    can overlap, and a variant then beats this bound."""
    return 1 / (1 / limit_rate + 1 / read_rate)


def _bounds(rows: dict) -> None:
    """Adds each variant's ratios, bounds and host cost per record, in place."""
    limit = rows["limit"]
    peer = strongest_stock(rows)
    for variant, r in rows.items():
        rate = r["elements_per_s"]
        r["ratio_to_limit"] = rate / limit["elements_per_s"]
        r["ratio_to_stock"] = None if peer is None else rate / rows[peer]["elements_per_s"]
        read = rows.get(READ_OF[variant] or "")
        read_rate = read["elements_per_s"] if read else None
        r["serial_bound_per_s"] = read_rate and serial_bound(limit["elements_per_s"], read_rate)
        r["ratio_to_serial_bound"] = read_rate and rate / r["serial_bound_per_s"]
        bound = rate if variant in READ_ONLY else min(limit["elements_per_s"], read_rate or 1e30)
        r["ratio_to_bound"] = rate / bound
        per, limit_per = 1e6 / r["elements"], 1e6 / limit["elements"]
        ours = variant != "limit" and variant not in READ_ONLY
        r["host_us_per_record"] = (
            r["elapsed_s"] * per - limit["elapsed_s"] * limit_per if ours else None
        )


def _table(results: dict) -> str:
    header = f"{'kernel':7} {'variant':24}" + "".join(f" {h:>{w}}" for h, _, _, w in COLUMNS)
    lines = [header + "  check", "-" * (len(header) + 7)]
    for kernel, rows in results.items():
        for variant, r in rows.items():
            cells = "".join(
                f" {'-' if r.get(f) is None else format(r[f], spec):>{w}}"
                for _, f, spec, w in COLUMNS
            )
            lines.append(f"{kernel:7} {variant:24}{cells}  {r['check']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add = parser.add_argument
    add("--elements", type=int, default=20_000, help="records (default 20,000)")
    add("--quick", action="store_true", help="2,000 records, one round")
    add("--kernels", default=",".join(KERNEL_NAMES))
    add("--variants", default=",".join(VARIANT_NAMES))
    add("--json", help="write the results here")
    add("--workdir", help="data directory (default: a temp dir, reused)")
    add("--seed", type=int, default=0)
    add("--num-buckets", type=int, default=8, help="compile budget per axis")
    add("--plan-sample", type=int, default=4096, help="records the buckets are planned from")
    add("--batch-size", type=int, default=64)
    add("--max-padded-size", type=int, default=32768)
    add("--one-batch-size", action=argparse.BooleanOptionalAction, default=True,
        help="one batch size per bucket: bundle tails pad to a full batch")  # fmt: skip
    add("--repeat", type=int, default=3, help="rounds, each in a rotated order (median)")
    add("--timeout", type=float, default=900, help="seconds per variant")
    add("--in-process", action="store_true", help="every variant in this process (a smoke test)")
    add("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kernel, variant, path = args.child
        harness.emit(_run_in_process(kernel, variant, json.loads(Path(path).read_text())))
        return {}
    if args.quick:
        args.elements, args.repeat = 2_000, 1
    kernels = [k for k in args.kernels.split(",") if k]
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANT_NAMES:
            parser.error(f"unknown variant {v!r}; choose from {VARIANT_NAMES}")
    # The bounds run with every variant, side by side: the limit and each one's own read.
    reads = [READ_OF[v] for v in variants if READ_OF[v] and READ_OF[v] not in variants]
    variants = [v for v in ("limit", *dict.fromkeys(reads)) if v not in variants] + variants

    import numpy as np

    import beam_jax as bj
    from bench._lib.machine import fingerprint, format_fingerprint
    from bench._lib.records import MAX_LEN, generate, model_flops

    workdir = Path(
        args.workdir or Path(tempfile.gettempdir()) / f"beam_jax_bench_{args.seed}_{args.elements}"
    )
    started = time.perf_counter()
    meta = generate(workdir, args.elements, args.seed, tuple(dict.fromkeys(
        FILE_OF.get(v, "values.f32") for v in variants)))  # fmt: skip
    lengths = np.load(workdir / "lengths.npy")
    # Buckets planned from a fixed prefix: 20,000 and 200,000 records get the same shapes.
    bounds = bj.plan_boundaries(lengths[: args.plan_sample], args.num_buckets, max_size=MAX_LEN)
    cfg = {"workdir": str(workdir), "n": meta["n"], "boundaries": list(bounds),
           "batch_size": args.batch_size, "max_padded_size": args.max_padded_size,
           "batch_sizes": [args.batch_size] if args.one_batch_size else None}  # fmt: skip
    print(f"data: {meta['n']} records, {meta['tokens']} rows of 64 floats, in {workdir} "
          f"({time.perf_counter() - started:.1f}s); buckets {cfg['boundaries']}",
          flush=True)  # fmt: skip
    results, orders = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for kernel in kernels:
            runs, orders[kernel] = harness.run_rounds(
                variants,
                args.repeat,
                lambda v, _, k=kernel: _run_variant(args, cfg, k, v, Path(tmp)),
            )
            reference = _check(f"{kernel}/limit", None, Path(tmp) / f"{kernel}-limit", meta["n"])
            results[kernel] = {}
            for variant in variants:
                r = harness.summarize(runs[variant])
                n = r["elements"]
                r["elements_per_s"] = n / r["elapsed_s"]
                r["cpu_us_per_record"] = 1e6 * r["cpu_s"] / n
                r["gil_us_per_record"] = None if r.get("gil_s") is None else 1e6 * r["gil_s"] / n
                out = Path(tmp) / f"{kernel}-{variant}"
                r["check"] = (
                    "reference" if variant == "limit" else "I/O only" if variant in READ_ONLY
                    else _check(f"{kernel}/{variant}", reference, out, n)
                )  # fmt: skip
                results[kernel][variant] = r
            _bounds(results[kernel])
    machine = fingerprint()  # after the variants: on an accelerator one process holds it
    peak = machine["peak_gflops"].get("fp32")
    for kernel, rows in results.items():
        for variant, r in rows.items():
            flops = model_flops(kernel, lengths[: r["elements"]])
            ok = peak and variant not in READ_ONLY
            r["mfu"] = flops / r["elapsed_s"] / (peak * 1e9) if ok else None
    peers = {k: strongest_stock(rows) for k, rows in results.items()}
    ratios = {
        f"{k}/{v}_vs_{peers[k]}": r["ratio_to_stock"]
        for k, rows in results.items()
        for v, r in rows.items()
        if peers[k] and v not in STOCK and v not in READ_ONLY
    }
    named = ", ".join(f"{k}: {v or 'none ran'}" for k, v in peers.items())
    devices = sorted({r["device"] for rows in results.values() for r in rows.values()})
    print("\n" + _table(results))
    print(f"\nmedians of {args.repeat} rounds, each in a rotated order, every variant on the same "
          f"{meta['n']} records, timed on {', '.join(devices)}; x stock: against the fastest "
          f"stock Beam variant ({named}); "
          f"{format_fingerprint(machine)}")  # fmt: skip
    for key, value in ratios.items():
        print(f"  {key}: {value:.2f}x")
    print(f"total {time.perf_counter() - started:.0f}s")
    summary = [f"{k}: {v} {r['ratio_to_limit']:.2f}x the limit" for k, rows in results.items()
               for v, r in rows.items() if v.startswith("beam_jax")]  # fmt: skip
    out = {"results": results, "ratios": ratios, "strongest_stock": peers, "orders": orders,
           "fingerprint": machine, "summary": "; ".join(summary)}  # fmt: skip
    harness.write_json(args.json, out)
    return json.loads(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
