"""The DoFn of elements one at a time (RunKernel, ReduceKernel): Beam's side of the engine's
``ElementFrontEnd``, with the ``Outputs`` strategy handed in."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.utils.windowed_value import WindowedValue

from beam_jax._src.core.plan import Plan
from beam_jax._src.engine.elements import ElementFrontEnd, PerElement, validate_element
from beam_jax._src.engine.options import KernelOptions
from beam_jax._src.transforms.base import Source, WorkerDoFn, dead_letter_output


def _windowed(keyed: bool, source: Source, result: Any) -> WindowedValue:
    """RunKernel's result of one element: in its own timestamp and window, keyed if it was."""
    out = (source.key, result) if keyed else result
    return WindowedValue(out, source.timestamp, (source.window,))


def per_element(keyed: bool, plan: Plan, metrics: Any) -> PerElement:
    """RunKernel's ``Outputs`` strategy: one windowed result per element."""
    return PerElement(plan, functools.partial(_windowed, keyed), metrics)


class ElementsDoFn(WorkerDoFn):
    """A DoFn of elements one at a time, holding the engine's ``ElementFrontEnd``.

    Args:
        fn, spec, options, handle_errors: as for ``WorkerDoFn``.
        keyed: elements are ``(key, value)`` pairs.
        outputs: ``outputs(plan, metrics)`` builds the ``Outputs`` strategy of each bundle:
            ``per_element`` (RunKernel, the default) or ReduceKernel's ``Summed``.
        start_id: as for ``WorkerDoFn``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        spec: Any,
        options: KernelOptions,
        handle_errors: bool,
        keyed: bool,
        outputs: Callable[[Plan, Any], Any] | None = None,
        start_id: str | None = None,
    ):
        super().__init__(fn, spec, options, handle_errors, start_id)
        self._keyed = keyed
        self._outputs = outputs or functools.partial(per_element, keyed)

    def open_bundle(self):
        strategy = self._outputs(self._plan, self._metrics)
        self._front = ElementFrontEnd(self._plan, strategy, dead_letter_output)
        self._engine = self._front.engine = self.new_engine(self._front)

    def process(
        self, element, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam
    ) -> Iterator[Any]:
        self.open_bundle_once()
        self._metrics.elements_in.inc()
        key, value, item, error = validate_element(self._plan, element, self._keyed)
        source = Source(key, value, timestamp, window)
        if error is not None:
            yield from self._front.reject(error, [source])
            return
        yield from self._front.add(source, item, window)

    def finish_bundle(self) -> Iterator[Any]:
        if not self._opened:
            return  # no element came
        yield from self._front.drain()
        yield from super().finish_bundle()
        yield from self._front.outputs.finish()
