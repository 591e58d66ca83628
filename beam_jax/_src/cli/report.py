"""``beam-jax report``: the metrics a run wrote (``OUTPUT/_metrics.json``), as tables and a plot.

The file is written by a job (``beam_jax.jobs.write_metrics``): the run's summary,
the kernel's totals, and per bucket the elements, batches, padding, compiles and mean
batch latency. The report prints them and, with ``--plot``, draws one bar chart each for
elements, padding, batch latency and compiles per bucket, and dead letters per stage.

Example:
    >>> record = load_metrics("out/")  # doctest: +SKIP
    >>> print(render(record))  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from beam_jax._src.cli.table import format_table
from beam_jax._src.jobs.output_dir import METRICS

__all__ = ["add_parser", "load_metrics", "main", "plot_report", "render"]

_PANELS = (
    ("elements", "elements per bucket", "elements"),
    ("padding_ratio", "padding per bucket", "padded / real"),
    ("mean_batch_latency_ms", "mean batch latency", "ms"),
    ("compiles", "compiles per bucket", "shapes"),
)


def load_metrics(path: str) -> dict[str, Any]:
    """The metrics record at ``path``, or at ``path/_metrics.json`` for an output directory.

    Raises:
        FileNotFoundError: If there is no such file.
        ValueError: If the file is not a metrics record.
    """
    if os.path.isdir(path):
        directory, path = path, os.path.join(path, METRICS)
        if not os.path.exists(path):
            has = sorted(os.listdir(directory))
            shown = ", ".join(has[:8]) + (f", ... ({len(has)} files)" if has[8:] else "")
            raise FileNotFoundError(
                f"{directory} has no {METRICS}: it holds {shown or 'nothing'}. A job writes "
                f"{METRICS} when it finishes (beam-jax embed, beam-jax curate, or a job of "
                "one's own through beam_jax.jobs.write_metrics); give the OUTPUT of a "
                "finished run, or rerun the job"
            )
    try:
        with open(path) as f:
            record = json.load(f)
    except ValueError as e:  # not JSON, or not text (JSONDecodeError, UnicodeDecodeError)
        raise ValueError(
            f"{path} is not a run's metrics file: it does not read as one JSON object ({e}). "
            f"Give the OUTPUT directory of a finished run, or its OUTPUT/{METRICS}"
        ) from e
    if not isinstance(record, dict) or "summary" not in record or "buckets" not in record:
        raise ValueError(
            f"{path} is not a run's metrics file (expected the keys 'summary' and 'buckets', "
            f"as pipelines write to OUTPUT/{METRICS})"
        )
    return record


def _number(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def render(record: dict[str, Any]) -> str:
    """The record as text: totals, the per-bucket table and dead letters by stage."""
    s = record["summary"]
    kernel = record.get("kernel") or {}
    lines = [f"{record.get('pipeline', 'run')}: metrics"]
    totals = [
        ("rows", s.get("rows", kernel.get("elements"))),
        ("results", s.get("results", kernel.get("results"))),
        ("dead letters", s.get("dead_letters", kernel.get("dead_letters"))),
        ("padding", s.get("padding_ratio", kernel.get("padding_ratio"))),
        ("batches", s.get("batches", kernel.get("batches"))),
        ("compiles", s.get("compiles", kernel.get("compiles"))),
        ("compile seconds", s.get("compile_seconds", kernel.get("compile_seconds"))),
        ("  of it tracing", kernel.get("compile_trace_seconds")),
        ("mean batch latency ms", kernel.get("mean_batch_latency_ms")),
        ("wall seconds", s.get("wall_seconds")),
    ]
    width = max(len(k) for k, _ in totals)
    lines += [f"  {k.ljust(width)}  {_number(v)}" for k, v in totals if v is not None]
    buckets = record["buckets"]
    if buckets:
        lines += ["", "per bucket:"]
        rows = [
            {
                "bucket": label,
                "elements": b.get("elements"),
                "batches": b.get("batches"),
                "padding": b.get("padding_ratio"),
                "compiles": b.get("compiles"),
                "latency_ms": b.get("mean_batch_latency_ms"),
            }
            for label, b in buckets.items()
        ]
        rows = [{k: ("-" if v is None else v) for k, v in r.items()} for r in rows]
        lines.append(format_table(rows))
    stages = s.get("dead_letters_by_stage") or kernel.get("dead_letters_by_stage") or {}
    lines += ["", "dead letters by stage:"]
    lines += [f"  {stage}: {n:,}" for stage, n in stages.items() if n] or ["  none"]
    return "\n".join(lines)


def plot_report(record: dict[str, Any], path: str):
    """Bar charts of the per-bucket metrics and of dead letters by stage; saves a PNG.

    Returns:
        The matplotlib ``Figure``: axes 0-3 the per-bucket panels (one bar per bucket),
        axes 4 dead letters by stage (one bar per stage).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3).ravel()
    labels = list(record["buckets"])
    for ax, (key, title, unit) in zip(axes, _PANELS, strict=False):
        values = [record["buckets"][b].get(key) for b in labels]
        ax.bar(labels, [0 if v is None else v for v in values], color="#4c72b0")
        ax.set_title(title)
        ax.set_xlabel("bucket")
        ax.set_ylabel(unit)
        if key in ("elements", "compiles"):
            ax.yaxis.get_major_locator().set_params(integer=True)
        if key == "padding_ratio":
            ax.axhline(1.0, color="gray", linewidth=0.8)
    s = record["summary"]
    stages = s.get("dead_letters_by_stage") or (record.get("kernel") or {}).get(
        "dead_letters_by_stage", {}
    )
    dead = axes[4]
    dead.bar(list(stages), list(stages.values()), color="#c44e52")
    dead.set_title(f"dead letters by stage ({sum(stages.values()):,})")
    dead.set_ylim(0, max([1, *stages.values()]) * 1.1)
    dead.tick_params(axis="x", labelrotation=30)
    if not any(stages.values()):  # an empty panel would read as a missing chart
        dead.set_xticks([])
        dead.text(0.5, 0.5, "none", transform=dead.transAxes, ha="center", va="center")
    axes[5].axis("off")
    axes[5].text(0, 0.5, render(record).split("\n\n")[0], family="monospace", fontsize=8,
                 va="center")  # fmt: skip
    fig.suptitle(f"{record.get('pipeline', 'run')}: {s.get('results', '?')} results")
    fig.savefig(path, dpi=100)
    return fig


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report",
        allow_abbrev=False,
        epilog="Every flag takes either spelling: --a_b or --a-b.",
        help="the metrics a run wrote, as tables and a plot",
        description="Print the metrics of a finished run (OUTPUT/_metrics.json, written by "
        "the pipelines): totals, per-bucket elements, padding, batch latency and compiles, "
        "and dead letters by stage; optionally draw them.",
    )
    parser.add_argument("metrics", metavar="METRICS", help="a _metrics.json file or its OUTPUT")
    parser.add_argument("--plot", metavar="PNG", help="draw the per-bucket bar charts")
    parser.set_defaults(main=main)
    return parser


def main(args: argparse.Namespace) -> int:
    try:
        record = load_metrics(args.metrics)
    except (OSError, ValueError) as e:
        sys.exit(f"beam-jax report: {e}")
    print(render(record))
    if args.plot:
        plot_report(record, args.plot)
        print(f"\nplot: {args.plot}")
    return 0
