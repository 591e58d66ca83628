"""``beam-jax plan``: the best bucket boundaries of a column for each compile budget, and
beside them the packed plans (``beam_jax.plan_packing``) for budgets up to 4.

For budgets 1..K, :func:`plan_budgets` runs the library's planner
(``beam_jax.plan_boundaries``, an exact dynamic programme) on the column's lengths and
measures the padding each plan gives. The text table, ``--json`` and ``--plot`` are views
of the same :class:`BucketsForBudget` list. Per-bucket columns come from
:data:`BUCKET_COLUMNS`: each is a function ``(lengths in the bucket, boundary) -> value``, so
a further column (e.g. the memory a bucket's batch needs) is one more entry.

Example:
    >>> plans = plan_budgets(np.array([3, 4, 8, 8, 30]), max_buckets=2)
    >>> [(p.num_buckets, p.boundaries) for p in plans]
    [(1, (30,)), (2, (8, 30))]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from beam_jax._src.arrow.texts import is_text_type
from beam_jax._src.bucketing.boundaries import boundaries_per_budget
from beam_jax._src.bucketing.packing_choice import plan_packing
from beam_jax._src.bucketing.rule import boundary_index
from beam_jax._src.cli import lengths as lens
from beam_jax._src.cli import memory as mem
from beam_jax._src.cli.table import format_table

__all__ = [
    "BUCKET_COLUMNS",
    "BucketsForBudget",
    "PackingForBudget",
    "add_parser",
    "main",
    "plan_budgets",
    "plan_packings",
    "plot_plan",
]

MAX_PACKED_BUDGET = 4  # packing needs few shapes; more rarely lowers padding further

# Per-bucket columns: name -> f(lengths of the bucket's elements, the boundary) -> number.
BUCKET_COLUMNS: dict[str, Callable[[np.ndarray, int], float]] = {
    "elements": lambda x, b: int(len(x)),
    "longest": lambda x, b: int(x.max()) if len(x) else 0,
    "padding": lambda x, b: float(b * len(x) / max(int(x.sum()), 1)) if len(x) else float("nan"),
}


@dataclasses.dataclass(frozen=True)
class BucketsForBudget:
    """The best boundaries for one budget, and what they give.

    Attributes:
        num_buckets: The budget (the plan may use fewer when there are fewer lengths).
        boundaries: The boundaries.
        padding_ratio: Padded over real length of the column (batch rows excluded).
        buckets: One dict per boundary: ``boundary`` and the :data:`BUCKET_COLUMNS`.
    """

    num_buckets: int
    boundaries: tuple[int, ...]
    padding_ratio: float
    buckets: tuple[dict[str, Any], ...]


def plan_budgets(
    lengths: np.ndarray, max_buckets: int = 8, max_size: int | None = None
) -> list[BucketsForBudget]:
    """A :class:`BucketsForBudget` for each budget 1..``max_buckets``.

    Args:
        lengths: The column's lengths (non-negative ints).
        max_buckets: The largest budget.
        max_size: If given, the last boundary is exactly this; longer elements count as it.
    """
    lengths = np.maximum(np.asarray(lengths, np.int64), 1)
    if max_size is not None:
        lengths = np.minimum(lengths, max_size)
    plans = []
    per_budget = boundaries_per_budget(lengths, max_buckets, max_size=max_size)
    for k, bounds in enumerate(per_budget, start=1):
        index = np.minimum(boundary_index(np.asarray(bounds), lengths), len(bounds) - 1)
        padded = int(np.asarray(bounds, np.int64)[index].sum())
        buckets = []
        for i, b in enumerate(bounds):
            inside = lengths[index == i]
            row: dict[str, Any] = {"boundary": int(b)}
            row.update({name: f(inside, int(b)) for name, f in BUCKET_COLUMNS.items()})
            buckets.append(row)
        ratio = padded / int(lengths.sum())
        plans.append(BucketsForBudget(k, tuple(bounds), ratio, tuple(buckets)))
    return plans


@dataclasses.dataclass(frozen=True)
class PackingForBudget:
    """The packed plan for one compile budget (``plan_packing`` on the column).

    Attributes:
        compile_budget: The budget.
        shapes: The compiled ``(row length, rows per batch)`` pairs.
        padding_ratio: Padded over real slots, empty slots and empty rows counted.
        max_segments: Records per row at most.
        buffer_size: Records packed together in the prediction.
    """

    compile_budget: int
    shapes: tuple[tuple[int, int], ...]
    padding_ratio: float
    max_segments: int
    buffer_size: int | None


def plan_packings(
    lengths: np.ndarray,
    max_budget: int = MAX_PACKED_BUDGET,
    max_size: int | None = None,
    buffer_size: int | None = 1024,
    max_rows_per_batch: int = 64,
) -> list[PackingForBudget]:
    """A :class:`PackingForBudget` for each budget 1..``max_budget``.

    Example:
        >>> [p.shapes for p in plan_packings(np.array([3, 4, 8, 8, 30] * 8), 1, 32)]
        [((32, 14),)]
    """
    lengths = np.maximum(np.asarray(lengths, np.int64), 1)
    top = int(max_size if max_size is not None else lengths.max())
    out = []
    for k in range(1, max_budget + 1):
        chosen = plan_packing(
            np.minimum(lengths, top),
            max_size=top,
            compile_budget=k,
            buffer_size=buffer_size,
            max_rows_per_batch=max_rows_per_batch,
            # The table lists shapes alone: one length class keeps each row reproducible
            # as Packing(row_lengths=..., rows_per_batch=...).
            length_classes=False,
        )
        out.append(
            PackingForBudget(
                k,
                tuple((int(n), int(s)) for n, s in chosen.packing.shapes()),
                float(chosen.padding_ratio),
                int(chosen.packing.max_segments),
                buffer_size,
            )
        )
    return out


def _summary(lengths: np.ndarray) -> dict[str, Any]:
    q = np.percentile(lengths, [50, 90, 99]) if len(lengths) else [0, 0, 0]
    return {
        "rows": int(len(lengths)),
        "min": int(lengths.min()),
        "mean": float(lengths.mean()),
        "p50": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
        "max": int(lengths.max()),
    }


EMBED = "beam-jax embed, python -m pipelines.embed"


def sentence_encoder(tokenizer: str | None) -> Any:
    """The ``SentenceEncoder`` whose tokenizer ``--tokenizer`` names (``minilm`` or a model
    directory), else ``None``: only its token counts are what ``beam-jax embed`` buckets."""
    if tokenizer != "minilm" and not (tokenizer and os.path.isdir(tokenizer)):
        return None
    from beam_jax._src.text.sentence_encoder import SentenceEncoder

    return SentenceEncoder.from_dir(None if tokenizer == "minilm" else tokenizer)


def paste_lines(
    boundaries: Sequence[int],
    axis: str = "L",
    *,
    encoder: Any = None,
    model_dir: str | None = None,
) -> dict[str, str | None]:
    """What to paste to use ``boundaries``: a ``Bucketing``, and the flags of
    ``beam-jax embed`` when it takes them, else why it does not.

    The job buckets token counts of its model's tokenizer and takes a last boundary in the
    model's ``last_boundary_range``; a plan of other lengths (characters, list lengths) or
    ending elsewhere gets no flag line, never one the job refuses.

    Args:
        encoder: The ``SentenceEncoder`` whose token counts the lengths are, if they are.
        model_dir: Its directory (``None``: the packaged model), named in the flag line.

    Returns:
        ``python``: a ``Bucketing``; ``flag``: embed's flags or ``None``; ``no_flag``: why
        there is no flag line, or ``None``.
    """
    bounds = tuple(int(b) for b in boundaries)
    out: dict[str, str | None] = {
        "python": f'bj.Bucketing(boundaries={{"{axis}": {bounds!r}}})',
        "flag": None,
        "no_flag": None,
    }
    if encoder is None:
        out["no_flag"] = (
            "its --buckets are token counts of the model's tokenizer; plan a text column "
            "with --tokenizer minilm (or the model directory) for a line to paste"
        )
        return out
    low, high = encoder.last_boundary_range
    if not low <= bounds[-1] <= high:
        out["no_flag"] = (
            f"its --buckets must end between {low} (the model's max_seq_length) and {high} "
            f"(its position table); this plan ends at {bounds[-1]} (leave --max_size unset "
            "or set it in that range)"
        )
        return out
    flag = f"--buckets {','.join(map(str, bounds))}"
    out["flag"] = flag if model_dir is None else f"{flag} --model_dir {model_dir}"
    return out


def _over_max_size(lengths: np.ndarray, max_size: int | None) -> int:
    return 0 if max_size is None else int((np.asarray(lengths) > max_size).sum())


def plot_plan(
    lengths: np.ndarray, plans: Sequence[BucketsForBudget], path: str, *, title: str = ""
):
    """Draws the length histogram with the largest budget's boundaries (one dashed line
    each), and padding versus number of buckets; saves a PNG to ``path``.

    Returns:
        The matplotlib ``Figure`` (axes 0: histogram, axes 1: the padding curve).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    hist, curve = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    chosen = plans[-1]
    top = max(int(lengths.max()), chosen.boundaries[-1])
    hist.hist(lengths, bins=min(100, max(10, top)), range=(0, top + 1), color="#4c72b0")
    for b in chosen.boundaries:
        hist.axvline(b, color="#c44e52", linestyle="--", linewidth=1)
    hist.set_xlabel("length")
    hist.set_ylabel("elements")
    hist.set_title(
        f"{len(lengths):,} lengths; {len(chosen.boundaries)} boundaries "
        f"(padding {chosen.padding_ratio:.2f}x)"
    )
    ks = [p.num_buckets for p in plans]
    curve.plot(ks, [p.padding_ratio for p in plans], marker="o", color="#c44e52")
    curve.set_xlabel("buckets (compiled shapes per batch size)")
    curve.set_ylabel("padded / real length")
    curve.set_xticks(ks)
    curve.set_title("padding versus buckets")
    curve.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=100)
    return fig


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan",
        allow_abbrev=False,
        epilog="Every flag takes either spelling: --a_b or --a-b.",
        help="best bucket boundaries of a column for each compile budget",
        description="Read one column of Parquet or JSON-lines files, and print for each "
        "budget 1..K the bucket boundaries that minimise padding and the padding ratio they "
        "give (padded / real length); optionally draw them.",
    )
    add = parser.add_argument
    add("--input", required=True, help="a Parquet or JSON-lines file, glob or directory")
    add("--column", required=True, help="the column to measure")
    add("--max_buckets", type=int, default=8, help="the largest budget K (default 8)")
    add(
        "--max_size",
        type=int,
        help="the last boundary, e.g. the model's longest input; longer values are counted "
        "as it, and the plan says how many there are (they would be dead letters unless "
        "truncated) (default: with --tokenizer minilm or a model directory, the model's "
        "max_seq_length, which beam-jax embed's --buckets must reach; else none: the "
        "longest value)",
    )
    add(
        "--measure",
        choices=lens.MEASURES,
        default="auto",
        help="list lengths, string chars or bytes, or token counts (auto: lists' lengths, "
        "strings' tokens with --tokenizer, else chars)",
    )
    add(
        "--tokenizer",
        help="'minilm' (the packaged all-MiniLM-L6-v2's, truncated as it embeds), a "
        "sentence-transformers model directory (likewise), a tokenizer.json file (no "
        "truncation), a registered name or 'module:attr' (a zero-argument callable returning "
        "texts -> token counts; default: none)",
    )
    add(
        "--pack_buffer",
        type=int,
        default=1024,
        help="records packed together in the packed plans' prediction (default 1024)",
    )
    add(
        "--plot",
        metavar="PNG",
        help="draw the histogram, boundaries and padding curve (default: no plot)",
    )
    add("--json", action="store_true", help="print JSON instead of tables (default: tables)")
    mem.add_arguments(parser)
    parser.set_defaults(main=main)
    return parser


def _measures_tokens(args: argparse.Namespace, column: Any) -> bool:
    """Whether the lengths are the tokenizer's counts (``--measure`` tokens, or auto on a
    string column with ``--tokenizer``)."""
    text = is_text_type(column.type)
    return args.measure == "tokens" or (args.measure == "auto" and text and bool(args.tokenizer))


def main(args: argparse.Namespace) -> int:
    if args.max_buckets < 1:
        sys.exit(f"beam-jax plan: --max_buckets must be >= 1, got {args.max_buckets}")
    try:
        column, skipped = lens.read_column(args.input, args.column)
        lengths = lens.column_lengths(column, args.measure, args.tokenizer)
    except (FileNotFoundError, KeyError, ValueError) as e:
        sys.exit(f"beam-jax plan: {e.args[0] if isinstance(e, KeyError) else e}")
    if skipped.lines or skipped.files_cut:
        print(
            f"warning: {skipped}; the plan measures the other rows, which the jobs embed "
            "(they make each line skipped a dead letter)",
            file=sys.stderr,
        )
    if len(lengths) == 0:
        sys.exit(f"beam-jax plan: column {args.column!r} of {args.input} has no non-null values")
    if args.max_size is not None and args.max_size < 1:
        sys.exit(f"beam-jax plan: --max_size must be >= 1, got {args.max_size}")
    # Token counts of a sentence encoder: a plan the job can use ends at its max length.
    encoder = sentence_encoder(args.tokenizer) if _measures_tokens(args, column) else None
    if encoder is not None and args.max_size is None:
        args.max_size = encoder.max_length
    plans = plan_budgets(lengths, args.max_buckets, args.max_size)
    if args.pack_buffer < 1:
        sys.exit(f"beam-jax plan: --pack_buffer must be >= 1, got {args.pack_buffer}")
    packed = plan_packings(
        lengths, min(args.max_buckets, MAX_PACKED_BUDGET), args.max_size, args.pack_buffer
    )
    over = _over_max_size(lengths, args.max_size)
    model_dir = None if encoder is None or args.tokenizer == "minilm" else args.tokenizer
    paste = paste_lines(plans[-1].boundaries, encoder=encoder, model_dir=model_dir)
    if args.plot:
        plot_plan(lengths, plans, args.plot, title=f"{args.input} : {args.column}")
    memory = mem.analyse(args, plans)
    if args.json:
        out = {
            "input": args.input,
            "column": args.column,
            "lengths": _summary(lengths),
            "plans": [dataclasses.asdict(p) for p in plans],
            "packing": [dataclasses.asdict(p) for p in packed],
            "over_max_size": over,
            "paste": paste,
            "skipped": {"lines": skipped.lines, "first": skipped.first,
                        "files_cut": list(skipped.files_cut)},
        }  # fmt: skip
        if memory is not None:
            out["memory"] = memory
        print(json.dumps(out, indent=1))
        return 0
    s = _summary(lengths)
    print(
        f"{args.column}: {s['rows']:,} values, length min {s['min']}, median {s['p50']:.0f}, "
        f"p90 {s['p90']:.0f}, p99 {s['p99']:.0f}, max {s['max']}"
    )
    print()
    print(format_table([
        {"buckets": p.num_buckets, "padding": p.padding_ratio,
         "boundaries": ",".join(map(str, p.boundaries))}
        for p in plans
    ]))  # fmt: skip
    print()
    print(f"per bucket, with {plans[-1].num_buckets} buckets:")
    print(format_table(plans[-1].buckets))
    print()
    print(
        f"packed (records end to end in rows, {args.pack_buffer} records packed together; "
        "padding counts empty slots and empty rows):"
    )
    print(format_table([
        {"shapes": len(p.shapes), "padding": p.padding_ratio,
         "row length x rows": ",".join(f"{n}x{s}" for n, s in p.shapes),
         "max segments": p.max_segments}
        for p in packed
    ]))  # fmt: skip
    print()
    print(f"to use the {plans[-1].num_buckets}-bucket plan, paste:")
    print(f'  {paste["python"]}    (with your ragged axis\'s name for "L")')
    if paste["flag"]:
        print(f"  {paste['flag']}    ({EMBED})")
    else:
        print(f"  (no line for {EMBED}: {paste['no_flag']})")
    if over:
        print(
            f"\nwarning: {over:,} of {len(lengths):,} values ({over / len(lengths):.1%}) are "
            f"longer than --max_size {args.max_size}; the plan counts them as {args.max_size}, "
            "but a pipeline makes them dead letters (stage validation) unless it truncates "
            'them (bj.Bucketing(..., oversize="truncate"); the embed pipeline truncates '
            "texts at the model's max_seq_length)",
            file=sys.stderr,
        )
    if memory is not None:
        print(f"\n{mem.format_memory(memory)}")
    if args.plot:
        print(f"\nplot: {args.plot}")
    return 0
