"""RunKernelOnArrow: the columnar RunKernel, from Arrow record batches to Arrow record batches."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.utils.windowed_value import WindowedValue
from typing_extensions import Unpack

from beam_jax._src.arrow.columns import ArrowColumns
from beam_jax._src.arrow.decode import decode_batch
from beam_jax._src.arrow.encode import outputs_to_arrow
from beam_jax._src.arrow.fill import BucketFill, ColumnRecords
from beam_jax._src.arrow.origin import file_rows, row_origin, source_of
from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.core.dead_letter import DEAD_LETTERS, VALIDATION
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.core.plan import Plan
from beam_jax._src.engine.batching import check_row_outputs
from beam_jax._src.engine.options import KernelOptions, KernelOptionsKwargs, make_plan
from beam_jax._src.engine.packing import PackedBuffer, PackedStage
from beam_jax._src.errors import InvalidElementError, SpecError
from beam_jax._src.runners.dask_refusals import refuse_beams_dask_runner
from beam_jax._src.transforms.base import KernelTransform, Source, WorkerDoFn


class _Buckets:
    """Bucketing for record batches: each valid row copied into its bucket's ``BucketFill``,
    a buffer's room at a time; fills are reused (``spare``, per bucket) across batches."""

    def __init__(self, plan: Plan, engine: Any, spare: dict[Bucket, list[BucketFill]]):
        self._plan = plan
        self._engine = engine
        self._spare = spare

    def add(self, decoded, rows: np.ndarray, window, describe) -> Iterator[Any]:
        index = self._plan.bucket_indices(decoded.lengths[rows])
        order = np.argsort(index, kind="stable")
        cuts = np.flatnonzero(np.diff(index[order])) + 1
        for group in np.split(order, cuts):
            bucket = self._plan.buckets[int(index[group[0]])]
            chosen = rows[group]

            def put(fill, start, stop, chosen=chosen):
                fill.add(decoded, chosen[start:stop], describe)

            yield from self._engine.fill(bucket, window, len(chosen), put)

    def drain(self) -> Iterator[Any]:
        return iter(())

    def new_buffer(self, bucket: Bucket, slot: Any, capacity: int) -> BucketFill:
        spare = self._spare[bucket]
        fill = spare.pop() if spare else BucketFill(self._plan, bucket, capacity)
        fill.slot = slot
        return fill

    def release(self, fill: BucketFill) -> None:
        fill.reset()
        self._spare[fill.bucket].append(fill)


class _Packed:
    """Packing for record batches: the valid rows staged as they were decoded
    (``ColumnRecords``: flat values, starts, lengths, ids; no per-row objects) and packed by
    a ``PackedStage``, per window."""

    def __init__(self, plan: PackedPlan, engine: Any):
        self._stage = PackedStage(plan, engine, per_window=True)
        # Per leaf: whether its first axis is the packed one, and its shape past that axis
        # (its whole shape without it).
        self._ragged, self._shapes = [], []
        for spec in plan.layout.specs:
            first = bool(spec.shape) and isinstance(spec.shape[0], str)
            self._ragged.append(first)
            self._shapes.append(tuple(spec.shape[1:] if first else spec.shape))

    def add(self, decoded, rows: np.ndarray, window, describe) -> Iterator[Any]:
        records = ColumnRecords.from_decoded(decoded, rows, self._ragged, self._shapes, describe)
        return self._stage.add_records(records, window)

    def drain(self) -> Iterator[Any]:
        return self._stage.drain()

    def release(self, buffer: PackedBuffer) -> None:
        pass


class _ArrowFrontEnd(WorkerDoFn):
    """Record batches in, record batches out: decode whole columns at once, then bucket or
    pack the valid rows by the plan's policy (``_Buckets`` or ``_Packed``)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        spec: Any,
        options: KernelOptions,
        handle_errors: bool,
        columns: ArrowColumns,
        start_id: str | None = None,
    ):
        super().__init__(fn, spec, options, handle_errors, start_id)
        self._columns = columns

    def setup(self):
        super().setup()
        # The layout is the spec's, whatever the devices: known without waiting for them.
        self._column_names = self._columns.resolve(make_plan(self._spec, self._options).layout)
        # Batch buffers are reused across batches and bundles: spares per bucket.
        self._spare: dict[Bucket, list[BucketFill]] = defaultdict(list)

    def open_bundle(self):
        super().open_bundle()
        plan, engine = self._plan, self._engine
        # How valid rows reach batches: the plan's policy (packing, or buckets).
        if isinstance(plan, PackedPlan):
            self._policy = _Packed(plan, engine)
        else:
            self._policy = _Buckets(plan, engine, self._spare)

    def finish_bundle(self) -> Iterator[Any]:
        if not self._opened:
            return  # no element came
        yield from self._policy.drain()
        yield from super().finish_bundle()

    def process(self, element, window=beam.DoFn.WindowParam) -> Iterator[Any]:
        self.open_bundle_once()
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
            yield from self._engine.reject(
                error, VALIDATION, [Source(None, element, window.max_timestamp(), window)]
            )
            return
        for batch in batches:
            yield from self._process_batch(batch, window)

    def _process_batch(self, batch: pa.RecordBatch, window) -> Iterator[Any]:
        plan = self._plan
        self._metrics.elements_in.inc(batch.num_rows)
        error = None
        try:
            decoded = decode_batch(
                batch,
                layout=plan.layout,
                columns=self._column_names,
                id_column=self._columns.id,
                validation=plan.validation,
                max_sizes=plan.max_sizes,
                truncate=plan.truncate,
                too_long=plan.too_long,
            )
        except SpecError:
            raise  # a missing column: the pipeline is misconfigured, not the data
        except Exception as e:  # noqa: BLE001 - an undecodable batch: each row is dead-lettered
            error = e
        # A row's dead letter names the file and file row it came from, when the batch says.
        read_from = source_of(batch)
        where = {} if read_from is None else {"file": read_from}
        path, rows_at = row_origin(batch)
        timestamp = window.max_timestamp()

        def describe(key, row):
            at = file_rows(rows_at, row)
            return Source(key, {"id": key, "row": row, **where}, timestamp, window, path, at)

        if error is not None:
            ids = batch.column(self._columns.id) if self._columns.id in batch.schema.names else None
            keys = [None if ids is None else ids[r].as_py() for r in range(batch.num_rows)]
            sources = (describe(k, r) for r, k in enumerate(keys))
            yield from self._engine.reject(error, VALIDATION, sources)
            return
        for row in np.flatnonzero(decoded.failed).tolist():
            error = decoded.describe_failure(row)
            yield from self._engine.reject(error, VALIDATION, [describe(decoded.row_key(row), row)])
        ok = np.flatnonzero(~decoded.failed)
        if len(ok):
            yield from self._policy.add(decoded, ok, window, describe)

    # --- the engine's front end -------------------------------------------------------

    def new_buffer(self, bucket: Bucket, slot: Any, capacity: int) -> BucketFill:
        return self._policy.new_buffer(bucket, slot, capacity)

    def release(self, buffer) -> None:
        self._policy.release(buffer)

    def source(self, buffer, row: int) -> Source:
        return buffer.source(row)

    def check(self, outputs, batch):
        return check_row_outputs(self._plan, outputs, batch)

    def emit(self, buffer, rows, keep, outputs, batch) -> Iterator[Any]:
        """A successful batch's kept rows as one record batch."""
        if not len(keep):
            return
        lengths = batch.lengths_matrix(self._plan.layout.axis_names)[keep]
        names, arrays = outputs_to_arrow(outputs, keep, lengths)
        ids = buffer.id_array(rows[keep])
        if ids is not None:
            names, arrays = [self._columns.id, *names], [ids, *arrays]
        self._metrics.results.inc(len(keep))
        out = pa.RecordBatch.from_arrays(arrays, names=names)
        yield WindowedValue(out, buffer.slot.max_timestamp(), (buffer.slot,))


class RunKernelOnArrow(KernelTransform):
    """``RunKernel`` for columnar data: Arrow record batches in, Arrow record batches out.

    Each input ``pyarrow.Table`` or ``RecordBatch`` is validated, bucketed and copied into
    padded batches with vectorised numpy over its list offsets (no per-row Python objects),
    so per-record cost stays far below Beam's per-element cost. Workers share parameters,
    compiled shapes and metrics with ``RunKernel``: ``summarize`` reads both. Results are
    record batches of the ``id`` column plus one column per output leaf; rows that fail
    become one ``FailedElement`` each, keyed by their id.

    Examples:
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
        options: a ``KernelOptions``; keyword options given here override its fields.
        **kwargs: the fields of ``KernelOptions``, as for ``RunKernel``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        spec: Any,
        columns: ArrowColumns | None = None,
        options: KernelOptions | None = None,
        **kwargs: Unpack[KernelOptionsKwargs],
    ):
        super().__init__(fn, spec=spec, options=options, kwargs=kwargs)
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

    def with_cross_bundle_batching(self, config: Any = None, **kwargs: Any):
        """Not for record batches: they arrive batched already.

        Raises:
            SpecError: always; use ``RunKernel`` or ``ReduceKernel`` for elements that
                stream in one at a time.
        """
        raise SpecError(
            f"{type(self).__name__} does not batch across bundles: its inputs are whole "
            "record batches, already batched; use RunKernel or ReduceKernel for "
            "streaming elements one at a time."
        )

    def dofn(self) -> beam.DoFn:
        """The DoFn this transform runs, for a step of one's own that calls it from its
        DoFn (``beam_jax.text.EmbedBatches``: tokenize and embed in one step): its outputs
        are record batches (``WindowedValue``) and, with exception handling, dead letters
        tagged ``DEAD_LETTERS``; it takes the worker ``start_workers()`` started."""
        return _ArrowFrontEnd(
            self.fn, self.spec, self.options, self._handle_errors, self.columns, self._start_id
        )

    def expand(self, pcoll):
        refuse_beams_dask_runner(pcoll.pipeline, "RunKernelOnArrow")
        outputs = pcoll | "RunKernelOnArrow" >> beam.ParDo(self.dofn()).with_output_types(
            pa.RecordBatch
        ).with_outputs(DEAD_LETTERS, main="results")
        return self._outputs(pcoll, outputs.results, outputs[DEAD_LETTERS], count_inputs=_num_rows)


def _num_rows(element) -> int:
    return element.num_rows if isinstance(element, pa.Table | pa.RecordBatch) else 1
