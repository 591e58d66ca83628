"""At launch: the run's batches, planned from a sample of its input (docs/embed_text.md).

The first texts of the input (spread over its files) are tokenized as the job will
tokenize them; ``beam_jax.text.plan_batching`` plans buckets and packed rows from their
token counts and says which it chose and why. ``--buckets 16,32,...`` fixes buckets.

Example:
    >>> plan = plan_for(args, inputs)  # doctest: +SKIP
    >>> plan.bucketing.boundaries["L"][-1]  # doctest: +SKIP
    256
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

import beam_jax as bj
from beam_jax import jobs, text
from beam_jax.text import builtin_corpus
from pipelines.embed.parts import Inputs

__all__ = ["LaunchPlan", "plan_for", "sample_texts", "token_lengths"]

# Files whose Parquet footers are read to count the job's rows; beyond this the count is
# extrapolated from their mean (each footer is one read, which on gs:// is ~50 ms).
_MAX_FOOTERS = 64


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """How a run shapes its batches: ``choice``, planned from a sample of ``sample`` texts
    for ``total`` rows, or ``fixed`` buckets (``--buckets``; ``choice`` is then None)."""

    choice: text.BatchingChoice | None
    fixed: bj.Bucketing | None = None
    sample: int = 0
    total: int = 0

    @property
    def planned(self) -> bool:
        return self.choice is not None

    @property
    def batching(self) -> str:
        """``"packed"`` or ``"buckets"``: the policy chosen."""
        return self.choice.batching if self.planned else "buckets"

    @property
    def bucketing(self) -> bj.Bucketing | None:
        return self.fixed if not self.planned or self.batching == "packed" else self.choice.policy

    @property
    def packing(self) -> bj.PackingPlan | None:
        return self.choice.policy if self.batching == "packed" else None

    @property
    def reason(self) -> str:
        return self.choice.reason if self.planned else "--buckets"

    def describe(self) -> dict:
        """For the run report: the policy, its shapes and the prediction it was chosen on."""
        if self.planned:
            return self.choice.describe()
        return {"batching": "buckets", "boundaries": list(self.fixed.boundaries["L"])}

    def __str__(self) -> str:
        if not self.planned:
            return f"embed_text: fixed buckets {','.join(map(str, self.fixed.boundaries['L']))}"
        c = self.choice
        if self.packing is not None:
            p = self.packing.packing
            sizes = "; ".join(f"{n}: {','.join(map(str, s))}" for n, s in p.rows_per_batch.items())
            lengths = ",".join(map(str, p.row_lengths))
            what = f"packed rows of {lengths} tokens (rows per batch {sizes})"
        else:
            what = f"buckets {','.join(map(str, self.bucketing.boundaries['L']))}"
        return (
            f"embed_text: {what} planned from {self.sample} texts for ~{self.total} rows: "
            f"{c.shapes} compiled shapes, expected padding {c.padding_ratio:.3f}x; {c.reason}"
        )


def sample_texts(inputs: Inputs, n: int) -> tuple[pa.Array, int]:
    """Up to ``n`` texts from the input (a ``large_string`` array), and the job's row count
    (estimated where needed).

    Every file gives a share of the sample (its first rows, ``beam_jax.jobs.text_sample``),
    so a job of many files is sampled across them. Rows whose text is not a string are
    skipped, as they are dead letters in the job. A file that cannot be read is skipped here;
    the job names it.
    """
    if inputs.format == "builtin":
        rows = builtin_corpus(inputs.builtin_texts)
        return pa.array([t for _, t in rows[:n]], pa.large_string()), len(rows)
    files = [f for f in inputs.files if f.size]
    per_file = max(1, math.ceil(n / len(files))) if files else 0
    texts: list[pa.Array] = []
    got = rows = counted = 0
    for i, file in enumerate(files):
        want = min(per_file, n - got)
        if want <= 0 and counted >= _MAX_FOOTERS:
            break
        try:
            some, count = jobs.text_sample(file, inputs.text_column, want, inputs.format)
        except Exception:  # noqa: BLE001, S112 - the job reads it again and names the fault
            continue
        texts.append(some)
        got += len(some)
        if count is not None and i < _MAX_FOOTERS:
            rows, counted = rows + count, counted + 1
    total = round(rows * len(files) / counted) if counted else got
    sampled = pa.concat_arrays(texts) if texts else pa.array([], pa.large_string())
    return sampled, max(total, got)


def token_lengths(texts: pa.Array | Sequence[str], model: Any = None) -> np.ndarray:
    """Token counts (with ``[CLS]``/``[SEP]``, after truncation) as the job counts them:
    tokenized as its tokenize step does (``Tokenizer.encode_arrow``), with the tokenizer it
    shares when it runs in this process; the texts that fail there (dead letters in the
    job) are not counted."""
    if not isinstance(texts, pa.Array):
        texts = pa.array(list(texts), pa.large_string())
    ids, failures = (model or text.SentenceEncoder.from_dir()).tokenizer().encode_arrow(texts)
    return np.delete(np.diff(ids.offsets.to_numpy()).astype(np.int64), sorted(failures))


def plan_for(args: Any, inputs: Inputs, num_devices: int = 1, model: Any = None) -> LaunchPlan:
    """The run's batches: fixed buckets, or buckets or packed rows planned from a sample.

    Args:
        args: the parsed flags (``--buckets``, ``--batching``, ``--compile_budget``,
            ``--plan_sample``, ``--shape_cost``, ``--batch_size``, ``--max_tokens_per_batch``,
            ``--batch_sizes``, ``--rows_per_part``).
        inputs: the run's input files.
        num_devices: devices per worker where known (batch sizes are multiples of it).
        model: the ``SentenceEncoder`` (default: ``--model_dir``'s).
    """
    if args.buckets != "auto" and args.batching != "packed":
        fixed = bj.Bucketing(
            boundaries={"L": args.buckets},
            batch_size=args.batch_size,
            max_padded_size=args.max_tokens_per_batch,
            batch_sizes=args.batch_sizes,
        )
        return LaunchPlan(None, fixed)
    model = model or text.SentenceEncoder.from_dir(
        args.model_dir, manifest=args.model_manifest, matmuls=args.matmuls
    )
    texts, total = sample_texts(inputs, args.plan_sample)
    choice = text.plan_batching(
        token_lengths(texts, model),
        model,
        batching=args.batching,
        compile_budget=args.compile_budget,
        shape_cost=args.shape_cost,
        max_batch_size=args.batch_size,
        max_tokens_per_batch=args.max_tokens_per_batch,
        buffer_size=args.rows_per_part,
        total=max(total, 1),
        num_devices=num_devices,
    )
    return LaunchPlan(choice, sample=len(texts), total=max(total, 1))
