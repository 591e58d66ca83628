"""Packing planned from a sample: row lengths and rows per batch under a compile budget.

``plan_packing``, the packing counterpart of ``plan_bucketing``, packs a sample exactly as a
job would (buffer by buffer, with ``assign_rows`` and ``batch_rows``), so the padding it
predicts is the padding those buffers get, empty rows included (pure numpy).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from beam_jax._src.bucketing.packing import ALGORITHMS, Algorithm, Packing, assign_rows, batch_rows
from beam_jax._src.bucketing.rule import check_positive_ints
from beam_jax._src.errors import SpecError

_SEGMENT_MULTIPLE = 8


@dataclasses.dataclass(frozen=True)
class PackingSimulation:
    """What packing a sample buffer by buffer gives (see ``simulate_packing``).

    Attributes:
        real: slots holding a record (real tokens).
        padded: slots the kernel runs over: rows x row length, empty rows included.
        rows: rows holding records.
        empty_rows: rows added only to fill batches.
        batches: kernel calls.
        max_segments: the most records any row held.
        shapes: the distinct ``(row length, rows)`` the batches used.
    """

    real: int
    padded: int
    rows: int
    empty_rows: int
    batches: int
    max_segments: int
    shapes: tuple[tuple[int, int], ...]

    @property
    def padding_ratio(self) -> float:
        """Padded slots per real slot (1.0: no padding)."""
        return self.padded / max(self.real, 1)


def _buffers(lengths: np.ndarray, buffer_size: int | None):
    step = len(lengths) if buffer_size is None else buffer_size
    return [lengths[i : i + step] for i in range(0, len(lengths), max(step, 1))]


def simulate_packing(
    lengths: Sequence[int] | np.ndarray, packing: Packing, *, buffer_size: int | None = None
) -> PackingSimulation:
    """Packs a sample of lengths buffer by buffer, as a job would, and counts the padding.

    Example:
        >>> stats = simulate_packing([5, 3, 2, 6, 2], Packing(row_lengths=8, rows_per_batch=4))
        >>> stats.real, stats.padded, stats.rows, stats.empty_rows
        (18, 32, 3, 1)

    Args:
        lengths: each record's length along the packed axis, in arrival order.
        packing: the policy.
        buffer_size: records packed together (one buffer); default all of them.

    Raises:
        SpecError: a length exceeds the longest row (it would be refused, not packed).
    """
    lengths = _check_lengths(lengths)
    if lengths.size and lengths.max() > packing.max_row_length:
        raise SpecError(
            f"a length of {int(lengths.max())} exceeds the longest row "
            f"({packing.max_row_length}); such records are refused, so truncate the sample "
            "to the longest row first."
        )
    real = padded = rows = empty = batches = most = 0
    shapes = set()
    for chunk in _buffers(lengths, buffer_size):
        a = assign_rows(chunk, packing)
        real += int(chunk.sum())
        rows += len(a.counts)
        most = max(most, int(a.counts.max(initial=0)))
        for length, size, members in batch_rows(a, packing):
            padded += length * size
            empty += size - len(members)
            batches += 1
            shapes.add((length, size))
    return PackingSimulation(real, padded, rows, empty, batches, most, tuple(sorted(shapes)))


@dataclasses.dataclass(frozen=True)
class PackingChoice:
    """What ``plan_packing`` chose, and what packing the sample with it gives.

    Attributes:
        packing: the row lengths, rows per batch and segment cap, ready for a transform.
        shapes: compiled shapes it allows (``len(packing.shapes())``).
        padding_ratio: padded slots per real slot on the sample, empty rows included.
        stats: the full simulation of the sample (``simulate_packing``).
        buffer_size: the buffer the prediction assumed (records packed together).
    """

    packing: Packing
    shapes: int
    padding_ratio: float
    stats: PackingSimulation
    buffer_size: int | None


def _check_lengths(lengths) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0:
        raise SpecError(
            f"lengths must be a non-empty 1-D sequence of ints, got shape {lengths.shape}."
        )
    if lengths.dtype.kind not in "iu":
        raise SpecError(f"lengths must be integers, got dtype {lengths.dtype}.")
    if lengths.min() < 0:
        raise SpecError(f"lengths must be non-negative, got {int(lengths.min())}.")
    return lengths.astype(np.int64)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _padded_rows(counts: np.ndarray, sizes: Sequence[int]) -> int:
    """Rows run for buffers of ``counts`` rows each, by ``batch_rows``'s rule."""
    top = sizes[-1]
    full, rest = np.divmod(counts, top)
    total = int(full.sum()) * top
    for r in rest[rest > 0]:
        total += sizes[bisect.bisect_left(sizes, int(r))]
    return total


def _choose_sizes(counts, lengths, caps, budget, weight, shape_cost, num_devices):
    """Rows per batch for each row length: the largest needed, then the best extra sizes."""
    sizes = {}
    for n, cap in zip(lengths, caps, strict=True):
        most = int(counts[n].max(initial=0))
        sizes[n] = (max(num_devices, min(cap, _round_up(max(most, 1), num_devices))),)
    left = budget - len(lengths)
    while left > 0:
        best = None
        for n in lengths:
            now = _padded_rows(counts[n], sizes[n])
            rests = counts[n] % sizes[n][-1]
            options = {_round_up(int(r), num_devices) for r in rests[rests > 0]}
            options |= {num_devices << k for k in range(12) if num_devices << k < sizes[n][-1]}
            for s in sorted(options - set(sizes[n])):
                if s >= sizes[n][-1]:
                    continue
                trial = tuple(sorted({*sizes[n], s}))
                saved = (now - _padded_rows(counts[n], trial)) * weight(n)
                if saved > shape_cost and (best is None or saved > best[0]):
                    best = (saved, n, trial)
        if best is None:
            break
        sizes[best[1]] = best[2]
        left -= 1
    return sizes


def _class_sets(candidates, tops, budget, length_classes):
    """``(longest row, shorter length classes)`` to try, within the compile budget."""
    for top in tops:
        shorter = [n for n in candidates if n < top] if length_classes else []
        for k in range(min(len(shorter), budget - 1) + 1):
            for classes in itertools.combinations(shorter, k):
                yield top, classes


def plan_packing(
    lengths: Sequence[int] | np.ndarray,
    *,
    max_size: int,
    compile_budget: int = 4,
    row_lengths: Sequence[int] | None = None,
    max_rows_per_batch: int = 64,
    max_tokens_per_batch: int | None = None,
    buffer_size: int | None = None,
    algorithm: Algorithm = "first_fit_decreasing",
    max_segments: int | None = None,
    attention_cost: float = 0.0,
    shape_cost: float = 0.0,
    num_devices: int = 1,
    slot_costs: Mapping[int, float] | None = None,
    length_classes: bool = True,
) -> PackingChoice:
    """Row lengths and rows per batch that minimise the executed slots of a sample.

    Every candidate longest row ``T >= max_size``, alone or with shorter length classes
    (``Packing.pack_lengths``), packs the sample buffer by buffer; each set of shorter rows
    that partly filled rows are cut to, and each choice of rows per batch, is priced by the
    rows it runs. A slot of a row of length ``L`` costs ``slot_costs[L]`` when given, else
    ``1 + attention_cost * L`` (for a transformer, about ``1 / (6 h)``: attention's ``4 L h``
    FLOPs per token and layer beside the dense ``24 h**2``); each compiled shape costs
    ``shape_cost``. The padding reported is that of the sample packed with the plan.

    Example:
        >>> plan = plan_packing([30, 12, 7, 100, 64, 3] * 20, max_size=128, buffer_size=60)
        >>> plan.packing.row_lengths, plan.packing.rows_per_batch, round(plan.padding_ratio, 3)
        ((64, 128), {64: (1,), 128: (17,)}, 1.037)

    Args:
        lengths: a sample of the packed axis's lengths (e.g. token counts of 10,000 texts),
            in arrival order; lengths above ``max_size`` count as ``max_size`` (truncated).
        max_size: the longest record: the longest row is at least this.
        compile_budget: the most compiled shapes (row lengths x their batch sizes).
        row_lengths: candidate row lengths; default ``max_size`` and its half and quarter.
        max_rows_per_batch: the most rows in a batch.
        max_tokens_per_batch: the most rows x row length in a batch.
        buffer_size: records packed together; default the whole sample as one buffer.
        algorithm: ``Packing.algorithm``.
        max_segments: the most records per row; default the most the sample puts in a row,
            rounded up to a multiple of 8 (a cap that never binds on the sample).
        attention_cost: the extra cost of a slot per unit of row length (see above).
        shape_cost: the price of one more compiled shape, in slots.
        num_devices: rows per batch are multiples of this.
        slot_costs: the cost of one slot in a row of each candidate length, in the unit of
            ``shape_cost``; replaces ``attention_cost``'s rule.
        length_classes: try length classes; ``False``: every record is packed into rows of
            the longest length (then cut).

    Raises:
        SpecError: ``lengths`` is empty or not integral, a limit is below 1, or no
            candidate row length is at least ``max_size``.
    """
    _check_limits(
        max_size, compile_budget, max_rows_per_batch, num_devices, buffer_size,
        max_tokens_per_batch, attention_cost, shape_cost, algorithm, slot_costs,
    )  # fmt: skip
    sample = np.minimum(_check_lengths(lengths), max_size)
    candidates, tops = _candidates(row_lengths, max_size, slot_costs)
    weight = functools.partial(_weight, attention_cost, slot_costs)
    caps = {
        n: _rows_cap(n, max_rows_per_batch, max_tokens_per_batch, num_devices) for n in candidates
    }
    best = None
    for top, classes in _class_sets(candidates, tops, compile_budget, length_classes):
        used, seen = _pack_sample(sample, buffer_size, (*classes, top), max_segments, algorithm)
        segments = max_segments or min(top, _round_up(max(seen, 1), _SEGMENT_MULTIPLE))
        for allowed in _cut_lengths(candidates, top, classes, compile_budget):
            sizes, cost = _sizes_and_cost(used, allowed, caps, compile_budget, weight, shape_cost,
                                          num_devices)  # fmt: skip
            shapes = sum(len(s) for s in sizes.values())
            key = (cost + shape_cost * shapes, shapes, len(classes), top)
            if best is None or key < best[0]:
                packing = Packing(
                    row_lengths=allowed, rows_per_batch=sizes, max_segments=segments,
                    algorithm=algorithm, pack_lengths=(*classes, top),
                )  # fmt: skip
                best = (key, packing)
    packing = best[1]
    stats = simulate_packing(sample, packing, buffer_size=buffer_size)
    return PackingChoice(packing, len(packing.shapes()), stats.padding_ratio, stats, buffer_size)


def _check_limits(
    max_size, compile_budget, max_rows_per_batch, num_devices, buffer_size,
    max_tokens_per_batch, attention_cost, shape_cost, algorithm, slot_costs,
) -> None:  # fmt: skip
    """``plan_packing``'s arguments other than the sample and the candidate lengths."""
    check_positive_ints(
        max_size=max_size,
        compile_budget=compile_budget,
        max_rows_per_batch=max_rows_per_batch,
        num_devices=num_devices,
    )
    if buffer_size is not None and buffer_size < 1:
        raise SpecError(f"buffer_size must be a positive int or None, got {buffer_size!r}.")
    if max_tokens_per_batch is not None and max_tokens_per_batch < 1:
        raise SpecError(f"max_tokens_per_batch must be positive, got {max_tokens_per_batch!r}.")
    if attention_cost < 0 or shape_cost < 0:
        raise SpecError(
            f"attention_cost and shape_cost must be >= 0, got {attention_cost!r}, {shape_cost!r}."
        )
    if algorithm not in ALGORITHMS:
        raise SpecError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}.")
    if slot_costs is not None and attention_cost:
        raise SpecError(
            f"give slot_costs or attention_cost, not both; got attention_cost={attention_cost!r}."
        )


def _candidates(row_lengths, max_size: int, slot_costs) -> tuple[list[int], list[int]]:
    """The candidate row lengths (default ``max_size`` and its half and quarter), and those
    that can be the longest row (at least ``max_size``)."""
    if row_lengths is None:
        row_lengths = sorted({max(1, max_size // 4), max(1, max_size // 2), max_size})
    candidates = sorted({int(n) for n in row_lengths})
    tops = [n for n in candidates if n >= max_size]
    if not tops or candidates[0] < 1:
        raise SpecError(
            f"row_lengths must hold positive lengths, one at least max_size ({max_size}) so "
            f"every record fits a row, got {tuple(row_lengths)}."
        )
    if slot_costs is not None:
        missing = [n for n in candidates if n not in slot_costs]
        bad = {n: c for n, c in slot_costs.items() if not c > 0}
        if missing or bad:
            raise SpecError(
                f"slot_costs must give a positive cost for every candidate row length "
                f"{candidates}; missing {missing}, not positive {bad}."
            )
    return candidates, tops


def _weight(attention_cost: float, slot_costs: Mapping[int, float] | None, n: int) -> float:
    """What a row of length ``n`` costs: its slots, each at its measured cost or growing
    with the row length as attention's does."""
    if slot_costs is not None:
        return n * float(slot_costs[n])
    return n * (1.0 + attention_cost * n)


def _rows_cap(n: int, max_rows: int, max_tokens: int | None, num_devices: int) -> int:
    """The most rows in a batch of row length ``n``, a multiple of ``num_devices``."""
    cap = max_rows if max_tokens is None else min(max_rows, max_tokens // n)
    return max(num_devices, cap // num_devices * num_devices)


def _pack_sample(sample, buffer_size, classes, max_segments, algorithm):
    """Each buffer's rows' used slots (packed uncut and uncapped), and the most records a
    row held."""
    uncapped = Packing(
        row_lengths=classes, pack_lengths=classes, max_segments=max_segments, algorithm=algorithm
    )
    assignments = [assign_rows(chunk, uncapped) for chunk in _buffers(sample, buffer_size)]
    return [a.used for a in assignments], max(int(a.counts.max(initial=0)) for a in assignments)


def _cut_lengths(candidates, top: int, classes, budget: int):
    """The row lengths to try: the classes and the longest, with every set of shorter
    candidates (that a buffer's partly filled rows are cut to) the budget leaves room for."""
    shorter = [n for n in candidates if n < top and n not in classes]
    for k in range(min(len(shorter), budget - 1 - len(classes)) + 1):
        for extra in itertools.combinations(shorter, k):
            yield (*sorted((*classes, *extra)), top)


def _sizes_and_cost(used, allowed, caps, budget, weight, shape_cost, num_devices):
    """Each row length's rows per batch for the packed sample, its rows cut to ``allowed``
    lengths, and the weighted rows the batches run."""
    lengths = np.asarray(allowed, np.int64)
    counts = {n: np.zeros(len(used), np.int64) for n in allowed}
    for b, u in enumerate(used):
        cut = lengths[np.searchsorted(lengths, u, side="left")]
        for n, c in zip(*np.unique(cut, return_counts=True), strict=True):
            counts[int(n)][b] = c
    caps = [caps[n] for n in allowed]
    sizes = _choose_sizes(counts, list(allowed), caps, budget, weight, shape_cost, num_devices)
    cost = sum(_padded_rows(counts[n], sizes[n]) * weight(n) for n in allowed)
    return sizes, cost
