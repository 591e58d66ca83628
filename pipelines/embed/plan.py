"""At launch: the run's batches, planned from a sample of its input (docs/embed_text.md).

A sample of the input is tokenized as the job will, and ``beam_jax.text.plan_batching``
chooses buckets or packed rows from its token counts; ``--buckets 16,32,...`` fixes buckets.

Example:
    >>> plan = plan_for(args, inputs)  # doctest: +SKIP
    >>> plan.bucketing.boundaries["L"][-1]  # doctest: +SKIP
    256
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

import beam_jax as bj
from beam_jax import jobs, text
from pipelines.embed.parts import Inputs


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """How a run shapes its batches: ``choice``, planned from a sample of ``sample`` texts
    for ``rows`` rows, or ``fixed`` buckets (``--buckets``; ``choice`` is then None)."""

    choice: text.BatchingChoice | None
    fixed: bj.Bucketing | None = None
    sample: int = 0
    rows: jobs.RowCount = jobs.RowCount()

    @property
    def total(self) -> int:
        """The rows planned for: counted or estimated, else those sampled."""
        return max(self.rows.rows or self.sample, 1)

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
    def packing(self) -> bj.PackingChoice | None:
        return self.choice.policy if self.batching == "packed" else None

    @property
    def reason(self) -> str:
        return self.choice.reason if self.planned else "--buckets"

    def describe(self) -> dict:
        """For the run report: the policy, its shapes and the prediction it was chosen on."""
        if self.planned:
            return self.choice.describe()
        return {"batching": "buckets", "boundaries": list(self.fixed.boundaries["L"])}

    def short(self) -> str:
        """What the batches are, in a glance: the shapes and the padding expected."""
        if not self.planned:
            return f"fixed buckets {','.join(map(str, self.fixed.boundaries['L']))}"
        shapes = jobs.counted(self.choice.shapes, "compiled shape")
        if self.packing is not None:
            lengths = ",".join(map(str, self.packing.packing.row_lengths))
            what = f"texts packed in rows of {lengths} tokens"
        else:
            buckets = jobs.counted(len(self.bucketing.boundaries["L"]), "length bucket")
            what = f"texts padded to {buckets}"
        return f"{what}, {shapes}, padding ~{self.choice.padding_ratio:.2f}x"

    def __str__(self) -> str:
        """The plan in full (``--verbose``): its shapes, sample and why it was chosen."""
        if not self.planned:
            return f"embed_text: {self.short()} (--buckets)"
        c = self.choice
        if self.packing is not None:
            p = self.packing.packing
            sizes = "; ".join(f"{n}: {','.join(map(str, s))}" for n, s in p.rows_per_batch.items())
            lengths = ",".join(map(str, p.row_lengths))
            what = f"packed rows of {lengths} tokens (rows per batch {sizes})"
        else:
            what = f"buckets {','.join(map(str, self.bucketing.boundaries['L']))}"
        return (
            f"embed_text: {what} planned from {jobs.counted(self.sample, 'text')} for "
            f"{self.rows}: {jobs.counted(c.shapes, 'compiled shape')}, expected padding "
            f"{c.padding_ratio:.3f}x; {c.reason}"
        )


def sample_texts(inputs: Inputs, n: int) -> tuple[pa.Array, jobs.RowCount]:
    """Up to ``n`` texts from the input (a ``large_string`` array), spread over its files
    (``beam_jax.jobs.sample_texts``), and its rows, counted or estimated."""
    if inputs.format == "builtin":
        rows = text.builtin_corpus(inputs.builtin_texts)
        return pa.array([t for _, t in rows[:n]], pa.large_string()), jobs.RowCount(len(rows), True)
    return jobs.sample_texts(inputs.files, inputs.text_column, n, inputs.format)


def token_lengths(texts: pa.Array | Sequence[str], model: Any = None) -> np.ndarray:
    """Token counts (with ``[CLS]``/``[SEP]``, after truncation) as the job's tokenize step
    counts them; the texts that fail there (dead letters in the job) are not counted."""
    if not isinstance(texts, pa.Array):
        texts = pa.array(list(texts), pa.large_string())
    ids, failures = (model or text.SentenceEncoder.from_dir()).tokenizer().encode_arrow(texts)
    return np.delete(np.diff(ids.offsets.to_numpy()).astype(np.int64), sorted(failures))


def plan_for(args: Any, inputs: Inputs, num_devices: int = 1, model: Any = None) -> LaunchPlan:
    """The run's batches: fixed buckets, or buckets or packed rows planned from a sample.

    Args:
        args: the parsed flags.
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
        return LaunchPlan(None, fixed, rows=sample_texts(inputs, 0)[1])
    model = model or text.SentenceEncoder.from_dir(
        args.model_dir,
        manifest=args.model_manifest,
        matmuls=args.matmuls,
        layer_kernel=args.layer_kernel,
    )
    texts, rows = sample_texts(inputs, args.plan_sample)
    choice = text.plan_batching(
        token_lengths(texts, model),
        model,
        batching=args.batching,
        compile_budget=args.compile_budget,
        shape_cost=args.shape_cost,
        max_batch_size=args.batch_size,
        max_tokens_per_batch=args.max_tokens_per_batch,
        buffer_size=args.rows_per_part,
        total=max(rows.rows or len(texts), 1),  # counted or estimated, else those sampled
        num_devices=num_devices,
    )
    return LaunchPlan(choice, sample=len(texts), rows=rows)
