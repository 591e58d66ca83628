"""The flags of ``python -m pipelines.embed`` (docs/embed_text.md); every other flag must be
one of Beam's, checked by :func:`beam_jax.jobs.parse_job_args`.

Example:
    >>> args, options = parse_args(["--output", "out/", "--threshold", "0.01"])
    >>> args.threshold, options.view_as(StandardOptions).runner
    (0.01, 'FnApiRunner')
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions  # noqa: F401

from beam_jax import jobs, text

# Token-length buckets up to the model's 256-token window (docs/embed_text.md); the
# launch-time planner's costs: one MiniLM shape compiles in the time 2 cores embed ~2,000 tokens.
DEFAULT_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256)
DEFAULT_COMPILE_BUDGET = 24
DEFAULT_PLAN_SAMPLE = 10_000
DEFAULT_SHAPE_COST = 2000.0
# Rows x padded tokens per batch, on every device: the host's work is paid per call, so
# fewer, larger calls feed the model faster, and a CPU runs a batch in cache-sized chunks
# (bench/RESULTS.md, "32k-token batches on every device"); an accelerator runs it whole.
DEFAULT_BATCH_SIZE = 1024
DEFAULT_MAX_TOKENS = 32768
# On a CPU the model runs each batch in chunks of this many padded tokens inside the one call
# (2k-token chunks ran ~8% slower, 4k ~20%); an accelerator runs batches whole.
DEFAULT_TOKENS_PER_CHUNK = 1024
# Rows per output part (~12 MB of embeddings): the most a crash makes a rerun redo.
DEFAULT_ROWS_PER_PART = 8192
DEFAULT_OUTPUT = "output/embed_text"


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def _buckets(text: str) -> str | tuple[int, ...]:
    return "auto" if text.strip() == "auto" else jobs.int_list(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=jobs.prog("pipelines.embed", "embed"),
        formatter_class=jobs.DefaultsHelpFormatter,
        description="Embed the 'text' of every row with a sentence-transformers model (JAX); "
        "write 'id' and 'embedding' to Parquet and failed rows to OUTPUT/_failed/*.jsonl.",
        epilog="Beam's flags (--runner, --project, --region, --temp_location, ...) pass "
        "through; any other flag is an error. See docs/embed_text.md.",
    )
    add = parser.add_argument
    add(
        "--input",
        help="Parquet or JSON lines file or glob (.parquet, .jsonl, .json, .ndjson, "
        "compressed too); default: the built-in corpus",
    )
    add("--output", default=DEFAULT_OUTPUT, help="output directory; empty, or see --overwrite")
    add(
        "--overwrite",
        action="store_true",
        help="replace this job's earlier output once this run succeeds",
    )
    add(
        "--threshold",
        type=jobs.ratio,
        default=1.0,
        help="the largest tolerated ratio of dead letters to rows (and of unreadable files to "
        "files) (default 1: never fail)",
    )
    add(
        "--rows_per_part",
        type=jobs.positive_int,
        default=DEFAULT_ROWS_PER_PART,
        help="rows per output part (a rerun does not redo finished parts)",
    )
    add(
        "--builtin_texts",
        type=jobs.positive_int,
        help="without --input: the first N built-in texts (default: all of them)",
    )
    add(
        "--buckets",
        type=_buckets,
        default="auto",
        help="token-length bucket boundaries ending between the model's max_seq_length and its "
        "position table (256 and 512 for MiniLM; e.g. "
        f"{','.join(map(str, DEFAULT_BUCKETS))}); 'auto' (default) plans them at launch",
    )
    add(
        "--compile_budget",
        type=jobs.positive_int,
        default=DEFAULT_COMPILE_BUDGET,
        help="--buckets auto: the most compiled shapes",
    )
    add(
        "--plan_sample",
        type=jobs.positive_int,
        default=DEFAULT_PLAN_SAMPLE,
        help="--buckets auto: texts tokenized at launch to plan",
    )
    add(
        "--shape_cost",
        type=jobs.non_negative,
        default=DEFAULT_SHAPE_COST,
        help="--buckets auto: one more compiled shape's cost in padded tokens",
    )
    add(
        "--batch_size",
        type=jobs.positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="the largest padded batch of texts (or packed rows) per kernel call",
    )
    add(
        "--max_tokens_per_batch",
        type=jobs.positive_int,
        default=DEFAULT_MAX_TOKENS,
        help="cap on batch rows x bucket length",
    )
    add(
        "--tokens_per_chunk",
        type=_non_negative_int,
        help="the most padded tokens the model runs at once: a larger batch runs as chunks "
        f"of this size inside one kernel call; 0: each batch whole (default: "
        f"{DEFAULT_TOKENS_PER_CHUNK} on CPU workers, 0 on an accelerator: --accelerator, or a "
        "local run on a machine where JAX finds a GPU or TPU)",
    )
    add(
        "--batch_sizes",
        type=jobs.int_list,
        help="the padded batch sizes allowed, e.g. 8,64 (default: powers of two up to "
        "--batch_size)",
    )
    add(
        "--batching",
        choices=("auto", "packed", "buckets"),
        default="auto",
        help="pad texts to length buckets, pack several short texts per row, or (auto, "
        "the default) choose at launch by predicted FLOPs per real token",
    )
    add("--id_column", default="id", help="the input's id column; the output names it 'id'")
    add("--text_column", default="text", help="the input's text column")
    add(
        "--keep_columns",
        type=lambda text: tuple(c.strip() for c in text.split(",") if c.strip()),
        default=(),
        help="input columns to carry through to the output beside each embedding, with their "
        "types, e.g. url,title (default: none)",
    )
    add(
        "--id_type",
        choices=("auto", "int", "string"),
        default="auto",
        help="the ids' type: 'auto' (default) takes the Parquet id column's, or the first "
        "JSON line's id's; with 'int' or 'string', JSON lines' ids are read as that type (a "
        "line whose id is not is a dead letter), and a Parquet id column must be of it",
    )
    add(
        "--model_dir",
        help="a sentence-transformers model directory (local or e.g. gs://); "
        "default: the packaged all-MiniLM-L6-v2",
    )
    add(
        "--matmuls",
        choices=text.MATMULS,
        default="auto",
        help="the encoder's dense matmuls: float32; bfloat16 (inputs rounded to bfloat16, "
        "sums in float32: cosine >= 0.99997 with float32 on MiniLM); or auto (default): "
        "bfloat16 where the workers' device has bfloat16 matrix units (Intel AMX, AMD "
        "AVX-512 bfloat16, NVIDIA compute capability >= 8.0, TPU), decided at launch for "
        "local runners",
    )
    add(
        "--layer_kernel",
        choices=text.LAYER_KERNELS,
        default="auto",
        help="how each encoder layer runs: xla, as XLA's ops; pallas, as one Pallas kernel "
        "keeping the layer's activations on the chip (TPU); auto (default): pallas on a "
        "TPU, xla elsewhere",
    )
    add(
        "--model_manifest",
        help="a manifest (tools/make_minilm_manifest.py --out) that the "
        "--model_dir files must match, checked at launch and on each worker",
    )
    jobs.add_compilation_cache_flag(parser)
    add(
        "--accelerator",
        help="a Beam resource hint for the embedding step only, e.g. "
        "'type:nvidia-l4;count:1;install-nvidia-driver' (default: none)",
    )
    jobs.add_flags(parser)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, PipelineOptions]:
    """Splits ``argv`` into this job's flags and Beam's ``PipelineOptions`` (the runner
    defaults to the in-process FnApiRunner; Beam's flags pass through unchanged).

    Raises:
        SystemExit: On a flag that neither this job nor Beam knows, or a bad value (after
            printing the usage and the reason, as argparse does).
    """
    parser = _parser()
    args, options = jobs.parse_job_args(parser, argv)
    if not args.id_column or not args.text_column or args.id_column == args.text_column:
        parser.error(
            f"--id_column and --text_column must be two different names, got "
            f"{args.id_column!r} and {args.text_column!r}"
        )
    if args.keep_columns and (args.input is None or args.id_column in args.keep_columns):
        parser.error(
            f"--keep_columns carries an --input's columns other than its ids (the output's "
            f"'id'), got {','.join(args.keep_columns)} with --input {args.input}"
        )
    if args.buckets != "auto":
        problem = buckets_problem(args.buckets, args.model_dir, args.model_manifest)
        if problem:
            parser.error(problem)
    # The default that depends on the device: cache-sized chunks help CPUs, not accelerators.
    args.on_accelerator = jobs.accelerator_workers(args.accelerator, options)  # their device
    if args.tokens_per_chunk is None:
        args.tokens_per_chunk = 0 if args.on_accelerator else DEFAULT_TOKENS_PER_CHUNK
    return args, options


def buckets_problem(
    buckets: Sequence[int], model_dir: str | None = None, manifest: str | None = None
) -> str | None:
    """Why this job refuses ``--buckets BUCKETS`` for the model in ``model_dir`` (``None``:
    the packaged all-MiniLM-L6-v2), or ``None`` when it takes them: the last boundary must
    lie in the model's ``SentenceEncoder.last_boundary_range``. ``beam-jax plan`` asks the
    same question before it prints a ``--buckets`` line for this job."""
    low, high = text.SentenceEncoder.from_dir(model_dir, manifest=manifest).last_boundary_range
    if low <= max(buckets) <= high:
        return None
    return (
        f"--buckets must end between {low} (the model's max_seq_length: the longest text "
        f"after truncation) and {high} (the model's position table), got "
        f"{','.join(map(str, buckets))}; plan them in token counts with beam-jax plan "
        "--tokenizer minilm (or the --model_dir directory), or leave --buckets auto"
    )
