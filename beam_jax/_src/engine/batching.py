"""The batch engine: the one mechanism under every kernel transform (no Beam here).

Per DoFn instance, the engine owns the buffers (one per bucket and slot, e.g. window),
chunking by each bucket's batch limit, dispatch with a bounded number of batches in flight,
bisection of failed batches down to the failing rows, out-of-memory splitting, the output
check, per-batch metrics, and the one failure path. Front ends (``FrontEnd``) supply only
what differs: the buffers, how outputs become results, how a row is described in a dead
letter. How records fill batch rows is the plan's ``row_policy`` (``OwnRows`` or packing's
``SharedRows``).

The bisection bound: a batch of ``n`` records holding ``k`` failing ones costs at most
``1 + 2 k ceil(log2 n)`` kernel calls. Packed records are bisected the same way; where
records share rows, a batch whose output check fails runs its failing records again apart,
since row-mates share a row's computation, within the same bound.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import jax
import numpy as np

from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.core.dead_letter import COMPILE, KERNEL, OUTPUT
from beam_jax._src.core.outputs import all_finite, nonfinite_rows, require_arrays
from beam_jax._src.core.plan import PaddedBatch, Plan
from beam_jax._src.engine.fit import record_fit_miss
from beam_jax._src.engine.worker import Worker
from beam_jax._src.errors import CompileError, KernelError
from beam_jax._src.kernel.compiled import is_out_of_memory

NONFINITE_OUTPUT = "the kernel returned NaN or Inf for this element."


class Buffer(Protocol):
    """Rows of one bucket waiting for the kernel."""

    bucket: Bucket
    slot: Any

    @property
    def size(self) -> int:
        """How many rows it holds."""

    def padded(self, rows: np.ndarray | None = None) -> PaddedBatch:
        """All rows, or ``rows`` of them, as one padded batch."""


class RowBuffer:
    """A ``Buffer`` of validated elements, each with its front end's tag (where it came
    from): ``items`` holds ``(tag, Validated)`` pairs, padded by ``plan`` on demand."""

    def __init__(self, plan: Plan, bucket: Bucket, slot: Any):
        self.bucket = bucket
        self.slot = slot
        self.items: list[tuple[Any, Any]] = []
        self._plan = plan

    @property
    def size(self) -> int:
        return len(self.items)

    def padded(self, rows: np.ndarray | None = None) -> PaddedBatch:
        chosen = self.items if rows is None else [self.items[int(r)] for r in rows]
        return self._plan.pad(self.bucket, [item for _, item in chosen])


class FrontEnd(Protocol):
    """What a transform's DoFn tells the engine."""

    def new_buffer(self, bucket: Bucket, slot: Any, capacity: int) -> Buffer:
        """An empty buffer for ``bucket`` and ``slot`` with room for ``capacity`` rows."""

    def release(self, buffer: Buffer) -> None:
        """``buffer``'s batch has landed: it may be reused."""

    def check(self, outputs: Any, batch: PaddedBatch) -> tuple[Any, np.ndarray | bool]:
        """``(checked outputs, bad)``: ``bad`` flags rows (``bool[num_real]``) or the
        whole batch (a ``bool``) whose outputs are not finite. Raises ``KernelError`` when
        the outputs break the contract. See ``check_row_outputs``/``check_summed_outputs``."""

    def emit(
        self, buffer: Buffer, rows: np.ndarray, keep: np.ndarray, outputs: Any, batch: PaddedBatch
    ) -> Iterator[Any]:
        """Results of a batch padded from ``rows`` of ``buffer``; ``keep`` indexes the batch
        rows to emit (the others were dead-lettered)."""

    def source(self, buffer: Buffer, row: int) -> Any:
        """What ``dead_letter`` needs to describe row ``row`` of ``buffer``."""

    def dead_letter(self, error: BaseException, stage: str, source: Any) -> Any:
        """The dead-letter output of one row."""


def check_row_outputs(plan: Plan, outputs: Any, batch: PaddedBatch) -> tuple[Any, np.ndarray]:
    """The output check of per-row kernels: the contract, then finiteness per row."""
    checked, lengths = plan.row_outputs(outputs, batch)
    if not plan.validation.check_outputs_finite:
        return checked, np.zeros(len(lengths), bool)
    return checked, nonfinite_rows(checked, lengths)


def check_summed_outputs(plan: Plan, outputs: Any, batch: PaddedBatch) -> tuple[Any, bool]:
    """The output check of a batch summed on the device: some array, finiteness of the sum."""
    require_arrays(outputs)
    return outputs, plan.validation.check_outputs_finite and not all_finite(outputs)


def fetch_on_cpu(outputs: Any) -> Any:
    return jax.tree_util.tree_map(np.asarray, outputs)


@dataclasses.dataclass
class _InFlight:
    buffer: Buffer
    batch: PaddedBatch
    outputs: Any
    started: float


class BatchEngine:
    """Buffers, runs and bisects batches for one DoFn instance.

    Args:
        worker: the process's shared worker (plan, kernel, params, batch limits).
        metrics: a ``KernelMetrics``.
        front: the front end.
        handle_errors: dead-letter failed rows; otherwise raise the first failure.
        report_compiles: called after each kernel call, to report new compiles.
        max_in_flight: batches dispatched and not yet fetched, at most; default 2 on an
            accelerator (a batch's results are handed on while the next one runs), 1 on
            CPUs (whose cores run the kernel).
    """

    def __init__(
        self,
        worker: Worker,
        metrics: Any,
        front: FrontEnd,
        *,
        handle_errors: bool,
        report_compiles: Callable[[], None],
        max_in_flight: int | None = None,
    ):
        self._worker = worker
        self._plan = worker.plan
        self._rows = worker.plan.row_policy  # how records fill batch rows
        self._metrics = metrics
        self._front = front
        self._handle_errors = handle_errors
        self._report_compiles = report_compiles
        on_cpu = all(d.platform == "cpu" for d in worker.kernel.devices)
        if max_in_flight is None:
            max_in_flight = 1 if on_cpu else 2
        # Outputs to the host: on CPUs ``np.asarray`` waits for each leaf (``device_get``'s
        # early host copies keep the waiting thread busy); elsewhere they overlap transfers.
        self._fetch = fetch_on_cpu if on_cpu else jax.device_get
        self._max_in_flight = max_in_flight
        self._buffers: dict[tuple[Bucket, Any], Buffer] = {}
        self._inflight: collections.deque[_InFlight] = collections.deque()
        # Full buffers whose shape the worker is still compiling at start-up: they wait
        # here, not blocking ready shapes' batches, until compiled (or too many wait).
        self._waiting: collections.deque[Buffer] = collections.deque()
        self._max_waiting = 8 * len(self._plan.buckets)

    # --- what front ends call ---------------------------------------------------------

    def buffer(self, bucket: Bucket, slot: Any = None) -> Buffer:
        """The buffer new rows of ``bucket`` in ``slot`` go to."""
        key = (bucket, slot)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._front.new_buffer(bucket, slot, self._plan.max_batch(bucket))
            self._buffers[key] = buffer
        return buffer

    def room(self, buffer: Buffer) -> int:
        """How many more rows ``buffer`` takes before its batch is full."""
        return max(0, self._worker.limit(buffer.bucket) - buffer.size)

    def fill(
        self, bucket: Bucket, slot: Any, count: int, put: Callable[[Buffer, int, int], None]
    ) -> Iterator[Any]:
        """Add ``count`` rows of ``bucket`` in ``slot`` a buffer's room at a time:
        ``put(buffer, start, stop)`` adds rows ``start:stop`` to ``buffer``, and each
        buffer that fills launches."""
        start = 0
        while start < count:
            buffer = self.buffer(bucket, slot)
            stop = min(count, start + max(1, self.room(buffer)))  # 0: a lowered limit
            put(buffer, start, stop)
            start = stop
            yield from self.added(buffer)

    def added(self, buffer: Buffer) -> Iterator[Any]:
        """Rows were added to ``buffer``: launch its batch if it is full."""
        if buffer.size >= self._worker.limit(buffer.bucket):
            del self._buffers[(buffer.bucket, buffer.slot)]
            if self._worker.ready(buffer.bucket, buffer.size):
                yield from self._launch(buffer)
            else:
                self._waiting.append(buffer)
        if self._waiting:
            yield from self._launch_waiting()

    def flush(self) -> Iterator[Any]:
        """Run every buffered row and wait for every batch (end of a bundle)."""
        buffers, self._buffers = self._buffers, {}
        while self._waiting:
            # Ready shapes first, then the shape the worker will have compiled soonest.
            yield from self._launch_waiting()
            if self._waiting:
                soonest = min(self._waiting, key=self._worker.compile_rank)
                self._waiting.remove(soonest)
                yield from self._launch(soonest)
        for buffer in buffers.values():
            if buffer.size:
                yield from self._launch(buffer)
            else:
                self._front.release(buffer)
        while self._inflight:
            yield from self._land()

    def launch(self, buffer: Buffer) -> Iterator[Any]:
        """Run ``buffer``'s rows now, full or not (cross-bundle mode: a buffer read back from
        Beam state); like a full buffer, its batch lands at a later launch or ``flush``."""
        yield from self._launch(buffer)

    def reject(self, error: BaseException, stage: str, sources: Iterable[Any]) -> Iterator[Any]:
        """The one failure path: raise ``error`` when errors are not handled, else one dead
        letter per source (the front end's description of a row)."""
        if not self._handle_errors:
            raise error
        for source in sources:
            self._metrics.dead_letter(stage)
            yield self._front.dead_letter(error, stage, source)

    # --- running batches --------------------------------------------------------------

    def _launch_waiting(self) -> Iterator[Any]:
        """Launch the waiting buffers whose shape is compiled now; the oldest regardless
        while more than ``_max_waiting`` wait (so rows never pile up without bound)."""
        waiting, self._waiting = self._waiting, collections.deque()
        for buffer in waiting:
            if self._worker.ready(buffer.bucket, buffer.size):
                yield from self._launch(buffer)
            else:
                self._waiting.append(buffer)
        while len(self._waiting) > self._max_waiting:
            yield from self._launch(self._waiting.popleft())

    def _launch(self, buffer: Buffer) -> Iterator[Any]:
        """Start ``buffer``'s batch without waiting for it (waiting for the oldest in flight
        once the bound is reached), so the host's next padding overlaps the device's run."""
        worker = self._worker
        units = self._rows.units(buffer)
        limit = worker.limit(buffer.bucket)
        self._metrics.batch_filled(units, limit)
        if units > limit:  # the limit was lowered meanwhile
            yield from self._run(buffer, np.arange(buffer.size))
            self._front.release(buffer)
            return
        error = None
        try:
            batch = buffer.padded()
            # A shape seen for the first time compiles while the batch in flight runs.
            kernel, treedef = worker.kernel, self._plan.kernel_treedef
            names = tuple(sorted(batch.lengths))
            if kernel.compiled_for(batch.leaves, names, treedef) is None:
                signature = [(x.shape, x.dtype) for x in batch.leaves]
                compiled = kernel.precompile(worker.params, [(signature, names)], treedef)
                if compiled:
                    self._metrics.bucket_compiles(buffer.bucket, compiled)
        except Exception as e:  # noqa: BLE001 - handled below, outside this block
            error = e
        while len(self._inflight) >= self._max_in_flight:
            yield from self._land()
        ran = error is None
        if ran:
            started = time.perf_counter()
            self._metrics.kernel_calls.inc()
            try:
                outputs = self._dispatch(batch)
            except Exception as e:  # noqa: BLE001 - e.g. a shape that failed to compile
                error = e
        self._report_compiles()
        if error is not None:
            # Bisect outside the except block: an error raised while another is being
            # handled would chain (and repeat) every earlier error's text.
            yield from self._failed(
                error, buffer, np.arange(buffer.size), ran=batch if ran else None
            )
            self._front.release(buffer)
            return
        self._inflight.append(_InFlight(buffer, batch, outputs, started))

    def _dispatch(self, batch: PaddedBatch) -> Any:
        """Start the kernel on ``batch``; its outputs are fetched with ``_fetch``."""
        worker = self._worker
        return worker.kernel.dispatch(
            worker.params,
            batch.leaves,
            batch.lengths,
            treedef=self._plan.kernel_treedef,
            num_real=batch.num_real,
        )

    def _land(self) -> Iterator[Any]:
        """Wait for the oldest batch in flight and emit its results."""
        inflight = self._inflight.popleft()
        rows = np.arange(inflight.buffer.size)
        error = None
        waited = time.perf_counter()
        try:
            outputs = self._fetch(inflight.outputs)
        except Exception as e:  # noqa: BLE001 - an error raised while running
            error = e
        self._metrics.result_wait_us.inc(int((time.perf_counter() - waited) * 1e6))
        if error is not None:
            yield from self._failed(error, inflight.buffer, rows, ran=inflight.batch)
        else:
            yield from self._succeeded(
                inflight.buffer, rows, inflight.batch, outputs, inflight.started
            )
        self._front.release(inflight.buffer)

    def _run(self, buffer: Buffer, rows: np.ndarray) -> Iterator[Any]:
        """Run ``rows`` of ``buffer`` now, in chunks of the bucket's current limit.

        Returns (as the generator's value) whether every chunk ran out of memory as a whole.
        """
        all_oom = True
        start = 0
        while start < len(rows):
            take = self._rows.take(buffer, rows[start:], self._worker.limit(buffer.bucket))
            oom = yield from self._attempt(buffer, rows[start : start + take])
            all_oom = all_oom and oom
            start += take
        return all_oom

    def _attempt(self, buffer: Buffer, rows: np.ndarray) -> Iterator[Any]:
        """Run one chunk and wait; on failure bisect it down to the failing rows.

        Returns (as the generator's value) whether this chunk's own call ran out of memory.
        """
        started = time.perf_counter()
        error, batch = None, None
        try:
            batch = buffer.padded(None if len(rows) == buffer.size else rows)
            self._metrics.kernel_calls.inc()
            outputs = self._fetch(self._dispatch(batch))
        except Exception as e:  # noqa: BLE001 - handled below, outside this block
            error = e
        self._report_compiles()
        if error is not None:
            return (yield from self._failed(error, buffer, rows, ran=batch))
        yield from self._succeeded(buffer, rows, batch, outputs, started)
        return False

    def _failed(
        self,
        error: BaseException,
        buffer: Buffer,
        rows: np.ndarray,
        stage: str | None = None,
        ran: PaddedBatch | None = None,
    ) -> Iterator[Any]:
        """Dead-letter one failed row, or split failed rows in two and run each half.

        Out of memory lowers the bucket's batch limit only when both halves then fit, i.e.
        when the batch size, not one element, was too big. Where the kernel ``ran`` a batch
        whose program it had loaded from its store and that program failed, the program is
        compiled anew (``Kernel.forget_loaded``) and the rows run again whole, unbisected.

        Returns (as the generator's value) whether the failure was out of memory.
        """
        oom = is_out_of_memory(error)
        if ran is not None and not oom and not isinstance(error, CompileError):
            names = tuple(sorted(ran.lengths))
            treedef = self._plan.kernel_treedef
            if self._worker.kernel.forget_loaded(ran.leaves, names, treedef, error):
                self._metrics.kernel_retries.inc()
                return (yield from self._run(buffer, rows))
        if not self._handle_errors:
            raise error
        if oom:
            self._metrics.out_of_memory.inc()
            n = min(self._rows.units(buffer, rows), self._plan.max_batch(buffer.bucket))
            size = self._plan.padded_batch_size(buffer.bucket, n)
            record_fit_miss(self._worker.fit, self._metrics, buffer.bucket, size)
        if len(rows) == 1:
            if stage is None:
                stage = COMPILE if isinstance(error, CompileError) else KERNEL
            yield from self._dead(error, stage, buffer, rows)
            return oom
        self._metrics.kernel_retries.inc()
        mid = (len(rows) + 1) // 2
        left_oom = yield from self._run(buffer, rows[:mid])
        right_oom = yield from self._run(buffer, rows[mid:])
        if oom and not left_oom and not right_oom:
            fits = max(self._rows.units(buffer, rows[:mid]), self._rows.units(buffer, rows[mid:]))
            if self._worker.lower_limit(buffer.bucket, fits):
                self._metrics.batch_limit_lowered.inc()
        return oom

    def _succeeded(
        self, buffer: Buffer, rows: np.ndarray, batch: PaddedBatch, outputs: Any, started: float
    ) -> Iterator[Any]:
        """Count a successful call, check its outputs and hand them to the front end."""
        latency_ms = int((time.perf_counter() - started) * 1000)
        self._metrics.batch_succeeded(
            buffer.bucket, len(rows), batch.padded_volume, batch.real_volume, latency_ms
        )
        error = None
        try:
            checked, bad = self._front.check(outputs, batch)
        except KernelError as e:  # the outputs break the contract: every row fails alike
            error = e
        # Where records share batch rows, a kernel that mixes a row's records (a sum over
        # the row, 0 * Inf in a one-hot product) gives the others a bad output too: the
        # failing records run again apart, each half one call, so only a record that fails
        # alone is a dead letter.
        apart = self._rows.shares_rows
        if error is not None:
            if apart and len(rows) > 1:
                yield from self._failed(error, buffer, rows, OUTPUT)
            else:
                yield from self._dead(error, OUTPUT, buffer, rows)
            return
        if isinstance(bad, bool | np.bool_):
            if bad:  # a whole-batch result is not finite: find the rows responsible
                yield from self._failed(KernelError(NONFINITE_OUTPUT), buffer, rows, OUTPUT)
                return
            keep = np.arange(len(rows))
        else:
            if bad.any():
                failing = rows[bad]
                if not apart or len(rows) == 1:
                    yield from self._dead(KernelError(NONFINITE_OUTPUT), OUTPUT, buffer, failing)
                elif len(failing) > 1:
                    yield from self._failed(KernelError(NONFINITE_OUTPUT), buffer, failing, OUTPUT)
                else:  # one record: alone in a batch now
                    self._metrics.kernel_retries.inc()
                    yield from self._run(buffer, failing)
            keep = np.flatnonzero(~bad)
        yield from self._front.emit(buffer, rows, keep, checked, batch)

    def _dead(
        self, error: BaseException, stage: str, buffer: Buffer, rows: np.ndarray
    ) -> Iterator[Any]:
        front = self._front
        yield from self.reject(error, stage, (front.source(buffer, int(r)) for r in rows))
