"""Packing or length buckets for a text-embedding job, chosen from a sample's token lengths.

Both are planned from the same lengths (:func:`beam_jax.plan_bucketing`,
:func:`beam_jax.plan_packing`) and priced in what the encoder executes: FLOPs per real
token (attention included, from :meth:`SentenceEncoder.flops_per_token`) over the whole
input, plus ``shape_cost`` tokens' worth of FLOPs per compiled shape.

Within packing, row lengths are priced by their time per token slot, not their FLOPs
alone: attention's softmax, masks and layout make it cost more time than its matmul FLOPs
say, so a slot of a short row is cheaper than its FLOPs predict. ``attention_time`` weighs
attention's FLOPs against the dense layers' (its default is measured on MiniLM, see
bench/RESULTS.md); it decides whether short texts get short rows of their own
(``Packing.pack_lengths``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

import numpy as np

from beam_jax._src.bucketing.bucketing_choice import BucketingChoice, plan_bucketing
from beam_jax._src.bucketing.packing import assign_rows, batch_rows
from beam_jax._src.bucketing.packing_choice import PackingChoice, plan_packing
from beam_jax._src.errors import SpecError

__all__ = ["BatchingChoice", "plan_batching"]

BATCHINGS = ("auto", "packed", "buckets")


class _Encoder(Protocol):
    max_length: int

    def flops_per_token(self, length: int) -> int: ...


@dataclasses.dataclass(frozen=True)
class BatchingChoice:
    """How a text-embedding job shapes its batches, and why.

    Attributes:
        plan: The chosen policy: a :class:`beam_jax.BucketingChoice` or
            :class:`beam_jax.PackingChoice`.
        flops: Predicted executed FLOPs per real token of each policy planned
            (``{"buckets": ..., "packed": ...}``).
        reason: Why the plan was chosen, in words.
    """

    plan: BucketingChoice | PackingChoice
    flops: Mapping[str, float]
    reason: str

    def __post_init__(self):
        if not isinstance(self.plan, BucketingChoice | PackingChoice):
            raise TypeError(
                f"plan must be a BucketingChoice or a PackingChoice, got {type(self.plan).__name__}"
            )

    @property
    def batching(self) -> Literal["packed", "buckets"]:
        """``"packed"`` or ``"buckets"``."""
        return "packed" if isinstance(self.plan, PackingChoice) else "buckets"

    @property
    def policy(self):
        """What ``RunKernelOnArrow`` takes: a ``Bucketing`` or a ``PackingChoice``."""
        return self.plan if isinstance(self.plan, PackingChoice) else self.plan.bucketing

    @property
    def shapes(self) -> int:
        """Compiled shapes the plan allows."""
        return self.plan.shapes

    @property
    def padding_ratio(self) -> float:
        """Expected padded over real tokens."""
        return self.plan.padding_ratio

    def describe(self) -> dict:
        """For a run report: the policy, its shapes and the prediction it was chosen on."""
        packing = getattr(self.plan, "packing", None)
        return {
            "batching": self.batching,
            "shapes": self.shapes,
            # Packed: the row lengths records are packed into (several: length classes).
            "length_classes": list(packing.pack_lengths) if packing is not None else None,
            "padding_ratio": self.padding_ratio,
            "flops_per_real_token": dict(self.flops),
            "reason": self.reason,
        }


def plan_batching(
    lengths: Sequence[int] | np.ndarray,
    encoder: _Encoder,
    *,
    batching: str = "auto",
    compile_budget: int = 24,
    packed_shapes: int = 4,
    shape_cost: float = 2000.0,
    max_batch_size: int = 64,
    max_tokens_per_batch: int | None = 2048,
    buffer_size: int | None = None,
    total: int | None = None,
    num_devices: int = 1,
    attention_time: float = 2.25,
    slot_costs: Mapping[int, float] | None = None,
) -> BatchingChoice:
    """Plans buckets and packed rows from token lengths and picks the cheaper to execute.

    Example:
        >>> from beam_jax.text import SentenceEncoder
        >>> lengths = np.random.default_rng(0).integers(8, 40, 500)
        >>> choice = plan_batching(lengths, SentenceEncoder.from_dir(), compile_budget=8)
        >>> choice.batching, choice.shapes <= 8, choice.reason.startswith("packing chosen")
        ('packed', True, True)

    Args:
        lengths: Token counts of a sample, ``[CLS]``/``[SEP]`` included (cut to
            ``encoder.max_length``); empty means one bucket of the longest length.
        encoder: A :class:`SentenceEncoder` (``max_length``, ``flops_per_token``).
        batching: ``"auto"`` (the cheaper), ``"packed"`` or ``"buckets"``.
        compile_budget: The most compiled shapes for buckets.
        packed_shapes: The most compiled shapes for packing (within ``compile_budget``).
        shape_cost: What one more compiled shape costs, in tokens' worth of FLOPs.
        max_batch_size: The most texts (or packed rows) per batch.
        max_tokens_per_batch: The most padded tokens per batch.
        buffer_size: Texts packed together (e.g. rows per output part); ``None``: all.
        total: Texts the job will embed (default: the sample's).
        num_devices: Devices per worker (batch sizes are multiples of it).
        attention_time: Time per attention FLOP over time per dense FLOP, for the cost of
            a packed slot per row length (1.0: FLOPs alone).
        slot_costs: Measured time per token slot at each candidate packed row length
            (the longest row's model window, its half and its quarter; any unit): replaces
            ``attention_time``'s estimate.

    Raises:
        SpecError: ``batching`` is none of ``auto``, ``packed``, ``buckets``.
    """
    if batching not in BATCHINGS:
        raise SpecError(f"batching must be one of {', '.join(BATCHINGS)}, got {batching!r}")
    max_size = encoder.max_length
    lengths = np.minimum(np.asarray(lengths, np.int64), max_size)
    if len(lengths) == 0:
        lengths = np.asarray([max_size])  # nothing to go by: one bucket, the longest
    common = dict(max_size=max_size, shape_cost=shape_cost, num_devices=num_devices)
    plans: dict[str, BucketingChoice | PackingChoice] = {}
    flops: dict[str, float] = {}
    if batching != "packed":
        plans["buckets"] = plan_bucketing(
            lengths,
            compile_budget=compile_budget,
            max_batch_size=max_batch_size,
            max_padded_size=max_tokens_per_batch,
            total=max(total or len(lengths), 1),
            **common,
        )
        flops["buckets"] = _bucketed_flops(lengths, plans["buckets"], encoder)
    if batching != "buckets":
        candidates = sorted({max(1, max_size // 4), max(1, max_size // 2), max_size})
        costs = _slot_costs(encoder, candidates, attention_time, slot_costs)
        plans["packed"] = plan_packing(
            lengths,
            compile_budget=min(compile_budget, packed_shapes),
            max_rows_per_batch=max_batch_size,
            max_tokens_per_batch=max_tokens_per_batch,
            buffer_size=buffer_size,
            row_lengths=candidates,
            slot_costs=costs,
            **common,
        )
        flops["packed"] = _packed_flops(lengths, plans["packed"], encoder)
    if batching != "auto":
        return BatchingChoice(plans[batching], flops, f"--batching {batching}")
    price = shape_cost * encoder.flops_per_token(max(1, int(np.mean(lengths))))
    cost = {k: flops[k] * float(lengths.sum()) + price * plans[k].shapes for k in plans}
    words = (
        f"predicted {flops['packed'] / 1e6:.1f} MFLOP per real token packed "
        f"({plans['packed'].shapes} shapes) against {flops['buckets'] / 1e6:.1f} bucketed "
        f"({plans['buckets'].shapes} shapes)"
    )
    if cost["packed"] < cost["buckets"]:
        saved = 1 - flops["packed"] / flops["buckets"]
        reason = (
            f"packing chosen: {words}, {saved:.0%} fewer FLOPs{_classes(plans['packed'])} "
            "(--batching auto)"
        )
        return BatchingChoice(plans["packed"], flops, reason)
    return BatchingChoice(plans["buckets"], flops, f"buckets chosen: {words} (--batching auto)")


def _classes(plan: BucketingChoice | PackingChoice) -> str:
    """Words for a packed plan's length classes, if it has several."""
    classes = getattr(getattr(plan, "packing", None), "pack_lengths", ())
    if len(classes) < 2:
        return ""
    rows = ", ".join(f"rows of {n} for texts up to {n} tokens" for n in classes[:-1])
    return f"; length classes: {rows}, rows of {classes[-1]} for the rest"


def _slot_costs(encoder, candidates, attention_time, measured) -> dict[int, float]:
    """The cost of a packed slot at each candidate row length, relative to the shortest's
    dense work: measured times scaled so, or FLOPs with attention weighted by
    ``attention_time``."""
    if attention_time <= 0:
        raise SpecError(f"attention_time must be positive, got {attention_time!r}")
    step = encoder.flops_per_token(2) - encoder.flops_per_token(1)  # attention, per L
    dense = encoder.flops_per_token(1) - step
    if measured is None:
        return {n: 1.0 + attention_time * step * n / dense for n in candidates}
    missing = [n for n in candidates if n not in measured]
    if missing or any(not measured[n] > 0 for n in candidates):
        raise SpecError(
            f"slot_costs must give a positive time for each packed row length {candidates}, "
            f"got {dict(measured)!r}"
        )
    # In the FLOP model's unit at the longest row, so shape_cost keeps its meaning.
    scale = (1.0 + step * candidates[-1] / dense) / measured[candidates[-1]]
    return {n: float(measured[n]) * scale for n in candidates}


def _bucketed_flops(lengths: np.ndarray, plan: BucketingChoice, encoder: _Encoder) -> float:
    """Predicted executed FLOPs per real token of ``plan`` on the sample."""
    bounds = np.asarray(plan.bucketing.boundaries["L"], np.int64)
    bucket = np.minimum(np.searchsorted(bounds, lengths), len(bounds) - 1)
    padded_to = bounds[bucket]
    # Each text runs at its bucket's length; batch rows add the plan's own padding.
    per_bucket = np.array([encoder.flops_per_token(int(b)) for b in bounds])
    per_text = padded_to * per_bucket[bucket]
    rows = plan.padding_ratio * lengths.sum() / max(padded_to.sum(), 1)
    return float(per_text.sum() * rows / max(lengths.sum(), 1))


def _packed_flops(lengths: np.ndarray, plan: PackingChoice, encoder: _Encoder) -> float:
    """Predicted executed FLOPs per real token of ``plan`` on the sample, packed buffer by
    buffer (empty slots and empty rows included)."""
    step = plan.buffer_size or len(lengths)
    executed = 0.0
    for start in range(0, len(lengths), step):
        assignment = assign_rows(lengths[start : start + step], plan.packing)
        for n, size, _ in batch_rows(assignment, plan.packing):
            executed += n * size * encoder.flops_per_token(n)
    return executed / max(int(lengths.sum()), 1)
