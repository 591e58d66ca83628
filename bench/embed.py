"""The embedding flagship against its peers and against its limit, side by side in one run.

    python bench/embed.py --quick                  # 300 built-in texts, one round
    python bench/embed.py --texts 20000 --rounds 3 --json out.json
    python bench/embed.py --parquet corpus.parquet --column body --variants limit,pipeline
    python bench/embed.py --profile --texts 1000000 --runs 3 --profile_dir traces

The variants embed the same texts (the built-in ones cycled to ``--texts``, or a corpus of
one's own, ``--parquet FILE --column NAME``) with all-MiniLM-L6-v2 (or ``--model_dir``),
each in a fresh process pinned to the same ``--threads`` CPUs, ``--rounds`` rounds in a
rotated order; the table shows medians:

* ``limit``: the flagship's own packed batches alone on the device, warm, no Beam
  (``bench/_lib/limit.py``): the fastest the flagship could run here.
* ``pipeline``: ``pipelines.embed`` end to end on the FnApiRunner, Parquet in and out, timed
  from ``run()`` called to the job finished; ``pipeline_float32``: with ``--matmuls float32``.
* ``limit_xla``, ``pipeline_xla``: the same with ``--layer_kernel xla``, XLA's layers (the
  default off a TPU; on a TPU the default runs each layer as one Pallas kernel).
* ``sentence_transformers`` (``_bf16``: under ``torch.autocast(bfloat16)``): ``encode`` after
  a warm-up batch, in an interpreter with torch (``--st-python``), on ``--st-device``.
* ``runinference``: the same JAX model under stock ``RunInference``, tuned as a careful user
  would (Beam's length buckets, batches of exactly 64, a compilation cache).
* ``host_only``: the flagship with a kernel that takes no time, the rate that decides whether
  an accelerator is fed (over ``limit``: above 1, it is); ``tokenize_only``: the texts read
  and tokenized with the flagship's call, nothing else.

Every JAX variant computes on its process's default backend, as the job would, and each row
says which device it timed; the children's lines (the job's progress, the limit's compiles)
are printed as they come. The variants that compile inside their clock have a compilation
cache each, empty before round 1 (cold); later rounds are warm. ``MFU``: the model's useful
FLOPs per second over the matmul peak of the dtype its matmuls ran in; under the table, each
limit's roofline (``bench/_lib/limit.py``: XLA's FLOPs and bytes per token and layer, the
least bytes, and the MFU bound each leaves on this device). Each model's
embeddings are checked against sentence-transformers' (else the flagship's) by their least
cosine. ``--profile`` runs the flagship as whole processes instead, phase by phase, each
traced (``bench/_lib/profile.py``). The flagship's XLA settings: bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # python bench/embed.py: the repository's root in the place of bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench._lib import embed_variants as ev  # noqa: E402
from bench._lib import harness, limit  # noqa: E402

DEFAULT_ST_PYTHON = "/tmp/refvenv/bin/python"
# The variants that compile inside their clock (their first round with an empty cache).
COMPILING = ("pipeline", "pipeline_float32", "pipeline_xla", "runinference", "host_only")
# Ratios printed under the table: ours over theirs, from their warm medians (else medians).
PAIRS = (
    ("pipeline", "limit"),
    ("limit", "limit_xla"),
    ("pipeline_xla", "limit_xla"),
    ("host_only", "limit"),
    ("pipeline", "sentence_transformers"),
    ("pipeline_float32", "sentence_transformers"),
    ("pipeline", "sentence_transformers_bf16"),
    ("pipeline", "runinference"),
    ("host_only", "tokenize_only"),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--texts", type=int, help="texts (default 2,000; a --parquet corpus: all of it)")
    add("--quick", action="store_true", help="300 texts, one round (one warm run in --profile)")
    add("--rounds", type=int, default=3, help="turns per variant (median)")
    add("--threads", type=int, default=len(os.sched_getaffinity(0)), help="CPUs each run uses")
    add(
        "--variants",
        default=",".join(ev.DEFAULT_VARIANTS),
        help=f"comma-separated, of {','.join(ev.VARIANTS)} (default %(default)s)",
    )
    add("--parquet", help="a corpus of your own: a Parquet file (default: the built-in texts)")
    add("--column", default="text", help="the --parquet file's text column")
    add("--model_dir", help="a sentence-transformers model directory (default: MiniLM's)")
    add(
        "--st-python",
        help=f"a Python with sentence-transformers (default: this one if it has "
        f"it, else {DEFAULT_ST_PYTHON})",
    )
    add("--st-device", default="cpu", help="sentence-transformers' torch device (e.g. cuda)")
    add("--pipeline-args", default="", help="the flagship's extra flags, e.g. '--batch_size 32'")
    add("--timeout", type=float, default=1800, help="seconds per run; then stopped, stacks shown")
    add("--json", help="write the results here")
    add("--keep-outputs", help="write each run's output here (<variant>-<round>/)")
    add("--profile", action="store_true", help="the flagship's whole processes, traced")
    add("--runs", type=int, default=2, help="with --profile: warm runs, each a new process")
    add("--no-cold", action="store_true", help="with --profile: leave out the cold run")
    add("--cache-dir", help="with --profile: the compilation cache, kept (default: a new one)")
    add("--profile_dir", help="with --profile: keep each run's trace here")
    add("--child", nargs=2, help=argparse.SUPPRESS)
    return parser


def _has_st(python: str) -> bool:
    import subprocess

    if not Path(python).exists():
        return False
    probe = [python, "-c", "import sentence_transformers"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def write_data(work: Path, args) -> dict:
    """The texts every variant reads: ``texts.parquet`` (``id``, ``text``; row groups of
    1,024) and ``texts.json``, with their token count and useful FLOPs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_jax.text import SentenceEncoder, builtin_corpus

    if args.parquet:
        column = pq.read_table(args.parquet, columns=[args.column]).column(0).to_pylist()
        texts = [t for t in column if t is not None]  # a null is no text: the job dead-letters it
        source = f"{args.parquet} ({args.column}, {len(column) - len(texts)} nulls left out)"
    else:
        texts, source = [t for _, t in builtin_corpus()], "the built-in texts"
    n = args.texts or (len(texts) if args.parquet else 2000)
    texts = [texts[i % len(texts)] for i in range(n)]
    table = pa.table({"id": pa.array(range(n), pa.int64()), "text": pa.array(texts)})
    pq.write_table(table, work / "texts.parquet", row_group_size=1024)
    (work / "texts.json").write_text(json.dumps(texts))
    model = SentenceEncoder.from_dir(args.model_dir)
    lengths = [len(x) for x in model.tokenizer().encode_batch(texts)]
    return {
        "parquet": str(work / "texts.parquet"),
        "texts": str(work / "texts.json"),
        "source": source,
        "model_dir": str(model.model_dir()),
        "n": n,
        "tokens": sum(lengths),
        "flops": float(sum(model.flops_per_token(k) * k for k in lengths)),
    }


def _run(variant: str, data: dict, args, work: Path, round_: int) -> dict:
    out = work / f"{variant}-{round_}"
    out.mkdir()
    cfg = dict(
        data,
        threads=args.threads,
        batch_size=ev.BATCH_SIZE,
        out=str(out),
        st_device=args.st_device,
        st_dtype=ev.ST_VARIANTS.get(variant),
        pipeline_args=shlex.split(args.pipeline_args),
        cache_dir=str(work / f"jax-cache-{variant}"),
    )
    (work / "cfg.json").write_text(json.dumps(cfg))
    cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))[: args.threads]))
    if variant in ev.ST_VARIANTS:
        (work / "st.py").write_text(ev.ST_SCRIPT)
        argv = ["taskset", "-c", cpus, args.st_python, str(work / "st.py"), str(work / "cfg.json")]
    else:
        argv = [sys.executable, "-m", "bench.embed", "--child", variant, str(work / "cfg.json")]
    # Earlier runs' outputs still waiting to reach the disk slow the next run's writes:
    # each run starts as on an idle machine, with nothing left to write.
    os.sync()
    started = time.perf_counter()
    what = f"{variant} (round {round_ + 1})"
    r = harness.run_child(argv, timeout=args.timeout, env=ev.child_env(args.threads), what=what)
    r["process_s"], r["out"] = time.perf_counter() - started, str(out)
    return r


def _summarize(runs: dict[str, list[dict]], n: int) -> dict:
    """Each variant's median round, spread, cold (round 1) and warm (later rounds) times."""
    rows = {}
    for variant, rs in runs.items():
        seconds = [r["seconds"] for r in rs]
        median = harness.median(seconds)
        rows[variant] = {
            **{k: v for k, v in rs[-1].items() if k not in ("seconds", "out")},
            "texts_per_s": n / median,
            "seconds_median": median,
            "seconds_all": [round(s, 3) for s in seconds],
            "spread": (max(seconds) - min(seconds)) / median,
            "process_s_median": harness.median([r["process_s"] for r in rs]),
        }
        if variant in COMPILING:  # compiles inside its clock: round 1 cold, the rest warm
            rows[variant]["cold_s"] = seconds[0]
            rows[variant]["warm_s"] = harness.median(seconds[1:]) if len(seconds) > 1 else None
        rows[variant]["timed_s"] = rows[variant].get("warm_s") or median
    return rows


def _cosines(runs: dict[str, list[dict]], n: int) -> dict:
    """Each model variant's least cosine against the reference: sentence-transformers'
    float32 embeddings where they ran, else the flagship's."""
    import numpy as np

    ref = next(
        (v for v in ("sentence_transformers", "pipeline_float32", "pipeline") if v in runs), None
    )
    if ref is None:
        return {}
    reference = ev.load_vectors(runs[ref][-1]["out"], n).astype(np.float64)
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    out = {"reference": ref}
    for v in (v for v in ev.MODEL_VARIANTS if v in runs and v != ref):
        got = ev.load_vectors(runs[v][-1]["out"], n).astype(np.float64)
        out[v] = float(np.min(np.sum(got * reference, axis=1) / np.linalg.norm(got, axis=1)))
    return out


def _print_table(report: dict) -> None:
    from bench._lib.machine import format_fingerprint

    print(
        f"\n{'variant':27} {'texts/s':>9} {'median s':>9} {'spread':>7} {'cold s':>7} "
        f"{'warm s':>7} {'process s':>9} {'MFU':>6}  device"
    )
    for v, r in report["variants"].items():
        cold, warm = (f"{r[k]:.2f}" if r.get(k) is not None else "-" for k in ("cold_s", "warm_s"))
        mfu = "-" if r.get("mfu") is None else f"{r['mfu']:.1%}"
        print(
            f"{v:27} {r['texts_per_s']:9.1f} {r['seconds_median']:9.2f} {r['spread']:7.0%} "
            f"{cold:>7} {warm:>7} {r['process_s_median']:9.2f} {mfu:>6}  {r['device']}"
        )
    matmuls = ", ".join(
        f"{v} {r['matmuls']}" for v, r in report["variants"].items() if r.get("matmuls")
    )
    print(
        f"{report['texts']} texts from {report['source']}, {report['tokens']} tokens (mean "
        f"{report['tokens'] / report['texts']:.1f}); {report['threads']} threads; medians of "
        f"{report['rounds']} rounds; matmuls (MFU against that dtype's peak): {matmuls or '-'}"
    )
    print(format_fingerprint(report["fingerprint"]))
    for name, ratio in report["ratios"].items():
        print(f"{name}: {ratio:.2f}x")
    for v, r in report["variants"].items():
        for line in r.get("roofline", {}).get("lines", []):
            print(f"roofline, {v}: {line}")
    cosines = report["min_cosine"]
    for v in (v for v in cosines if v != "reference"):
        print(f"min cosine, {v} vs {cosines['reference']}: {cosines[v]:.6f}")


def main(argv: list[str] | None = None) -> dict:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child:
        ev.child(*args.child)
        return {}
    if args.quick:
        args.texts, args.rounds, args.runs = args.texts or 300, 1, 1
    if args.model_dir:
        args.pipeline_args += f" --model_dir {shlex.quote(os.path.abspath(args.model_dir))}"
    if args.profile:
        from bench._lib import profile

        with tempfile.TemporaryDirectory(prefix="bench_profile_") as tmp:
            report = profile.run(args, write_data(Path(tmp), args), Path(tmp))
        harness.write_json(args.json, report)
        return report
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in ev.VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {ev.VARIANTS}")
    args.st_python = args.st_python or (
        sys.executable if _has_st(sys.executable) else DEFAULT_ST_PYTHON
    )
    if any(v in ev.ST_VARIANTS for v in variants) and not _has_st(args.st_python):
        print(f"note: {args.st_python} has no sentence-transformers; leaving out {ev.ST_VARIANTS}")
        variants = [v for v in variants if v not in ev.ST_VARIANTS]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_embed_") as tmp:
        work = Path(args.keep_outputs or tmp)
        work.mkdir(parents=True, exist_ok=True)
        data = write_data(work, args)
        print(
            f"{data['n']} texts from {data['source']}, {data['tokens']} tokens; "
            f"{args.threads} threads; {args.rounds} rounds of {', '.join(variants)}",
            flush=True,
        )

        def one(variant: str, round_: int) -> dict:
            r = _run(variant, data, args, work, round_)
            print(
                f"  round {round_ + 1} {variant}: {data['n'] / r['seconds']:,.1f} texts/s "
                f"({r['seconds']:.2f} s; process {r['process_s']:.1f} s) on {r['device']}",
                flush=True,
            )
            compared = variant in ev.MODEL_VARIANTS and round_ == args.rounds - 1
            if not args.keep_outputs and not compared:
                shutil.rmtree(r["out"], ignore_errors=True)
            return r

        runs, orders = harness.run_rounds(variants, args.rounds, one)
        cosines = _cosines(runs, data["n"])
    from bench._lib.machine import fingerprint

    machine = fingerprint()  # after the rounds: on an accelerator one process holds it
    rows = _summarize(runs, data["n"])
    for r in rows.values():
        peak = machine["peak_gflops"].get("bf16" if r.get("matmuls") == "bfloat16" else "fp32")
        model = bool(r.get("matmuls"))  # host_only and tokenize_only run no model
        r["mfu"] = data["flops"] / r["timed_s"] / (peak * 1e9) if model and peak else None
        if r.get("roofline") and peak and machine.get("memory_gbps"):
            r["roofline"]["lines"] = limit.report(
                r["roofline"], data["flops"], peak, machine["memory_gbps"]
            )
    ratios = {
        f"{a}_vs_{b}": rows[b]["timed_s"] / rows[a]["timed_s"]
        for a, b in PAIRS
        if a in rows and b in rows
    }
    report = {
        "texts": data["n"],
        "tokens": data["tokens"],
        "flops": data["flops"],
        "source": data["source"],
        "threads": args.threads,
        "rounds": args.rounds,
        "orders": orders,
        "variants": rows,
        "ratios": ratios,
        "min_cosine": cosines,
        "fingerprint": machine,
    }
    headline = [f"{v} {r['texts_per_s']:,.0f} texts/s on {r['device']}" for v, r in rows.items()]
    limits = [f"{k} {v:.2f}x" for k, v in ratios.items() if k.endswith("_vs_limit")]
    report["summary"] = "; ".join(headline + limits)  # the device check's key figure
    _print_table(report)
    print(f"total {time.perf_counter() - started:.0f} s")
    harness.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
