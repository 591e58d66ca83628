"""RunKernelOnArrow: the columnar RunKernel, from Arrow record batches to Arrow record batches."""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import jax
import numpy as np
import pyarrow as pa
from apache_beam.utils.windowed_value import WindowedValue

from beam_jax import _dead_letter as dl
from beam_jax._buckets import Bucketing
from beam_jax._columnar import decode_batch
from beam_jax._columnar_batch import BucketFill, outputs_to_arrow
from beam_jax._columns import ArrowColumns
from beam_jax._errors import InvalidElementError, KernelError, SpecError
from beam_jax._kernel import CompileError, is_out_of_memory
from beam_jax._metrics import NAMESPACE
from beam_jax._transform import DEAD_LETTERS, KernelTransform, WorkerDoFn
from beam_jax._validate import Validation
from beam_jax._worker import KernelConfig


@dataclasses.dataclass
class _InFlight:
    """A batch whose kernel call was dispatched but whose outputs are not fetched yet."""

    fill: BucketFill
    window: Any
    outputs: Any
    num_real: int
    size: int
    started: float


class _RunKernelOnArrowDoFn(WorkerDoFn):
    def __init__(
        self, config: KernelConfig, columns: ArrowColumns, handle_errors: bool, namespace: str
    ):
        super().__init__(config, handle_errors, namespace)
        self._columns = columns

    def setup(self):
        super().setup()
        plan = self._worker.plan
        self._column_names = self._columns.resolve(plan.layout)
        self._bounds = [np.asarray(b, np.int64) for b in plan.boundaries]
        # Batch buffers are reused across batches and bundles: spares per bucket.
        self._spare: dict[Any, list[BucketFill]] = defaultdict(list)

    def start_bundle(self):
        self._fills: dict[Any, BucketFill] = {}
        self._inflight: _InFlight | None = None

    def _fill(self, window, bucket) -> BucketFill:
        key = (window, bucket)
        fill = self._fills.get(key)
        if fill is None:
            spare = self._spare[bucket]
            if spare:
                fill = spare.pop()
            else:
                fill = BucketFill(self._worker.plan, bucket, self._worker.plan.max_batch(bucket))
            self._fills[key] = fill
        return fill

    def _recycle(self, fill: BucketFill) -> None:
        fill.reset()
        self._spare[fill.bucket].append(fill)

    def process(self, element, window=beam.DoFn.WindowParam) -> Iterator[Any]:
        if isinstance(element, pa.Table):
            batches = element.to_batches()
        elif isinstance(element, pa.RecordBatch):
            batches = [element]
        else:
            self._metrics.elements_in.inc()
            error = InvalidElementError(
                f"RunKernelOnArrow expects pyarrow Tables or RecordBatches, received "
                f"{type(element).__name__}; read with ReadArrowBatches or "
                "beam.io.ReadFromParquetBatched."
            )
            if not self._handle_errors:
                raise error
            yield self._dead(error, dl.VALIDATION, None, element, window)
            return
        for batch in batches:
            yield from self._process_batch(batch, window)

    def finish_bundle(self) -> Iterator[Any]:
        fills, self._fills = self._fills, {}
        for (window, _), fill in fills.items():
            if fill.size:
                yield from self._launch(fill, window)
            else:
                self._recycle(fill)
        yield from self._land()

    def _process_batch(self, batch: pa.RecordBatch, window) -> Iterator[Any]:
        plan = self._worker.plan
        self._metrics.elements_in.inc(batch.num_rows)
        try:
            decoded = decode_batch(
                batch,
                layout=plan.layout,
                columns=self._column_names,
                id_column=self._columns.id,
                validation=plan.validation,
                max_sizes=plan.max_sizes,
                truncate=plan.bucketing.oversize == "truncate",
            )
        except SpecError:
            raise  # a missing column: the pipeline is misconfigured, not the data
        except Exception as e:  # noqa: BLE001 - an undecodable batch: each row is dead-lettered
            if not self._handle_errors:
                raise
            ids = batch.column(self._columns.id) if self._columns.id in batch.schema.names else None
            for row in range(batch.num_rows):
                key = None if ids is None else ids[row].as_py()
                yield self._dead(e, dl.VALIDATION, key, {"id": key, "row": row}, window)
            return
        for row in np.flatnonzero(decoded.failed):
            error = decoded.describe_failure(int(row))
            if not self._handle_errors:
                raise error
            key = decoded.row_key(int(row))
            yield self._dead(error, dl.VALIDATION, key, {"id": key, "row": int(row)}, window)
        ok = np.flatnonzero(~decoded.failed)
        if not len(ok):
            return
        index = [
            np.searchsorted(b, decoded.lengths[ok, k], side="left")
            for k, b in enumerate(self._bounds)
        ]
        flat = (
            np.ravel_multi_index(index, [len(b) for b in self._bounds])
            if index
            else np.zeros(len(ok), np.int64)
        )
        order = np.argsort(flat, kind="stable")
        cuts = np.flatnonzero(np.diff(flat[order])) + 1
        for group in np.split(order, cuts):
            first = group[0]
            bucket = tuple(int(self._bounds[k][index[k][first]]) for k in range(len(index)))
            rows = ok[group]
            while len(rows):
                fill = self._fill(window, bucket)
                take = max(0, min(fill.free, self._worker.limit(bucket) - fill.size))
                fill.add(decoded, rows[:take])
                rows = rows[take:]
                if fill.size >= self._worker.limit(bucket):
                    del self._fills[(window, bucket)]
                    yield from self._launch(fill, window)

    def _dead(self, error, stage, key, value, window):
        self._metrics.dead_letter(stage)
        record = dl.FailedElement.from_exception(error, stage=stage, element=value, key=key)
        return beam.pvalue.TaggedOutput(
            DEAD_LETTERS, WindowedValue(record, window.max_timestamp(), (window,))
        )

    def _row_dead(self, error, stage, fill: BucketFill, ids, row: int, window):
        key = None if ids is None else ids[row].as_py()
        names = self._worker.plan.layout.axis_names
        lengths = dict(zip(names, fill.lengths[row].tolist(), strict=True))
        return self._dead(error, stage, key, {"id": key, "lengths": lengths}, window)

    def _launch(self, fill: BucketFill, window) -> Iterator[Any]:
        """Finish the batch in flight, then start the kernel on ``fill`` without waiting.

        The device runs one batch while the host decodes and copies the rows of the next,
        so their work overlaps (one batch at a time, so they never compete with each other;
        a shape seen for the first time is compiled before the batch in flight is waited
        for, so compiling overlaps it too). The fill's buffers stay untouched until its
        batch lands.
        """
        worker, plan = self._worker, self._worker.plan
        leaves, lengths, n, size = fill.batch()
        signature = [(x.shape, x.dtype) for x in leaves]
        worker.kernel.precompile(worker.params, [(signature, tuple(lengths))], plan.layout.treedef)
        yield from self._land()
        started = time.perf_counter()
        try:
            self._metrics.kernel_calls.inc()
            pending = worker.kernel.dispatch(
                worker.params, leaves, lengths, treedef=plan.layout.treedef
            )
        except Exception as e:  # e.g. a shape that failed to compile: bisect right away
            self._report_compiles()
            if not self._handle_errors:
                raise
            yield from self._failed(e, fill, np.arange(fill.size), window)
            self._recycle(fill)
            return
        self._report_compiles()
        self._inflight = _InFlight(fill, window, pending, n, size, started)

    def _land(self) -> Iterator[Any]:
        """Wait for the batch in flight, if any, and emit its results."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        fill, window = inflight.fill, inflight.window
        rows = np.arange(fill.size)
        try:
            outputs = jax.device_get(inflight.outputs)
        except Exception as e:
            if not self._handle_errors:
                raise
            yield from self._failed(e, fill, rows, window)
        else:
            yield from self._emit(
                fill, rows, outputs, inflight.num_real, inflight.size, inflight.started, window
            )
        self._recycle(fill)

    def _run(self, fill: BucketFill, rows: np.ndarray, window) -> Iterator[Any]:
        """Run ``rows`` of ``fill`` in chunks of the bucket's current limit.

        Returns (as the generator's value) whether every chunk ran out of memory as a whole.
        """
        all_oom = True
        start = 0
        while start < len(rows):
            limit = self._worker.limit(fill.bucket)
            oom = yield from self._attempt(fill, rows[start : start + limit], window)
            all_oom = all_oom and oom
            start += limit
        return all_oom

    def _attempt(self, fill: BucketFill, rows: np.ndarray, window) -> Iterator[Any]:
        """Run ``rows`` of ``fill`` and wait, bisecting on failure down to the failing rows.

        Returns (as the generator's value) whether this chunk's own call ran out of memory.
        """
        worker, plan = self._worker, self._worker.plan
        whole = len(rows) == fill.size
        started = time.perf_counter()
        try:
            leaves, lengths, n, size = fill.batch(None if whole else rows)
            self._metrics.kernel_calls.inc()
            outputs = worker.kernel.call(
                worker.params, leaves, lengths, treedef=plan.layout.treedef
            )
        except Exception as e:
            self._report_compiles()
            if not self._handle_errors:
                raise
            return (yield from self._failed(e, fill, rows, window))
        self._report_compiles()
        yield from self._emit(fill, rows, outputs, n, size, started, window)
        return False

    def _failed(self, error, fill: BucketFill, rows: np.ndarray, window) -> Iterator[Any]:
        """Dead-letter one failed row, or bisect failed rows (as RunKernel does).

        Returns (as the generator's value) whether the failure was out of memory.
        """
        oom = is_out_of_memory(error)
        if oom:
            self._metrics.out_of_memory.inc()
        if len(rows) == 1:
            stage = dl.COMPILE if isinstance(error, CompileError) else dl.KERNEL
            yield self._row_dead(error, stage, fill, fill.id_column(), int(rows[0]), window)
            return oom
        self._metrics.kernel_retries.inc()
        mid = (len(rows) + 1) // 2
        left_oom = yield from self._run(fill, rows[:mid], window)
        right_oom = yield from self._run(fill, rows[mid:], window)
        if oom and not left_oom and not right_oom and self._worker.lower_limit(fill.bucket, mid):
            self._metrics.batch_limit_lowered.inc()
        return oom

    def _emit(self, fill, rows, outputs, n, size, started, window) -> Iterator[Any]:
        """Count a successful batch and emit its rows as one record batch."""
        plan = self._worker.plan
        whole = len(rows) == fill.size
        self._metrics.batch_latency_ms.update(int((time.perf_counter() - started) * 1000))
        self._metrics.batches.inc()
        self._metrics.padded_size.inc(size * int(np.prod(fill.bucket)))
        self._metrics.real_size.inc(fill.real_volume(None if whole else rows))
        all_ids = fill.id_column()
        try:
            names, arrays, nonfinite = outputs_to_arrow(
                outputs,
                plan=plan,
                num_real=n,
                size=size,
                lengths=fill.lengths[rows] if not whole else fill.lengths[: fill.size],
                check_finite=plan.validation.check_outputs_finite,
            )
        except Exception as e:
            if not self._handle_errors:
                raise
            for row in rows:
                yield self._row_dead(e, dl.OUTPUT, fill, all_ids, int(row), window)
            return
        if all_ids is not None:
            ids = all_ids if whole else all_ids.take(pa.array(rows))
            names, arrays = [self._columns.id, *names], [ids, *arrays]
        if nonfinite.any():
            error = KernelError("the kernel returned NaN or Inf for this row.")
            if not self._handle_errors:
                raise error
            for i in np.flatnonzero(nonfinite):
                yield self._row_dead(error, dl.OUTPUT, fill, all_ids, int(rows[i]), window)
            keep = pa.array(np.flatnonzero(~nonfinite))
            arrays = [a.take(keep) for a in arrays]
        out = pa.RecordBatch.from_arrays(arrays, names=names)
        if out.num_rows:
            self._metrics.results.inc(out.num_rows)
            yield WindowedValue(out, window.max_timestamp(), (window,))


class RunKernelOnArrow(KernelTransform):
    """``RunKernel`` for columnar data: Arrow record batches in, Arrow record batches out.

    Each input ``pyarrow.Table`` or ``RecordBatch`` is validated, bucketed and copied into
    padded batches with vectorised numpy over its list offsets (no per-row Python objects),
    so per-record cost stays far below Beam's per-element cost. Workers share parameters,
    compiled shapes and metrics with ``RunKernel``: ``summarize`` reads both. Results are
    record batches of the ``id`` column plus one column per output leaf; rows that fail
    become one ``FailedElement`` each, keyed by their id.

    Example:
        >>> import beam_jax as bj, numpy as np
        >>> run = bj.RunKernelOnArrow(
        ...     lambda params, element, lengths: element["x"].sum(0),
        ...     spec={"x": bj.ArraySpec(("L", 64), np.float32)},
        ...     columns=bj.ArrowColumns(leaves={"x": "x"}, id="id"),
        ...     bucketing=bj.Bucketing(boundaries={"L": 512}))

    Args:
        fn: ``fn(params, element, lengths)`` for one element (or a batch if ``batched``).
        spec: an ``ArraySpec`` or a pytree of them; ragged axes only first in each leaf.
        columns: which column feeds which leaf, and the id column; see ``ArrowColumns``.
        bucketing, load_params, validation, output_spec, batched, devices, precompile,
        compilation_cache_dir, metrics_namespace: as for ``RunKernel``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        spec: Any,
        columns: ArrowColumns | None = None,
        bucketing: Bucketing | None = None,
        load_params: Callable[[], Any] | None = None,
        validation: Validation | None = None,
        output_spec: Any = None,
        batched: bool = False,
        devices: Sequence[Any] | str | None = None,
        precompile: bool = False,
        compilation_cache_dir: str | None = None,
        metrics_namespace: str = NAMESPACE,
    ):
        super().__init__(
            fn,
            spec=spec,
            bucketing=bucketing,
            load_params=load_params,
            validation=validation,
            output_spec=output_spec,
            batched=batched,
            devices=devices,
            precompile=precompile,
            compilation_cache_dir=compilation_cache_dir,
            metrics_namespace=metrics_namespace,
        )
        self.columns = columns or ArrowColumns()
        if not isinstance(self.columns, ArrowColumns):
            raise SpecError(f"columns must be an ArrowColumns, got {self.columns!r}.")
        plan = self.plan()
        self.columns.resolve(plan.layout)
        if plan.output_layout is not None:
            for spec in plan.output_layout.specs:
                if any(axis > 0 for axis, _ in spec.ragged_axes):
                    raise SpecError(
                        f"output_spec leaf of shape {spec.shape}: Arrow outputs carry a "
                        "ragged axis only as a leaf's first axis."
                    )

    def expand(self, pcoll):
        dofn = _RunKernelOnArrowDoFn(
            self.config, self.columns, self._handle_errors, self.metrics_namespace
        )
        outputs = pcoll | "RunKernelOnArrow" >> beam.ParDo(dofn).with_output_types(
            pa.RecordBatch
        ).with_outputs(DEAD_LETTERS, main="results")
        return self._outputs(
            pcoll, outputs.results, outputs[DEAD_LETTERS], count_inputs=_num_rows
        )


def _num_rows(element) -> int:
    return element.num_rows if isinstance(element, pa.Table | pa.RecordBatch) else 1
