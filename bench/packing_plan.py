"""Padding and executed FLOPs of MiniLM inputs: sequence packing against planned buckets.

Pure and fast (tokenization and numpy, no encoder run): for the built-in corpus and the
paragraphs of the Python Language Reference's help topics (``pydoc_data.topics``, shipped
with CPython), tokenized as the flagship does (all-MiniLM-L6-v2's tokenizer, 256 tokens at
most), it prints

* planned buckets (``bj.plan_bucketing`` with the flagship's settings, at the flagship's
  compile budget and at the packing budget), batched as the engine batches a bucket (full
  batches of the largest size, the rest padded to the smallest size that holds it);
* packing (``bj.plan_packing``) with rows of 256 tokens, packed buffer by buffer;

each with its compiled shapes, padded tokens per real token (padded batch rows and empty
rows included) and executed FLOPs per real token, attention included: per token and layer
about ``24 h**2`` for the dense parts and ``4 L h`` for attention over a row (or bucket) of
length ``L`` (MiniLM: h = 384, 6 layers).

Usage:
    python bench/packing_plan.py [--buffers 0,1024] [--budget 4]
"""

from __future__ import annotations

import argparse
import bisect
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import beam_jax as bj  # noqa: E402
from beam_jax.text import SentenceEncoder, builtin_corpus  # noqa: E402
from pipelines.embed.flags import (  # noqa: E402
    DEFAULT_BATCH_SIZE,
    DEFAULT_COMPILE_BUDGET,
    DEFAULT_MAX_TOKENS,
    DEFAULT_SHAPE_COST,
)

HIDDEN, LAYERS = 384, 6


def flops_per_token(length: int) -> float:
    """MiniLM's executed FLOPs for one slot of a row (or bucket) of ``length`` tokens."""
    return LAYERS * (24 * HIDDEN**2 + 4 * length * HIDDEN)


def topic_paragraphs() -> list[str]:
    """The paragraphs of the Language Reference's help topics (as ``help("if")`` shows)."""
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    paragraphs = [
        p.strip()
        for name in sorted(topics)
        for p in re.split(r"\n\s*\n", topics[name])
        if len(p.strip()) >= 20
    ]
    return list(dict.fromkeys(paragraphs))


def bucketed(lengths: np.ndarray, budget: int, buffer: int | None) -> dict:
    """Planned buckets, batched per buffer as the engine batches a bucket."""
    plan = bj.plan_bucketing(
        lengths,
        max_size=256,
        compile_budget=budget,
        max_batch_size=DEFAULT_BATCH_SIZE,
        max_padded_size=DEFAULT_MAX_TOKENS,
        shape_cost=DEFAULT_SHAPE_COST,
    )
    bounds = plan.bucketing.boundaries["L"]
    step = buffer or len(lengths)
    padded = flops = 0.0
    for start in range(0, len(lengths), step):
        chunk = lengths[start : start + step]
        index = np.searchsorted(bounds, chunk, side="left")
        for b, bound in enumerate(bounds):
            n = int((index == b).sum())
            sizes = plan.bucketing.batch_sizes[(bound,)]
            full, rest = divmod(n, sizes[-1])
            rows = full * sizes[-1] + (sizes[bisect.bisect_left(sizes, rest)] if rest else 0)
            padded += rows * bound
            flops += rows * bound * flops_per_token(bound)
    real = float(lengths.sum())
    return {
        "shapes": plan.shapes,
        "padding": padded / real,
        "predicted": plan.padding_ratio,
        "flops": flops / real,
        "detail": f"boundaries {bounds}",
    }


def packed(lengths: np.ndarray, budget: int, buffer: int | None) -> dict:
    plan = bj.plan_packing(
        lengths,
        max_size=256,
        compile_budget=budget,
        row_lengths=(64, 128, 256),
        max_rows_per_batch=DEFAULT_BATCH_SIZE,
        max_tokens_per_batch=DEFAULT_MAX_TOKENS,
        buffer_size=buffer,
        attention_cost=4 / (24 * HIDDEN),
        shape_cost=DEFAULT_SHAPE_COST,
    )
    stats = plan.stats
    flops = 0.0
    step = buffer or len(lengths)
    from beam_jax._src.bucketing.packing import assign_rows, batch_rows

    for start in range(0, len(lengths), step):
        a = assign_rows(lengths[start : start + step], plan.packing)
        for length, size, _ in batch_rows(a, plan.packing):
            flops += size * length * flops_per_token(length)
    p = plan.packing
    return {
        "shapes": plan.shapes,
        "padding": plan.padding_ratio,
        "predicted": plan.padding_ratio,
        "flops": flops / stats.real,
        "detail": f"rows {p.row_lengths} x {dict(p.rows_per_batch)}, "
        f"<= {p.max_segments} texts a row, {stats.empty_rows} empty rows",
    }


def main(argv: list[str] | None = None) -> dict:
    """Prints the comparison; returns ``{corpus: {buffer: {label: figures}}}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--buffers",
        default="0,1024",
        help="texts batched (or packed) together, comma-separated; 0: the whole corpus",
    )
    parser.add_argument("--budget", type=int, default=4, help="packing's compile budget")
    args = parser.parse_args(argv)
    tokenizer = SentenceEncoder.from_dir().tokenizer()
    corpora = {
        "built-in corpus": [t for _, t in builtin_corpus()],
        "help topics": topic_paragraphs(),
    }
    dense, attention = flops_per_token(0) / 1e6, 4 * HIDDEN * LAYERS / 1e3
    print(f"MiniLM h={HIDDEN}, {LAYERS} layers: dense {dense:.1f} MFLOP per token; attention "
          f"adds {attention:.1f} kFLOP per token per slot of row length")  # fmt: skip
    report: dict = {}
    for name, texts in corpora.items():
        lengths = np.asarray([len(x) for x in tokenizer.encode_batch(texts)], np.int64)
        print(f"\n{name}: {len(texts)} texts, {int(lengths.sum())} tokens, "
              f"median {int(np.median(lengths))}")  # fmt: skip
        for buffer in [int(b) for b in args.buffers.split(",")]:
            size = buffer or None
            print(f"  buffer: {buffer or 'the whole corpus'}{' texts' if buffer else ''}")
            rows = {
                f"buckets, budget {DEFAULT_COMPILE_BUDGET}": bucketed(
                    lengths, DEFAULT_COMPILE_BUDGET, size
                ),
                f"buckets, budget {args.budget}": bucketed(lengths, args.budget, size),
                f"packing, budget {args.budget}": packed(lengths, args.budget, size),
            }
            print(f"    {'':22} {'shapes':>6} {'padded/real':>11} {'MFLOP/real token':>16}")
            for label, r in rows.items():
                print(f"    {label:22} {r['shapes']:>6} {r['padding']:>11.3f} "
                      f"{r['flops'] / 1e6:>16.2f}   {r['detail']}")  # fmt: skip
            base = rows[f"buckets, budget {DEFAULT_COMPILE_BUDGET}"]["flops"]
            gain = base / rows[f"packing, budget {args.budget}"]["flops"]
            print(f"    packing: {gain:.3f}x fewer executed FLOPs per real token than buckets")
            report.setdefault(name, {})[buffer] = rows
    return report


if __name__ == "__main__":
    main()
