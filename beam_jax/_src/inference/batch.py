"""One RunInference batch through the engine, as columns: the handler's front end.

A batch's elements are checked at once (``check_batch``: no ``Validated`` per element),
grouped by bucket, and each bucket's rows launched as one ``Columns`` buffer through the
``BatchEngine`` (its launch, landing, bisection and metrics); results go into a list by
element index, with no generator per element. With packing the handler uses the element
front end instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.core.batch_validation import check_batch
from beam_jax._src.core.dead_letter import VALIDATION
from beam_jax._src.core.outputs import split_rows
from beam_jax._src.core.plan import PaddedBatch, Plan
from beam_jax._src.engine.batching import BatchEngine, check_row_outputs


@dataclasses.dataclass
class Columns:
    """Rows of one bucket of a batch (a ``Buffer``): per leaf, the rows' arrays; per row,
    its ragged lengths and its element's index in the batch."""

    plan: Plan
    bucket: Bucket
    leaves: list[list]
    lengths: np.ndarray
    index: np.ndarray
    slot: Any = None

    @property
    def size(self) -> int:
        return len(self.index)

    def padded(self, rows: np.ndarray | None = None) -> PaddedBatch:
        if rows is None:
            return self.plan.pad_columns(self.bucket, self.leaves, self.lengths.T)
        picked = rows.tolist()
        leaves = [[column[r] for r in picked] for column in self.leaves]
        return self.plan.pad_columns(self.bucket, leaves, self.lengths[rows].T)


class BatchResults:
    """The engine's front end for one batch: ``results[i]`` is element ``i``'s output,
    ``failures`` holds ``(index, stage, error)`` per failed element."""

    def __init__(self, plan: Plan, size: int):
        self.results: list[Any] = [None] * size
        self.failures: list[tuple[int, str, BaseException]] = []
        self._plan = plan

    def run(self, engine: BatchEngine, batch: Sequence[Any]) -> None:
        """Check ``batch``, then run its rows bucket by bucket and wait for them; the
        kernel runs only if every element is valid (a failed batch fails whole)."""
        plan = self._plan
        layout = plan.layout
        checked = check_batch(layout, batch, validation=plan.validation, max_sizes=plan.max_sizes)
        if checked is None:  # checks that read every value: each element validated alone
            flat = [None] * len(batch)
            lengths = np.zeros((len(batch), len(layout.axis_names)), np.int64)
            todo = range(len(batch))
        else:
            flat, lengths = checked.flat, checked.lengths
            todo = np.flatnonzero(~checked.ok).tolist()
        for i in todo:
            try:
                item = plan.validate(batch[i])
            except Exception as e:  # noqa: BLE001 - every invalid element is reported
                drain(engine.reject(e, VALIDATION, [i]))
                continue
            flat[i], lengths[i] = item.leaves, item.lengths
        if self.failures or not len(batch):
            return
        index = plan.bucket_indices(lengths)
        order = np.argsort(index, kind="stable")
        for group in np.split(order, np.flatnonzero(np.diff(index[order])) + 1):
            rows = group.tolist()
            leaves = [[flat[i][j] for i in rows] for j in range(len(layout.specs))]
            bucket = plan.buckets[int(index[group[0]])]
            drain(engine.launch(Columns(plan, bucket, leaves, lengths[group], group)))
        drain(engine.flush())

    # --- the engine's front end ---------------------------------------------------------

    def release(self, buffer: Columns) -> None:
        pass

    def check(self, outputs: Any, batch: PaddedBatch) -> tuple[Any, np.ndarray]:
        return check_row_outputs(self._plan, outputs, batch)

    def emit(self, buffer: Columns, rows, keep, outputs, batch) -> Iterator[Any]:
        picked = rows[keep]
        values = split_rows(outputs, keep, lengths=buffer.lengths[picked])
        for i, value in zip(buffer.index[picked].tolist(), values, strict=True):
            self.results[i] = value
        return iter(())

    def source(self, buffer: Columns, row: int) -> int:
        return int(buffer.index[row])

    def dead_letter(self, error: BaseException, stage: str, index: int) -> None:
        self.failures.append((index, stage, error))


def drain(outputs: Iterator[Any]) -> None:
    """Run ``outputs`` to their end (the handler keeps no engine output)."""
    for _ in outputs:
        pass
