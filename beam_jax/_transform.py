"""RunKernel: the Beam transform that buckets, pads, runs and unpads (the thin Beam layer)."""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
import jax
import numpy as np
from apache_beam.transforms import window as beam_window
from apache_beam.utils import shared
from apache_beam.utils.windowed_value import WindowedValue

from beam_jax import _dead_letter as dl
from beam_jax._buckets import Bucket, Bucketing
from beam_jax._errors import DeadLetterThresholdError, InvalidElementError, KernelError, SpecError
from beam_jax._kernel import CompileError, is_out_of_memory
from beam_jax._metrics import NAMESPACE, KernelMetrics
from beam_jax._plan import Plan
from beam_jax._validate import Validated, Validation, check_key
from beam_jax._worker import KernelConfig, Worker

DEAD_LETTERS = "dead_letters"
NONFINITE_OUTPUT = "the kernel returned NaN or Inf for this element."


class RunKernelResult(NamedTuple):
    """The outputs of ``RunKernel(...).with_exception_handling()``."""

    results: beam.PCollection
    dead_letters: beam.PCollection


@dataclasses.dataclass
class _Pending:
    key: Any
    value: Any
    item: Validated
    timestamp: Any
    window: Any


class _Holder:
    # apache_beam.utils.shared needs a weak-referenceable object.
    def __init__(self, worker: Worker):
        self.worker = worker


class WorkerDoFn(beam.DoFn):
    """A DoFn whose instances in one process share one ``Worker`` (params, compiled shapes).

    The base of every beam_jax DoFn: ``setup`` acquires the worker and the metrics.
    """

    def __init__(self, config: KernelConfig, handle_errors: bool, namespace: str):
        self._config = config
        self._handle_errors = handle_errors
        self._namespace = namespace
        self._shared = shared.Shared()
        self._tag = uuid.uuid4().hex

    def setup(self):
        self._holder = self._shared.acquire(lambda: _Holder(Worker(self._config)), tag=self._tag)
        self._worker = self._holder.worker
        self._metrics = KernelMetrics(self._namespace)

    def _report_compiles(self):
        n, seconds = self._worker.take_compile_stats()
        if n:
            self._metrics.compiles.inc(n)
            self._metrics.compile_ms.inc(int(seconds * 1000))


class _RunKernelDoFn(WorkerDoFn):
    def __init__(self, config: KernelConfig, keyed: bool, handle_errors: bool, namespace: str):
        super().__init__(config, handle_errors, namespace)
        self._keyed = keyed

    def start_bundle(self):
        self._buffers: dict[tuple[Bucket, Any], list[_Pending]] = defaultdict(list)

    def process(
        self, element, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam
    ) -> Iterator[Any]:
        self._metrics.elements_in.inc()
        key, value = None, element
        try:
            if self._keyed:
                if not isinstance(element, tuple | list) or len(element) != 2:
                    raise InvalidElementError(
                        f"keyed=True expects (key, value) pairs, received {dl.summarize(element)}."
                    )
                key, value = element
                check_key(key)
            item = self._worker.plan.validate(value)
        except Exception as e:
            if not self._handle_errors:
                raise
            yield self._dead(e, dl.VALIDATION, key, value, timestamp, window)
            return
        bucket = self._worker.plan.bucket_for(item.lengths)
        slot = (bucket, window if self._batch_per_window else None)
        buffer = self._buffers[slot]
        buffer.append(_Pending(key, value, item, timestamp, window))
        if len(buffer) >= self._worker.limit(bucket):
            self._buffers[slot] = []
            yield from self._run(bucket, buffer)

    # Batches may mix windows: each result is emitted in its own element's window. A subclass
    # whose outputs combine a whole batch sets this to keep windows apart.
    _batch_per_window = False

    def finish_bundle(self) -> Iterator[Any]:
        buffers, self._buffers = self._buffers, defaultdict(list)
        for (bucket, _), buffer in buffers.items():
            if buffer:
                yield from self._run(bucket, buffer)

    def _dead(self, error, stage, key, value, timestamp, window):
        self._metrics.dead_letter(stage)
        record = dl.FailedElement.from_exception(error, stage=stage, element=value, key=key)
        return beam.pvalue.TaggedOutput(
            DEAD_LETTERS, WindowedValue(record, timestamp, (window,))
        )

    def _run(self, bucket: Bucket, pending: Sequence[_Pending]) -> Iterator[Any]:
        """Run ``pending`` in chunks of the bucket's current limit.

        Returns (as the generator's value) whether every chunk ran out of memory as a whole.
        """
        all_oom = True
        start = 0
        while start < len(pending):
            limit = self._worker.limit(bucket)
            oom = yield from self._attempt(bucket, pending[start : start + limit])
            all_oom = all_oom and oom
            start += limit
        return all_oom

    def _attempt(self, bucket: Bucket, chunk: Sequence[_Pending]) -> Iterator[Any]:
        """Run one chunk, bisecting it on failure so only failing elements become dead letters.

        A chunk holding k failing elements out of n costs at most ``1 + 2 k ceil(log2 n)``
        kernel calls. Out of memory lowers the bucket's batch limit only when both halves then
        fit, i.e. when the batch size, not one element, was too big.

        Returns (as the generator's value) whether this chunk's own call ran out of memory.
        """
        worker, plan = self._worker, self._worker.plan
        items = [p.item for p in chunk]
        start = time.perf_counter()
        try:
            batch = plan.pad(bucket, items)
            self._metrics.kernel_calls.inc()
            outputs = worker.kernel.run(worker.params, batch, plan.layout.treedef)
        except Exception as e:
            self._report_compiles()
            if not self._handle_errors:
                raise
            oom = is_out_of_memory(e)
            if oom:
                self._metrics.out_of_memory.inc()
            if len(chunk) == 1:
                stage = dl.COMPILE if isinstance(e, CompileError) else dl.KERNEL
                p = chunk[0]
                yield self._dead(e, stage, p.key, p.value, p.timestamp, p.window)
                return oom
            self._metrics.kernel_retries.inc()
            mid = (len(chunk) + 1) // 2
            left_oom = yield from self._run(bucket, chunk[:mid])
            right_oom = yield from self._run(bucket, chunk[mid:])
            if oom and not left_oom and not right_oom and worker.lower_limit(bucket, mid):
                self._metrics.batch_limit_lowered.inc()
            return oom
        self._report_compiles()
        self._metrics.batch_latency_ms.update(int((time.perf_counter() - start) * 1000))
        self._metrics.batches.inc()
        self._metrics.padded_size.inc(batch.padded_volume)
        self._metrics.real_size.inc(sum(math.prod(it.lengths) for it in items))
        yield from self._emit(chunk, batch, outputs)
        return False

    def _emit(self, chunk: Sequence[_Pending], batch, outputs) -> Iterator[Any]:
        """Turn one successful batch's outputs into per-element results or dead letters."""
        plan = self._worker.plan
        items = [p.item for p in chunk]
        try:
            results = plan.unbatch(outputs, batch, items)
        except Exception as e:
            if not self._handle_errors:
                raise
            for p in chunk:
                yield self._dead(e, dl.OUTPUT, p.key, p.value, p.timestamp, p.window)
            return
        check = plan.validation.check_outputs_finite
        for p, result in zip(chunk, results, strict=True):
            if check and not all_finite(result):
                error = KernelError(NONFINITE_OUTPUT)
                if not self._handle_errors:
                    raise error
                yield self._dead(error, dl.OUTPUT, p.key, p.value, p.timestamp, p.window)
                continue
            self._metrics.results.inc()
            out = (p.key, result) if self._keyed else result
            yield WindowedValue(out, p.timestamp, (p.window,))


def all_finite(tree) -> bool:
    """Whether every floating or complex leaf of ``tree`` holds only finite values."""
    return all(
        np.isfinite(leaf).all()
        for leaf in jax.tree_util.tree_leaves(tree)
        if np.asarray(leaf).dtype.kind in "fc"
    )


def _check_threshold(bad: int, total: int, threshold: float):
    if total and bad / total > threshold:
        raise DeadLetterThresholdError(
            f"{bad} of {total} elements failed ({bad / total:.2%}), more than the threshold "
            f"{threshold:.2%}; inspect the dead letters, fix the data or kernel, or raise "
            "with_exception_handling(threshold=...)."
        )


class KernelTransform(beam.PTransform):
    """What RunKernel, RunKernelOnArrow and ReduceKernel share: the kernel's configuration,
    Beam-style exception handling with a failure threshold, and the batching plan.

    Subclasses build their DoFn in ``expand`` and call ``_outputs`` on its tagged outputs.
    """

    _reduce = False

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        spec: Any,
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
        super().__init__()
        self.config = KernelConfig(
            fn=fn,
            spec=spec,
            bucketing=bucketing or Bucketing(),
            validation=validation or Validation(),
            output_spec=output_spec,
            load_params=load_params,
            batched=batched,
            devices=devices,
            precompile=precompile,
            compilation_cache_dir=compilation_cache_dir,
            reduce=self._reduce,
        )
        self.metrics_namespace = metrics_namespace
        self._handle_errors = False
        self._threshold = 1.0
        self._threshold_windowing = None

    def with_exception_handling(self, *, threshold: float = 1.0, threshold_windowing: Any = None):
        """Send failed elements to a dead-letter output instead of failing the bundle.

        The transform then returns ``RunKernelResult(results, dead_letters)``, whose dead
        letters are ``FailedElement`` records, one per failed element.

        Args:
            threshold: the largest tolerated ratio of dead letters to inputs; above it the
                pipeline fails with ``DeadLetterThresholdError``. ``1.0`` never fails.
            threshold_windowing: windowing in which the ratio is computed; default global.
        """
        if not 0.0 <= threshold <= 1.0:
            raise SpecError(f"threshold must be within [0, 1], got {threshold}.")
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._handle_errors = True
        clone._threshold = threshold
        clone._threshold_windowing = threshold_windowing
        return clone

    def plan(self, num_devices: int = 1) -> Plan:
        """The batching plan a worker with ``num_devices`` devices uses (lists all shapes)."""
        c = self.config
        return Plan(
            c.spec,
            c.bucketing,
            validation=c.validation,
            output_spec=c.output_spec,
            num_devices=num_devices,
        )

    def _outputs(self, pcoll, results, dead_letters, count_inputs=lambda _: 1):
        """The transform's result; with a threshold, also the check that enforces it.

        Args:
            count_inputs: how many elements one input holds (rows of an Arrow batch).
        """
        if not self._handle_errors:
            return results
        if self._threshold < 1.0:
            windowing = self._threshold_windowing or beam_window.GlobalWindows()
            total = (
                pcoll
                | "WindowTotal" >> beam.WindowInto(windowing)
                | "CountEach" >> beam.Map(count_inputs)
                | "CountTotal" >> beam.CombineGlobally(sum).as_singleton_view()
            )
            _ = (
                dead_letters
                | "WindowBad" >> beam.WindowInto(windowing)
                | "OneEachBad" >> beam.Map(lambda _: 1)
                | "CountBad" >> beam.CombineGlobally(sum).without_defaults()
                | "CheckThreshold" >> beam.Map(_check_threshold, total, self._threshold)
            )
        return RunKernelResult(results, dead_letters)


class RunKernel(KernelTransform):
    """Apply a JAX function to every element, in shape-bucketed, padded, masked batches.

    Elements are validated against ``spec``, grouped per bucket within a bundle, padded to the
    bucket's shape and to one of a few batch sizes, run through ``fn`` (vmapped and jitted
    once per worker process, sharded over its local devices) and cut back per element.

    Example:
        >>> spec = {"x": ArraySpec(("L", 64), np.float32)}
        >>> def mean(params, element, lengths):
        ...     mask = length_mask(lengths["L"], element["x"].shape[0])
        ...     return (element["x"] * mask[:, None]).sum(0) / lengths["L"]
        >>> run = RunKernel(mean, spec=spec, bucketing=Bucketing(boundaries={"L": 512}))

    Args:
        fn: ``fn(params, element, lengths)`` for one element, or for a batch if
            ``batched=True``.
        spec: an ``ArraySpec`` or a pytree of them describing one element.
        bucketing: bucket boundaries per ragged axis and batch sizes.
        load_params: zero-argument callable run once per worker process; its result is
            placed on the devices and passed to ``fn`` as ``params``.
        validation: input checks (casting, NaN handling, byte limit, output checks).
        output_spec: pytree of ``ArraySpec`` for the per-element outputs; named axes are cut
            back to each element's own length.
        batched: ``fn`` already handles a leading batch axis; don't vmap it.
        keyed: elements are ``(key, value)`` pairs; results are ``(key, output)``.
        devices: the devices of each worker to use; default all local devices.
        precompile: compile every listed shape when a worker starts.
        compilation_cache_dir: enables JAX's persistent compilation cache there.
        metrics_namespace: the Beam metrics namespace.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        spec: Any,
        bucketing: Bucketing | None = None,
        load_params: Callable[[], Any] | None = None,
        validation: Validation | None = None,
        output_spec: Any = None,
        batched: bool = False,
        keyed: bool = False,
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
        self.keyed = keyed

    def expand(self, pcoll):
        dofn = _RunKernelDoFn(self.config, self.keyed, self._handle_errors, self.metrics_namespace)
        outputs = pcoll | "RunKernel" >> beam.ParDo(dofn).with_outputs(DEAD_LETTERS, main="results")
        return self._outputs(pcoll, outputs.results, outputs[DEAD_LETTERS])
