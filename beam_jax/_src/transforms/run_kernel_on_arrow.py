"""RunKernelOnArrow: the columnar RunKernel, from Arrow record batches to Arrow record batches."""

from __future__ import annotations

import functools
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
from beam_jax._src.arrow.io import file_rows, row_origin, source_of
from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.core.dead_letter import DEAD_LETTERS, VALIDATION
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.engine.batching import check_row_outputs
from beam_jax._src.engine.options import KernelOptions, KernelOptionsKwargs, make_plan
from beam_jax._src.engine.packing import PackedBuffer, PackedStage
from beam_jax._src.errors import InvalidElementError, SpecError
from beam_jax._src.runners.dask_refusals import refuse_beams_dask_runner
from beam_jax._src.transforms.base import KernelTransform, Source, WorkerDoFn


class _ArrowFrontEnd(WorkerDoFn):
    """Record batches in, record batches out: decode and bucket whole columns at once."""

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
        self._id_type: pa.DataType | None = None

    def open_bundle(self):
        super().open_bundle()
        # With packing, rows are staged (per window) and packed: PackedStage, not fills.
        packed = isinstance(self._plan, PackedPlan)
        self._stage = PackedStage(self._plan, self._engine, per_window=True) if packed else None

    def finish_bundle(self) -> Iterator[Any]:
        if not self._opened:
            return  # no element came
        if self._stage is not None:
            yield from self._stage.drain()
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

    def _row_source(self, key, element, window, origin=(None, None), row=None) -> Source:
        """A row's ``Source``; ``origin`` is its batch's file and where its rows are in it
        (``row_origin``), ``row`` its row in the batch."""
        path, rows_at = origin
        at = None if row is None else file_rows(rows_at, row)
        return Source(key, element, window.max_timestamp(), window, path, at)

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
            )
        except SpecError:
            raise  # a missing column: the pipeline is misconfigured, not the data
        except Exception as e:  # noqa: BLE001 - an undecodable batch: each row is dead-lettered
            error = e
        # A row's dead letter names the file it came from, when the batch says.
        read_from = source_of(batch)
        where = {} if read_from is None else {"file": read_from}
        origin = row_origin(batch)
        if error is not None:
            ids = batch.column(self._columns.id) if self._columns.id in batch.schema.names else None
            keys = [None if ids is None else ids[r].as_py() for r in range(batch.num_rows)]
            yield from self._engine.reject(
                error,
                VALIDATION,
                (
                    self._row_source(k, {"id": k, "row": r, **where}, window, origin, r)
                    for r, k in enumerate(keys)
                ),
            )
            return
        for row in np.flatnonzero(decoded.failed):
            key = decoded.row_key(int(row))
            yield from self._engine.reject(
                decoded.describe_failure(int(row)),
                VALIDATION,
                [
                    self._row_source(
                        key, {"id": key, "row": int(row), **where}, window, origin, int(row)
                    )
                ],
            )
        ok = np.flatnonzero(~decoded.failed)
        if not len(ok):
            return
        if self._stage is not None:
            yield from self._stage_rows(decoded, ok, window, where, origin)
            return
        index = plan.bucket_indices(decoded.lengths[ok])
        order = np.argsort(index, kind="stable")
        cuts = np.flatnonzero(np.diff(index[order])) + 1
        for group in np.split(order, cuts):
            bucket = plan.buckets[int(index[group[0]])]
            rows = ok[group]
            while len(rows):
                fill = self._engine.buffer(bucket, window)
                take = self._engine.room(fill)
                fill.add(decoded, rows[:take], origin)
                rows = rows[take:]
                yield from self._engine.added(fill)

    def _stage_rows(self, decoded, ok, window, where, origin) -> Iterator[Any]:
        """Packing: the valid rows staged as they were decoded (``ColumnRecords``: flat
        values, starts, lengths, ids), with no per-row objects; a row's dead-letter
        ``Source`` is made only if it fails."""
        if decoded.ids is not None:
            self._id_type = decoded.ids.type
        timestamp = window.max_timestamp()
        path, rows_at = origin

        def describe(key, row):
            at = file_rows(rows_at, row)
            return Source(key, {"id": key, "row": row, **where}, timestamp, window, path, at)

        records = ColumnRecords.from_decoded(decoded, ok, *self._packed_leaves, describe)
        yield from self._stage.add_records(records, window)

    @functools.cached_property
    def _packed_leaves(self) -> tuple[list[bool], list[tuple[int, ...]]]:
        """Per leaf: whether its first axis is the packed one, and its shape past that axis
        (its whole shape without it)."""
        ragged, shapes = [], []
        for spec in self._plan.layout.specs:
            first = bool(spec.shape) and isinstance(spec.shape[0], str)
            ragged.append(first)
            shapes.append(tuple(spec.shape[1:] if first else spec.shape))
        return ragged, shapes

    # --- the engine's front end -------------------------------------------------------

    def new_buffer(self, bucket: Bucket, slot: Any, capacity: int) -> BucketFill:
        spare = self._spare[bucket]
        fill = spare.pop() if spare else BucketFill(self._plan, bucket, capacity)
        fill.slot = slot
        return fill

    def release(self, fill: BucketFill) -> None:
        if isinstance(fill, PackedBuffer):
            return
        fill.reset()
        self._spare[fill.bucket].append(fill)

    def source(self, fill: BucketFill, row: int) -> Source:
        if isinstance(fill, PackedBuffer):
            return fill.records.source(row)
        ids = fill.id_column()
        key = None if ids is None else ids[row].as_py()
        names = self._plan.layout.axis_names
        lengths = dict(zip(names, fill.lengths[row].tolist(), strict=True))
        path, at = fill.origin(row)
        return self._row_source(key, {"id": key, "lengths": lengths}, fill.slot, (path, at), 0)

    def check(self, outputs, batch):
        return check_row_outputs(self._plan, outputs, batch)

    def emit(self, fill, rows, keep, outputs, batch) -> Iterator[Any]:
        """A successful batch's kept rows as one record batch."""
        if isinstance(fill, PackedBuffer):  # records of several input batches: ids by row
            names, arrays = outputs_to_arrow(outputs, keep, np.zeros((len(keep), 1), np.int64))
            if self._id_type is not None:
                ids = fill.records.id_array(rows[keep], self._id_type)
                names, arrays = [self._columns.id, *names], [ids, *arrays]
            if len(keep):
                self._metrics.results.inc(len(keep))
                out = pa.RecordBatch.from_arrays(arrays, names=names)
                yield WindowedValue(out, fill.slot.max_timestamp(), (fill.slot,))
            return
        lengths = batch.lengths_matrix(self._plan.layout.axis_names)[keep]
        names, arrays = outputs_to_arrow(outputs, keep, lengths)
        ids = fill.id_column()
        if ids is not None:
            picked = rows[keep]
            whole = len(picked) == len(ids) and (picked == np.arange(len(ids))).all()
            names = [self._columns.id, *names]
            arrays = [ids if whole else ids.take(pa.array(picked)), *arrays]
        if len(keep):
            self._metrics.results.inc(len(keep))
            out = pa.RecordBatch.from_arrays(arrays, names=names)
            yield WindowedValue(out, fill.slot.max_timestamp(), (fill.slot,))


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
