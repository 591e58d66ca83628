"""The curation job's flags (docs/curate.md, "Flags"), and Beam's for every pipeline run."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from beam_jax import jobs

DEFAULT_OUTPUT = "output/curate"
DEFAULT_CLASSES = 10
# With Adam at 0.05 the scores separate flipped labels best after 14-20 steps (bench/RESULTS.md).
DEFAULT_PASSES = 14
DEFAULT_LEARNING_RATE = 0.05
DEFAULT_FLIP_FRACTION = 0.1  # the built-in corpus only; a user's labels are kept as given
DEFAULT_NUM_BUCKETS = 6


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, PipelineOptions]:
    """Splits ``argv`` into the job's flags and Beam's ``PipelineOptions`` (``parse_job_args``)."""
    parser = argparse.ArgumentParser(
        prog=jobs.prog("pipelines.curate", "curate"),
        description="Train a small text classifier by full-batch passes (ReduceKernel), then "
        "score every record with GraNd and EL2N (RunKernel) to find mislabelled records.",
        epilog="Beam's flags (--runner, --direct_num_workers, --project, ...) pass through, "
        "for every pipeline run; any other flag is an error. See docs/curate.md.",
        formatter_class=jobs.DefaultsHelpFormatter,
    )
    add = parser.add_argument
    positive = jobs.positive_int
    add(
        "--input",
        help="Parquet or JSON lines with an id, a text and a label (a string) "
        "(--id_column, --text_column, --label_column); default: standard-library docstring "
        "passages labelled by their module",
    )
    add("--id_column", default="id", help="the input's id column (integers or strings)")
    add("--text_column", default="text", help="the input's text column")
    add("--label_column", default="label", help="the input's label column (strings)")
    add("--output", default=DEFAULT_OUTPUT, help="output directory; empty, or see --overwrite")
    add(
        "--overwrite",
        action="store_true",
        help="replace this job's earlier files in --output once this run succeeds (they are "
        "kept until then; other files are never touched); also discards another run's "
        "unfinished files there",
    )
    add(
        "--classes",
        type=positive,
        default=DEFAULT_CLASSES,
        help="without --input: how many modules (the largest) to keep as classes",
    )
    add(
        "--flip_fraction",
        type=float,
        help="each record's label is replaced by another class "
        "with this probability, decided by a seeded hash of its id, to measure how well the "
        f"scores find them (default: {DEFAULT_FLIP_FRACTION} on the built-in corpus; 0 with "
        "--input, whose labels are taken as they are unless this flag is given)",
    )
    add("--seed", type=int, default=0, help="seeds the flips and the init")
    add(
        "--passes",
        type=positive,
        default=DEFAULT_PASSES,
        help="full-batch training steps (one pipeline run each) before the scores are taken",
    )
    add(
        "--learning_rate",
        type=float,
        default=DEFAULT_LEARNING_RATE,
        help="Adam's learning rate for the full-batch steps",
    )
    add("--hash_bits", type=positive, default=10, help="2**bits embedding rows")
    add("--dim", type=positive, default=32, help="embedding width")
    add(
        "--buckets",
        type=jobs.int_list,
        help="token-length bucket boundaries; default: "
        f"planned from the records' lengths (--num_buckets, {DEFAULT_NUM_BUCKETS} by "
        "default)",
    )
    add(
        "--num_buckets",
        type=positive,
        default=DEFAULT_NUM_BUCKETS,
        help="without --buckets: how many token-length buckets to plan",
    )
    add("--batch_size", type=positive, default=64, help="largest padded batch per kernel call")
    add(
        "--batch_sizes", type=jobs.int_list, help="padded batch sizes allowed (default powers of 2)"
    )
    jobs.add_compilation_cache_flag(parser)
    jobs.add_flags(parser)
    args, options = jobs.parse_job_args(parser, argv)
    if args.flip_fraction is None:
        args.flip_fraction = DEFAULT_FLIP_FRACTION if args.input is None else 0.0
    if not 0 <= args.flip_fraction < 1:
        parser.error(f"--flip_fraction must be within [0, 1), got {args.flip_fraction}")
    if not args.learning_rate > 0:
        parser.error(f"--learning_rate must be positive, got {args.learning_rate}")
    if args.hash_bits > 24:
        parser.error(f"--hash_bits must be at most 24, got {args.hash_bits}")
    args.columns = (args.id_column, args.text_column, args.label_column)
    if len(set(args.columns)) < 3 or not all(args.columns):
        parser.error(
            "--id_column, --text_column and --label_column must be three different names, "
            f"got {args.columns}"
        )
    args.format = None if args.input is None else jobs.input_format(args.input)
    return args, options
