"""The engine's front end for elements one at a time (no Beam): validate, bucket, buffer,
check, emit.

Every element path uses this one front end: RunKernel's and ReduceKernel's DoFns (bundle
mode), the cross-bundle flush, and RunInference's handler. What differs between them is
handed in, not subclassed:

- an ``Outputs`` strategy: how a batch's checked outputs become results (one per element,
  ``PerElement``; or one sum per window, ``transforms/reduce_kernel.py``'s ``Summed``), and
  whether batches keep windows apart;
- a ``dead_letter`` function: what one failed element's tag becomes (a tagged Beam output,
  or an entry in the handler's list of failures).

A tag is the front end's caller's description of an element (for the DoFns a ``Source``:
key, element, timestamp, window, and where it was read from; for the handler, its index in
Beam's batch): the engine hands it back with the element's result or its failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.core.dead_letter import VALIDATION, describe
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.core.plan import PaddedBatch, Plan
from beam_jax._src.core.validation import Validated, check_key
from beam_jax._src.engine.batching import BatchEngine, RowBuffer, check_row_outputs
from beam_jax._src.engine.packing import BucketStage, PackedStage
from beam_jax._src.errors import InvalidElementError


def split_element(element: Any, keyed: bool) -> tuple[Any, Any]:
    """``(key, value)`` of one input element (key ``None`` when not ``keyed``).

    Raises:
        InvalidElementError: a keyed element is not a ``(key, value)`` pair, or its key is
            not one Beam can group by.
    """
    if not keyed:
        return None, element
    if not isinstance(element, tuple | list) or len(element) != 2:
        raise InvalidElementError(
            f"keyed=True expects (key, value) pairs, received {describe(element)}."
        )
    key, value = element
    check_key(key)
    return key, value


def validate_element(plan: Plan, element: Any, keyed: bool) -> tuple[Any, Any, Any, Any]:
    """``(key, value, validated, error)`` of one input element: ``validated`` is ``None``
    and ``error`` the exception when the element (or its key) is invalid."""
    key, value = None, element
    try:
        key, value = split_element(element, keyed)
        return key, value, plan.validate(value), None
    except Exception as e:  # noqa: BLE001 - every invalid element is dead-lettered
        return key, value, None, e


class Outputs(Protocol):
    """What becomes of a batch's outputs: the strategy an ``ElementFrontEnd`` is given."""

    per_window: bool
    """Batches keep windows apart (outputs that combine a batch); else a batch may mix
    windows and each result keeps its own element's."""

    def check(self, outputs: Any, batch: PaddedBatch) -> tuple[Any, np.ndarray | bool]:
        """``FrontEnd.check``: ``check_row_outputs`` or ``check_summed_outputs``."""

    def emit(
        self, tags: list[Any], items: list[Validated], outputs: Any, keep: np.ndarray, slot: Any
    ) -> Iterator[Any]:
        """Results of the rows kept from one batch: their tags and validated elements, the
        batch's checked outputs, the kept rows' positions in them (``keep``), and the
        batch's slot (its window, or ``None``)."""

    def finish(self) -> Iterator[Any]:
        """Outputs due when the batches of a bundle or a flush have landed."""


class PerElement:
    """One result per element: the outputs cut per row, each turned into an output by
    ``result(tag, output)`` (e.g. a windowed value)."""

    per_window = False

    def __init__(self, plan: Plan, result: Callable[[Any, Any], Any], metrics: Any = None):
        self._plan = plan
        self._result = result
        self._metrics = metrics

    def check(self, outputs: Any, batch: PaddedBatch) -> tuple[Any, np.ndarray]:
        return check_row_outputs(self._plan, outputs, batch)

    def emit(self, tags, items, outputs, keep, slot) -> Iterator[Any]:
        results = self._plan.split_outputs(outputs, keep, items)
        if self._metrics is not None:
            self._metrics.results.inc(len(results))
        for tag, result in zip(tags, results, strict=True):
            yield self._result(tag, result)

    def finish(self) -> Iterator[Any]:
        return iter(())


class ElementFrontEnd:
    """The ``FrontEnd`` of elements one at a time, for one ``BatchEngine``.

    Build it, then its engine (``BatchEngine(worker, metrics, front, ...)``), then set
    ``front.engine``; feed elements with ``add`` (or ``run_now`` for rows that must run at
    once), and end with ``drain()``, ``engine.flush()`` and ``outputs.finish()``.

    How records reach batches follows the plan: a ``Plan`` buckets them (``BucketStage``),
    a ``PackedPlan`` packs them (``engine/packing.py``'s ``PackedStage``).

    Args:
        plan: the worker's plan (``Plan`` or ``PackedPlan``).
        outputs: the ``Outputs`` strategy.
        dead_letter: ``dead_letter(error, stage, tag)``, the output of one failed element.
    """

    def __init__(
        self, plan: Plan, outputs: Outputs, dead_letter: Callable[[BaseException, str, Any], Any]
    ):
        self._plan = plan
        self.outputs = outputs
        self._dead_letter = dead_letter
        self.engine = None

    @property
    def engine(self) -> BatchEngine | None:
        """The engine this front end feeds (set once, after building it)."""
        return self._engine

    @engine.setter
    def engine(self, engine: BatchEngine | None) -> None:
        self._engine = engine
        # How records reach batches: the plan's policy, handed the engine (composition).
        if engine is None:
            self._stage = None
        elif isinstance(self._plan, PackedPlan):
            self._stage = PackedStage(self._plan, engine, self.outputs.per_window)
        else:
            self._stage = BucketStage(self._plan, engine, self.outputs.per_window)

    # --- what callers use ---------------------------------------------------------------

    def validate(self, tag: Any, value: Any, errors: list[Any]) -> Validated | None:
        """``value`` validated, or ``None`` with its dead letter appended to ``errors``."""
        try:
            return self._plan.validate(value)
        except Exception as e:  # noqa: BLE001 - every invalid element is dead-lettered
            errors.extend(self.engine.reject(e, VALIDATION, [tag]))
            return None

    def validate_many(
        self, tagged: Iterable[tuple[Any, Any]], errors: list[Any]
    ) -> list[tuple[Any, Validated]]:
        """``(tag, value)`` pairs validated a batch at once (``Plan.validate_many``, the
        same results as ``validate`` of each): ``(tag, Validated)`` of those that pass, in
        order; each other's dead letter appended to ``errors``."""
        tags, values = [], []
        for tag, value in tagged:
            tags.append(tag)
            values.append(value)
        items = []
        for tag, result in zip(tags, self._plan.validate_many(values), strict=True):
            if isinstance(result, Validated):
                items.append((tag, result))
            else:
                errors.extend(self.engine.reject(result, VALIDATION, [tag]))
        return items

    def add(self, tag: Any, item: Validated, slot: Any = None) -> Iterator[Any]:
        """Buffer one validated element under its bucket (and ``slot`` when the strategy
        keeps windows apart), or stage it for packing; run a batch once full."""
        return self._stage.add(tag, item, slot)

    def add_many(self, items: Sequence[tuple[Any, Validated]], slot: Any = None) -> Iterator[Any]:
        """``add`` of each ``(tag, Validated)`` pair (``validate_many``'s), a buffer's room
        at a time where the policy buckets."""
        return self._stage.add_many(items, slot)

    def drain(self) -> Iterator[Any]:
        """Run what the policy still stages (packing: records not yet in a full batch);
        call before ``engine.flush()`` at the end of a bundle."""
        return self._stage.drain()

    def reject(self, error: BaseException, tags: Iterable[Any]) -> Iterator[Any]:
        """Elements that failed validation: one dead letter each (or raise)."""
        return self.engine.reject(error, VALIDATION, tags)

    def run_now(self, bucket: Bucket, slot: Any, tagged: Iterable[tuple[Any, Any]]):
        """Validate ``(tag, value)`` pairs of one bucket, run them now (bucketing: as one
        batch; packing: packed into as few batches as they fill), and wait for every batch
        (a cross-bundle flush)."""
        errors: list[Any] = []
        items = self.validate_many(tagged, errors)
        yield from errors
        yield from self._stage.run_now(bucket, slot, items)
        yield from self.engine.flush()
        yield from self.outputs.finish()

    # --- the engine's FrontEnd ----------------------------------------------------------

    def new_buffer(self, bucket: Bucket, slot: Any, capacity: int) -> RowBuffer:
        return RowBuffer(self._plan, bucket, slot)

    def release(self, buffer: RowBuffer) -> None:
        pass

    def check(self, outputs: Any, batch: PaddedBatch):
        return self.outputs.check(outputs, batch)

    def emit(self, buffer: RowBuffer, rows, keep, outputs, batch) -> Iterator[Any]:
        held = buffer.items
        chosen = [held[row] for row in np.asarray(rows)[keep].tolist()]
        tags = [tag for tag, _ in chosen]
        items = [item for _, item in chosen]
        return self.outputs.emit(tags, items, outputs, keep, buffer.slot)

    def source(self, buffer: RowBuffer, row: int) -> Any:
        return buffer.items[row][0]

    def dead_letter(self, error: BaseException, stage: str, source: Any) -> Any:
        return self._dead_letter(error, stage, source)
