"""ReduceKernel: a JAX function summed over a whole PCollection (e.g. a full-batch gradient)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import jax
import numpy as np
from apache_beam.utils.windowed_value import WindowedValue

from beam_jax import _dead_letter as dl
from beam_jax._buckets import Bucketing
from beam_jax._errors import KernelError
from beam_jax._metrics import NAMESPACE
from beam_jax._transform import (
    DEAD_LETTERS,
    NONFINITE_OUTPUT,
    KernelTransform,
    _Pending,
    _RunKernelDoFn,
    all_finite,
)
from beam_jax._validate import Validation


@dataclasses.dataclass(frozen=True)
class Reduction:
    """The sum of a kernel's outputs over every element that succeeded.

    Attributes:
        total: the summed outputs (the kernel's output pytree, in its dtypes; floating sums
            are accumulated in float64 across batches and workers before the final cast).
            ``None`` when no element succeeded.
        count: how many elements were summed (divide by it for a mean).
    """

    total: Any
    count: int

    def mean(self) -> Any:
        """``total / count``, leaf by leaf."""
        if not self.count:
            raise ValueError("no element was reduced; the mean is undefined.")
        return jax.tree_util.tree_map(lambda t: np.asarray(t) / self.count, self.total)


def _to_accumulator(tree: Any) -> Any:
    # Float leaves are summed in float64 and remember their dtype, so billions of float32
    # partial sums lose no precision before the one cast at the end.
    return jax.tree_util.tree_map(
        lambda x: (np.asarray(x, np.float64) if np.asarray(x).dtype.kind == "f" else np.asarray(x),
                   str(np.asarray(x).dtype)),
        tree,
    )


def _is_pair(x):
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str)


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return jax.tree_util.tree_map(lambda x, y: (x[0] + y[0], x[1]), a, b, is_leaf=_is_pair)


def _finish(acc: Any) -> Any:
    if acc is None:
        return None
    return jax.tree_util.tree_map(lambda x: x[0].astype(x[1]), acc, is_leaf=_is_pair)


class _SumPartials(beam.CombineFn):
    def create_accumulator(self):
        return (None, 0)

    def add_input(self, acc, partial):
        return (_add(acc[0], partial[0]), acc[1] + partial[1])

    def merge_accumulators(self, accs):
        total, count = None, 0
        for t, c in accs:
            total, count = _add(total, t), count + c
        return (total, count)

    def extract_output(self, acc):
        return Reduction(_finish(acc[0]), acc[1])


class _ReduceDoFn(_RunKernelDoFn):
    _batch_per_window = True

    def start_bundle(self):
        super().start_bundle()
        self._sums: dict[Any, tuple[Any, int]] = {}

    def _emit(self, chunk: Sequence[_Pending], batch, outputs) -> Iterator[Any]:
        if self._worker.plan.validation.check_outputs_finite and not all_finite(outputs):
            # The sum is not finite: find the elements responsible, sum the rest.
            error = KernelError(NONFINITE_OUTPUT)
            if not self._handle_errors:
                raise error
            if len(chunk) == 1:
                p = chunk[0]
                yield self._dead(error, dl.OUTPUT, p.key, p.value, p.timestamp, p.window)
                return
            self._metrics.kernel_retries.inc()
            mid = (len(chunk) + 1) // 2
            yield from self._run(batch.bucket, chunk[:mid])
            yield from self._run(batch.bucket, chunk[mid:])
            return
        window = chunk[0].window
        total, count = self._sums.get(window, (None, 0))
        self._sums[window] = (_add(total, _to_accumulator(outputs)), count + len(chunk))
        self._metrics.results.inc(len(chunk))

    def finish_bundle(self) -> Iterator[Any]:
        yield from super().finish_bundle()
        sums, self._sums = self._sums, {}
        for window, partial in sums.items():
            yield WindowedValue(partial, window.max_timestamp(), (window,))


class ReduceKernel(KernelTransform):
    """Sum a per-element JAX function over a whole PCollection, in bucketed padded batches.

    The full-dataset counterpart of ``RunKernel``, e.g. a full-batch gradient: each batch is
    summed on the device with padded rows masked out, partial sums are added per bundle and
    then combined across workers. Elements stay in bounded mini-batches, so memory does not
    grow with the dataset. One ``Reduction(total, count)`` comes out per window.

    Example:
        >>> def grad(params, element, lengths):
        ...     return jax.grad(loss)(params, element, lengths)  # doctest: +SKIP
        >>> full = examples | ReduceKernel(grad, spec=spec, load_params=load)  # doctest: +SKIP
        >>> # full: PCollection of one Reduction; .total is the summed gradient pytree

    Args:
        fn, spec, bucketing, load_params, validation, batched, devices, precompile,
            compilation_cache_dir, metrics_namespace: as for ``RunKernel``. A ``batched``
            function returns per-row outputs; they are summed over the real rows.
        keyed: elements are ``(key, value)``; keys only label dead letters.

    ``.with_exception_handling(threshold=...)`` works as for ``RunKernel``; ``results`` then
    holds the ``Reduction``.
    """

    _reduce = True

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        spec: Any,
        bucketing: Bucketing | None = None,
        load_params: Callable[[], Any] | None = None,
        validation: Validation | None = None,
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
            batched=batched,
            devices=devices,
            precompile=precompile,
            compilation_cache_dir=compilation_cache_dir,
            metrics_namespace=metrics_namespace,
        )
        self.keyed = keyed

    def expand(self, pcoll):
        dofn = _ReduceDoFn(self.config, self.keyed, self._handle_errors, self.metrics_namespace)
        outputs = pcoll | "SumBatches" >> beam.ParDo(dofn).with_outputs(
            DEAD_LETTERS, main="partials"
        )
        combine = beam.CombineGlobally(_SumPartials())
        if not pcoll.windowing.is_default():
            combine = combine.without_defaults()
        total = outputs.partials | "SumPartials" >> combine
        return self._outputs(pcoll, total, outputs[DEAD_LETTERS])
