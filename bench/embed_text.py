"""Sentence embeddings per second: this pipeline against sentence-transformers and stock Beam.

    python bench/embed_text.py                   # 2,000 built-in texts, 3 rounds (~8 min)
    python bench/embed_text.py --quick           # 300 texts, 1 round (~1 min)
    python bench/embed_text.py --texts 4000 --json out.json
    python bench/embed_text.py --variants host_only,host_only_buckets --texts 100000

Three variants embed the same texts with all-MiniLM-L6-v2 on the same CPUs:

* ``pipeline``: ``pipelines.embed`` on the FnApiRunner, end to end: a Parquet file of
  ``id, text`` in, Parquet of ``id, embedding`` out. Timed from ``run()`` called to the job
  finished, so it includes Beam's start-up, reading, tokenizing, every compile and writing.
* ``sentence_transformers``: ``SentenceTransformer.encode(texts, batch_size=64)`` (it sorts
  by length and pads each batch to its longest text), in a separate interpreter that has
  torch (``--st-python``), on the CPU or on ``--st-device cuda``. Its ``seconds`` are
  ``encode`` alone after one warm-up batch (steady state); ``process_s`` is the whole
  process, as for every variant. ``sentence_transformers_bf16`` runs the same under
  ``torch.autocast(dtype=torch.bfloat16)``: the precision the flagship's ``--matmuls auto``
  takes on bfloat16 hardware. The flagship is set against it at matched precision:
  ``pipeline_float32`` against ``sentence_transformers``, ``pipeline`` against
  ``sentence_transformers_bf16`` (printed under "same precision").
* ``runinference``: the same JAX model under stock ``RunInference`` set up as a careful
  user would: texts tokenized first, Beam's own length buckets (``batch_length_fn`` and
  ``batch_bucket_boundaries`` at the pipeline's bucket boundaries, stateful batching),
  batches of exactly 64 (``min_batch_size=max_batch_size``) padded to 64 rows and to their
  bucket's length, so ``jax.jit`` compiles once per bucket, and JAX's persistent
  compilation cache. Same Parquet in and out as ``pipeline``.

``pipeline`` and ``runinference`` each get a compilation cache of their own, empty before
their first round: round 1 is their cold start, later rounds (median) their warm start, and
the ratios are given cold against cold and warm against warm.

Two more variants measure the host alone, the rate that decides whether an accelerator
would be fed: the whole pipeline (reading, tokenizing, batching, writing Parquet, dead
letters) with the encoder replaced by a trivial kernel of the same output shape (384
floats per text, computed from the token ids, so it takes no time):

* ``host_only``: ``pipelines.embed`` as it runs by default (``--batching auto``).
* ``host_only_buckets``: the same with ``--batching buckets`` (token-length buckets).

Each has a compilation cache of its own. The trivial kernel's output is the sum of the
text's token ids, repeated 384 times (``tests/test_bench.py`` checks every row of it).
For each, the CPU its run used (every thread, from ``run()`` called to the job finished)
is printed with how many cores that kept busy on average and how long the run would take
if that work kept every core busy throughout: the most that overlapping the host's steps
could gain without making them cheaper, also as a rate over ``tokenize_only``'s. Each
run's launch is timed too (from ``run()`` called to the job's first part handed to its
tokenizer: flags, model, plan, pipeline built, runner started, first part read), and the
rate of the rest of the run printed over ``tokenize_only``'s: how near the host runs to its
tokenizer once under way, as on a long job that pays its launch once; and its end, from the
last part tokenized to the job finished (the parts still to embed and write then).

Three more run ``host_only`` with one or both of its background steps taken away, to show
what each adds to the wall (the bundle's own Python, packing rows, dispatching batches and
gathering results, is what is left):

* ``host_only_pretokenized``: every part's token ids computed before the clock; the
  tokenize step's calls return them (``tokenizer_calls`` and ``pretokenized_misses``, the
  calls that found none and tokenized, are recorded).
* ``host_only_no_vectors``: each part's Parquet written with its ids only, not its
  embeddings (the writer's encoding of 384 floats per row taken away).
* ``host_only_neither``: both.

``host_only_*`` against ``tokenize_only`` is printed for each of them.

* ``tokenize_only``: the host's floor: the same Parquet read row group by row group and
  each row group's texts tokenized with the flagship's tokenizer call and settings
  (``Tokenizer.encode_arrow`` on the column: printable-ASCII texts with numpy, the others
  by the Rust tokenizer on all ``--threads`` cores; truncation at the model's window),
  nothing else. ``host_only / tokenize_only`` is printed when both ran.
* ``tokenize_only_rust``: ``tokenize_only`` with every text given to the Rust tokenizer
  (``encode_batch_fast``, the ids without offsets), the floor before printable ASCII was
  tokenized with numpy. ``host_only / tokenize_only_rust`` is printed when both ran.
* ``tokenize_in_beam``: the floor of any Beam job that reads and tokenizes this data: the
  flagship's own read and tokenize steps (``ReadParts``, ``TokenizeParts``) in a pipeline
  on the same runner, their rows and tokens counted, nothing else (no plan, kernel or
  writer). The model is loaded before the clock, as ``tokenize_only``'s tokenizer is; the
  pipeline is built and run on it, and its launch is timed as the host's is.
  ``tokenize_in_beam / tokenize_only`` and ``host_only / tokenize_in_beam`` are printed
  when they ran: what Beam's launch and bundles cost before the host does any of its own
  work, and how near the host comes to that.

* ``write_only``: the host's other floor, what the job writes, written alone: the same
  Parquet's ids read in the job's parts (runs of row groups up to ``--rows_per_part``
  rows), and each part's file written as the job writes it (``write.write_embeddings``:
  the job's schema, 384 float32 per row, staged and renamed), on one thread, nothing
  else. With ``host_only`` and ``tokenize_only``, ``host_only_vs_tokenize_then_write`` is
  printed: the host's rate over that of tokenizing and then writing, one after the other
  (``1 / (1/tokenize + 1/write)``, the serial bound the Arrow benchmark uses for reading
  and computing).

More run the flagship with its batching, its matmuls or its bundle threads chosen (side by
side with ``pipeline``, which lets the flagship choose), each with a compilation cache of
its own (round 1 cold):

* ``pipeline_packed``: ``--batching packed`` (several texts per row, a few row lengths).
* ``pipeline_buckets``: ``--batching buckets`` (each text padded to its length bucket).
* ``pipeline_float32``: ``--matmuls float32`` (where ``auto`` takes bfloat16's).
* ``pipeline_threads`` (and ``host_only_threads``): bundles in ``--threads`` threads of
  the one process (``--direct_num_workers``), as an accelerator worker's one SDK process
  runs them in its harness threads.

For every model variant the table gives the executed FLOPs per real token (``FLOP/tok``,
in MFLOP: attention included, at the lengths the kernel actually ran, padding and empty
rows included; per layer ``8h² + 4h·i`` for the dense parts and ``4·L·h`` for attention
at padded row length ``L``). The flagship's come from its per-bucket metrics
(``_metrics.json``), ``runinference``'s from its batches, sentence-transformers' from its
batching rule (texts sorted by length, batches of 64 padded to their longest).
``pipeline_packed / pipeline_buckets`` is printed cold against cold and warm against warm.

Their rate is texts/s over the whole run, Beam's start-up included; give them many texts
(``--texts 100000``) so the start-up weighs little.

Each variant runs in a fresh process pinned to the same ``--threads`` CPUs (CPU affinity,
torch's and the tokenizer's thread counts). The CPUs here may be shared with other work, so
the variants take turns over ``--rounds`` rounds (order rotated each round) and the table
shows each variant's median time; ``pipeline``'s embeddings are checked against
sentence-transformers' (cosine). ``MFU`` is the encoder's useful FLOPs (real tokens only)
over the whole run's time, divided by the machine's matmul peak (``bench/peak.py``) in the
dtype of the variant's dense matmuls: fp32, or bf16 (bfloat16 inputs, float32 sums) where
the flagship's ``--matmuls`` chose bfloat16, which the table's last lines name.

``--limit_json PATH`` sets ``pipeline`` against the chip's limit: the flagship's encoder
alone, as ``bench/encoder.py --flagship --json PATH`` measured it (its ``flagship_limit``'s
``texts_per_s``); ``pipeline``'s warm median rate (the rounds after the first) over it is
printed as ``pipeline vs encoder limit`` and kept as ``pipeline_vs_limit``.

The variants are ``bench/embed_variants.py`` (what the host-only ones put into the job's
process, ``bench/embed_host.py``), each run in a child process by ``bench/embed_runs.py``;
``bench/embed_report.py`` derives the figures, which this module prints.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import embed_report  # noqa: E402
import embed_runs  # noqa: E402
import harness  # noqa: E402
from embed_variants import (  # noqa: E402
    COMPARED,
    FLAGSHIPS,
    ST_VARIANTS,
    VARIANTS,
    child,
)

DEFAULT_ST_PYTHON = "/tmp/refvenv/bin/python"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=2000, help="texts (default 2,000)")
    parser.add_argument("--quick", action="store_true", help="300 texts, one round")
    parser.add_argument("--rounds", type=int, default=3, help="turns per variant (median)")
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="CPUs every variant is pinned to (default: all this process may use)",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--st-python",
        default=sys.executable if embed_runs.has_st(sys.executable) else DEFAULT_ST_PYTHON,
        help="a Python with sentence-transformers and torch (default: this one if it has "
        f"them, else {DEFAULT_ST_PYTHON})",
    )
    parser.add_argument(
        "--st-device",
        default="cpu",
        help="the torch device sentence-transformers runs on (default cpu; 'cuda' on a GPU, "
        "where the flagship runs on the accelerator JAX finds)",
    )
    parser.add_argument(
        "--pipeline-args",
        default="",
        help="extra flags for the pipeline variant, e.g. '--buckets 16,32,64,128,256'",
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--keep-outputs",
        help="write each run's output here (<variant>-<round>/) instead of a temp dir",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800,
        help="seconds per run; a run past it is stopped and its threads' stacks printed",
    )
    parser.add_argument(
        "--model_dir",
        help="a sentence-transformers model directory for every variant (the flagship's "
        "--model_dir, sentence-transformers' model); default the packaged all-MiniLM-L6-v2",
    )
    parser.add_argument(
        "--limit_json",
        help="the JSON of bench/encoder.py --flagship --json: print pipeline's warm rate "
        "over the encoder's limit (its flagship_limit's texts_per_s)",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.model_dir:
        os.environ["BEAM_JAX_BENCH_MODEL_DIR"] = os.path.abspath(args.model_dir)
        args.pipeline_args = f"{args.pipeline_args} --model_dir {shlex.quote(args.model_dir)}"
    if args.child:
        child(*args.child)
        return {}
    if args.quick:
        args.texts, args.rounds = 300, 1
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}; choose from {VARIANTS}")
    wanted_st = [v for v in variants if v in ST_VARIANTS]
    if wanted_st and not embed_runs.has_st(args.st_python):
        print(f"note: {args.st_python} has no sentence-transformers; skipping {wanted_st}")
        variants = [v for v in variants if v not in ST_VARIANTS]
    limit = embed_report.read_limit(args.limit_json) if args.limit_json else None

    started = time.perf_counter()
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="bench_embed_text_") as tmp:
        tmp = Path(args.keep_outputs or tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        data = embed_runs.write_data(tmp, args.texts)
        print(
            f"data: {data['n']} built-in texts, {data['tokens']} tokens after truncation "
            f"(mean {data['tokens'] / data['n']:.1f}); {args.threads} threads; "
            f"{args.rounds} rounds",
            flush=True,
        )
        for round_ in range(args.rounds):
            for variant in harness.rotated(variants, round_):
                r = embed_runs.run(variant, data, args, tmp, round_)
                runs[variant].append(r)
                if not args.keep_outputs:
                    embed_runs.drop_outputs(runs[variant], compared=variant in COMPARED)
                print(
                    f"  round {round_ + 1} {variant}: {data['n'] / r['seconds']:.1f} "
                    f"sentences/s ({r['seconds']:.1f} s)",
                    flush=True,
                )
        cosine = None
        if "pipeline" in runs and "sentence_transformers" in runs:
            cosine = embed_report.min_cosine(
                runs["pipeline"][-1]["out"],
                str(Path(runs["sentence_transformers"][-1]["out"]) / "vectors.npy"),
            )
        cosines = embed_report.flagship_cosines(runs)

    results = embed_report.medians(runs, data["n"])
    ratios, ratios_best = embed_report.ratios(results)
    from fingerprint import fingerprint

    machine = fingerprint()
    for variant, r in results.items():
        embed_report.flop_fields(variant, r, data, machine["peak_gflops"])
    cold_warm = embed_report.cold_warm(runs, results)
    report = {
        "texts": data["n"],
        "tokens": data["tokens"],
        "threads": args.threads,
        "rounds": args.rounds,
        "variants": results,
        "ratios": ratios,
        "same_precision": embed_report.same_precision_ratios(results),
        "ratios_best": ratios_best,
        "cold_warm": cold_warm,
        "cpu_bounds": embed_report.cpu_bounds(results, args.threads),
        "after_launch": embed_report.after_launch(results, data["n"]),
        "pipeline_vs_limit": (
            embed_report.pipeline_vs_limit(limit, data["n"], cold_warm)
            if limit is not None and "pipeline" in results
            else None
        ),
        "pipeline_runs": runs.get("pipeline", []),
        "load_average": os.getloadavg(),
        "min_cosine_pipeline_vs_sentence_transformers": cosine,
        "min_cosine_vs_sentence_transformers": cosines,
        "fingerprint": machine,
    }
    _print_table(report, data)
    _print_host(report, runs)
    _print_cold_warm(report, runs)
    _print_against(report, limit)
    print(
        f"total {time.perf_counter() - started:.0f} s; load average now "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (other work on the machine)"
    )
    harness.write_json(args.json, report)
    return report


# ---- printing ----------------------------------------------------------------------------


def _print_table(report: dict, data: dict) -> None:
    """One row per variant, the FLOPs and machine under it, then the ratios."""
    from fingerprint import format_fingerprint

    results = report["variants"]
    print()
    print(
        f"{'variant':22} {'sentences/s':>11} {'median s':>9} {'spread':>7} {'CPU s':>7} "
        f"{'MFU %':>6} {'FLOP/tok':>8} {'compiles':>11} {'padding':>7}  runs (s)"
    )
    for variant, r in results.items():
        compiles = r.get("compiles", "-")
        if "compile_seconds" in r:
            compiles = f"{compiles} ({r['compile_seconds']:.1f}s)"
        padding = f"{r['padding_ratio']:.2f}" if "padding_ratio" in r else "-"
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}"
        executed = r.get("flops_per_real_token")
        executed = "-" if executed is None else f"{executed / 1e6:.1f}"
        print(
            f"{variant:22} {r['sentences_per_s']:11.1f} {r['seconds_median']:9.1f} "
            f"{100 * r['spread']:6.0f}% {r['cpu_s_median']:7.1f} {mfu:>6} {executed:>8} "
            f"{compiles:>11} {padding:>7}  {r['seconds_all']}"
        )
    useful = data["flops"] / data["tokens"] / 1e6
    print(
        f"FLOP/tok: executed MFLOP per real token (useful: {useful:.1f}, real tokens only, "
        "attention over each text's own length)"
    )
    print(f"medians of {report['rounds']} rounds each; {format_fingerprint(report['fingerprint'])}")
    matmuls = {v: r["matmuls"] for v, r in results.items() if r.get("matmuls")}
    if matmuls:
        print(
            "dense matmuls (MFU against that dtype's peak): "
            + ", ".join(f"{v} {m}" for v, m in matmuls.items())
        )
    for name, value in report["ratios"].items():
        print(f"{name}: {value:.2f}x (medians), {report['ratios_best'][name]:.2f}x (best runs)")


def _print_host(report: dict, runs: dict) -> None:
    """The host's CPU and launch bounds, and the garbage collector's passes."""
    for variant, bound in report["cpu_bounds"].items():
        print(
            f"{variant}: {bound['run_cpu_s']:.2f} CPU s during the run, {bound['cores_busy']:.2f} "
            f"of {report['threads']} cores busy on average; with every core busy throughout it "
            f"would take {bound['all_cores_s']:.2f} s"
            + (
                f", {bound['vs_tokenize_only']:.2f}x tokenize_only"
                if "vs_tokenize_only" in bound
                else ""
            )
        )
    for variant, after in report["after_launch"].items():
        print(
            f"{variant}: launch (the clock started to the first part tokenized) "
            f"{after['launch_s']:.2f} s, {100 * after['launch_share']:.0f}% of the run; "
            f"after it {after['sentences_per_s']:.0f} sentences/s"
            + (
                f", {after['vs_tokenize_only']:.2f}x tokenize_only"
                if "vs_tokenize_only" in after
                else ""
            )
            + (
                f"; from the last part tokenized to the end {after['end_s']:.2f} s"
                if after.get("end_s") is not None
                else ""
            )
            + (
                f"; from the process started to the first part tokenized "
                f"{after['process_launch_s']:.2f} s"
                if after.get("process_launch_s") is not None
                else ""
            )
        )
    for variant, rs in runs.items():
        if all("gc_full_passes" in r for r in rs):
            print(
                f"{variant}: garbage collector during the run (per round): "
                + ", ".join(
                    f"{r['gc_full_passes']} full passes {r['gc_full_s']:.3f} s, "
                    f"younger {r['gc_young_s']:.3f} s"
                    for r in rs
                )
            )


def _print_cold_warm(report: dict, runs: dict) -> None:
    """Each flagship round's compiles; cold and warm, each and against one another."""
    for variant, i, r in ((v, i, r) for v in FLAGSHIPS for i, r in enumerate(runs.get(v, []))):
        if "compile_wait_seconds" in r:
            print(f"{variant} round {i + 1}: {r['compiles']} compiles, "
                  f"{r['compile_seconds']:.1f} s compiling, {r['compile_wait_seconds']:.2f} s of "
                  f"it on the critical path "
                  f"(waited for), {max(0.0, r['compile_seconds'] - r['compile_wait_seconds']):.1f}"
                  f" s overlapped; padding {r['padding_ratio']:.3f}; results waited for "
                  f"{r.get('result_wait_seconds', float('nan')):.2f} s")  # fmt: skip
    cold_warm = report["cold_warm"]
    for variant in (*FLAGSHIPS, "runinference"):
        if f"{variant}_cold_s" not in cold_warm:
            continue
        entries = runs[variant][0]["cache_entries_before"]
        first = (
            "an empty compilation cache"
            if entries == 0
            else f"a compilation cache already holding {entries} files"
        )
        print(
            f"{variant}: {cold_warm[f'{variant}_cold_s']:.1f} s with {first} (round 1), "
            f"{cold_warm[f'{variant}_warm_s']:.1f} s with it warm (later rounds, median)"
        )
    for name in (k.removesuffix("_cold") for k in cold_warm if k.endswith("_cold")):
        print(
            f"{name}: {cold_warm[f'{name}_cold']:.2f}x cold, {cold_warm[f'{name}_warm']:.2f}x warm"
        )


def _print_against(report: dict, limit: dict | None) -> None:
    """The flagship at the same precision as sentence-transformers, against the encoder's
    limit, and the cosines."""
    for name, r in report["same_precision"].items():
        ours, theirs = name.split("_vs_")
        print(
            f"same precision ({r['precision']}): {ours} {r['process']:.2f}x {theirs} as "
            f"whole processes, {r['steady']:.2f}x steady"
        )
    if limit is not None and "pipeline" in report["variants"]:
        print(limit_line(report["pipeline_vs_limit"], limit, report["texts"]))
    cosine = report["min_cosine_pipeline_vs_sentence_transformers"]
    if cosine is not None:
        print(f"min cosine, pipeline vs sentence-transformers: {cosine:.6f}")
    for variant, value in report["min_cosine_vs_sentence_transformers"].items():
        if variant != "pipeline":
            print(f"min cosine, {variant} vs sentence-transformers: {value:.6f}")


def limit_line(ratio: float | None, limit: dict, texts: int) -> str:
    """The line that sets ``pipeline`` against the encoder's limit (``pipeline_vs_limit``)."""
    if ratio is None:
        return "pipeline vs encoder limit: no warm round (needs --rounds 2 or more)"
    line = f"pipeline vs encoder limit: {ratio:.2f}x (warm median)"
    if limit.get("texts") not in (None, texts):
        line += f"; the limit was measured on {limit['texts']} texts, pipeline on {texts}"
    return line


if __name__ == "__main__":
    main()
