"""ReduceKernel: a JAX function summed over a whole PCollection (e.g. a full-batch gradient)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import jax
import numpy as np
from apache_beam.utils.windowed_value import WindowedValue
from typing_extensions import Unpack

from beam_jax._src.core.dead_letter import DEAD_LETTERS
from beam_jax._src.core.dtypes import kind
from beam_jax._src.core.plan import Plan
from beam_jax._src.engine.batching import check_summed_outputs
from beam_jax._src.engine.options import KernelOptions, KernelOptionsKwargs
from beam_jax._src.errors import KernelError, SpecError
from beam_jax._src.kernel.wrappers import SumRows, SumSegments
from beam_jax._src.runners.dask_refusals import refuse_beams_dask_runner
from beam_jax._src.transforms.base import KernelTransform
from beam_jax._src.transforms.cross_bundle import CrossBundleDoFn, buffered_outputs
from beam_jax._src.transforms.elements import ElementsDoFn


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
    # Float leaves (bfloat16 too) are summed in float64 and remember their dtype, so billions
    # of float32 partial sums lose no precision before the one cast at the end.
    return jax.tree_util.tree_map(
        lambda x: (
            np.asarray(x, np.float64) if kind(np.asarray(x).dtype) == "f" else np.asarray(x),
            str(np.asarray(x).dtype),
        ),
        tree,
    )


def _is_pair(x):
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str)


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return jax.tree_util.tree_map(_add_leaf, a, b, is_leaf=_is_pair)


def _add_leaf(x: tuple, y: tuple) -> tuple:
    if x[0].shape != y[0].shape:  # numpy would broadcast, or fail without saying why
        raise KernelError(
            f"ReduceKernel sums outputs of one shape, but the kernel returned {x[0].shape} for "
            f"some elements and {y[0].shape} for others: an output that follows the bucket's "
            "padded length (one value per padded position) cannot be summed across buckets. "
            "Reduce over the ragged axis in the kernel (masked with length_mask), or use "
            "RunKernel with an output_spec for per-position outputs."
        )
    return (x[0] + y[0], x[1])


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


class Summed:
    """ReduceKernel's ``Outputs`` strategy: one partial sum per window and bundle (or flush).

    The kernel runs the user's function wrapped by ``SumRows``, so each batch comes back
    already summed over its real rows; batches never mix windows.
    """

    per_window = True

    def __init__(self, plan: Plan, metrics: Any):
        self._plan = plan
        self._metrics = metrics
        self._sums: dict[Any, tuple[Any, int]] = {}

    def check(self, outputs, batch):
        return check_summed_outputs(self._plan, outputs, batch)

    def emit(self, tags, items, outputs, keep, slot) -> Iterator[Any]:
        total, count = self._sums.get(slot, (None, 0))
        partial = jax.tree_util.tree_map(lambda x: np.sum(x, axis=0), outputs)
        self._sums[slot] = (_add(total, _to_accumulator(partial)), count + len(keep))
        self._metrics.results.inc(len(keep))
        return iter(())

    def finish(self) -> Iterator[Any]:
        sums, self._sums = self._sums, {}
        for window, partial in sums.items():
            yield WindowedValue(partial, window.max_timestamp(), (window,))


class ReduceKernel(KernelTransform):
    """Sum a per-element JAX function over a whole PCollection, in bucketed padded batches.

    The full-dataset counterpart of ``RunKernel``, e.g. a full-batch gradient: each batch is
    summed on the device (padded rows masked out), then per bundle and across workers, in
    bounded memory. One ``Reduction(total, count)`` comes out per window.

    Examples:
        >>> def grad(params, element, lengths):
        ...     return jax.grad(loss)(params, element, lengths)  # doctest: +SKIP
        >>> full = examples | ReduceKernel(grad, spec=spec, load_params=load)  # doctest: +SKIP
        >>> # full: PCollection of one Reduction; .total is the summed gradient pytree

    Args:
        fn: as for ``RunKernel`` (per-row or, with ``packing``, per-segment outputs), summed
            over the real rows or segments.
        spec: as for ``RunKernel``.
        keyed: elements are ``(key, value)``; keys only label dead letters.
        options: a ``KernelOptions``; keyword options given here override its fields.
        **kwargs: the fields of ``KernelOptions``, as for ``RunKernel`` (no ``output_spec``).

    ``.with_exception_handling(threshold=...)`` works as for ``RunKernel``; ``results`` then
    holds the ``Reduction``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        spec: Any,
        keyed: bool = False,
        options: KernelOptions | None = None,
        **kwargs: Unpack[KernelOptionsKwargs],
    ):
        super().__init__(fn, spec=spec, options=options, kwargs=kwargs)
        if self.options.output_spec is not None:
            raise SpecError(
                "ReduceKernel sums whole outputs, so output_spec (which cuts per-element "
                f"outputs to their lengths) does not apply; got {self.options.output_spec!r}."
            )
        if self.options.chunk_units is not None:
            raise SpecError(
                "ReduceKernel sums each batch whole, so chunk_units (which runs a batch's "
                f"rows in chunks) does not apply; got chunk_units={self.options.chunk_units!r}. "
                "Lower the batch size instead."
            )
        self.keyed = keyed

    def expand(self, pcoll):
        refuse_beams_dask_runner(pcoll.pipeline, "ReduceKernel")
        # Wrap, don't flag: the kernel runs the user's function summed over real rows (with
        # packing: over the real segments of every packed row).
        sum_of = SumSegments if self.options.packing is not None else SumRows
        summed = sum_of(self.fn, batched=self.options.batched)
        options = dataclasses.replace(self.options, batched=True)
        config = self.cross_bundle
        if config is not None and config.applies_to(pcoll):
            front = CrossBundleDoFn(
                summed, self.spec, options, self._handle_errors, self.keyed, outputs=Summed
            )
            partials, dead = buffered_outputs(
                pcoll, front, config, spec=self.spec, options=options,
                handle_errors=self._handle_errors, keyed=self.keyed, main="partials",
            )  # fmt: skip
        else:
            dofn = ElementsDoFn(
                summed, self.spec, options, self._handle_errors, self.keyed, outputs=Summed
            )
            outputs = pcoll | "SumBatches" >> beam.ParDo(dofn).with_outputs(
                DEAD_LETTERS, main="partials"
            )
            partials, dead = outputs.partials, outputs[DEAD_LETTERS]
        combine = beam.CombineGlobally(_SumPartials())
        if not pcoll.windowing.is_default():
            combine = combine.without_defaults()
        total = partials | "SumPartials" >> combine
        return self._outputs(pcoll, total, dead)
