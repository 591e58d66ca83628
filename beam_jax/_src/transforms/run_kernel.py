"""RunKernel: the per-element front end of the batch engine (pytrees of arrays in and out)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.utils.windowed_value import WindowedValue
from typing_extensions import Unpack

from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.core.dead_letter import DEAD_LETTERS, VALIDATION
from beam_jax._src.engine.batching import RowBuffer, check_row_outputs
from beam_jax._src.engine.options import KernelOptions, KernelOptionsKwargs
from beam_jax._src.transforms.base import KernelTransform, Source, WorkerDoFn, validate_element
from beam_jax._src.transforms.cross_bundle import CrossBundleFrontEnd, buffered_outputs


class ElementsFrontEnd(WorkerDoFn):
    """The engine's front end for one element at a time: validate, buffer, unbatch.

    ``per_window`` keeps each window's elements in batches of their own (for front ends
    whose outputs combine a batch); otherwise a batch may mix windows and each result is
    emitted in its own element's window.
    """

    per_window = False

    def __init__(self, fn, spec, options, handle_errors, keyed: bool):
        super().__init__(fn, spec, options, handle_errors)
        self._keyed = keyed

    def process(
        self, element, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam
    ) -> Iterator[Any]:
        self._metrics.elements_in.inc()
        key, value, item, error = validate_element(self._plan, element, self._keyed)
        source = Source(key, value, timestamp, window)
        if error is not None:
            yield from self._engine.reject(error, VALIDATION, [source])
            return
        buffer = self._engine.buffer(
            self._plan.bucket_for(item.lengths), window if self.per_window else None
        )
        buffer.items.append((source, item))
        yield from self._engine.added(buffer)

    def new_buffer(self, bucket: Bucket, slot: Any, capacity: int) -> RowBuffer:
        return RowBuffer(self._plan, bucket, slot)

    def source(self, buffer: RowBuffer, row: int) -> Source:
        return buffer.items[row][0]

    def check(self, outputs, batch):
        return check_row_outputs(self._plan, outputs, batch)

    def emit(self, buffer, rows, keep, outputs, batch) -> Iterator[Any]:
        chosen = [buffer.items[int(rows[k])] for k in keep]
        results = self._plan.split_outputs(outputs, keep, [item for _, item in chosen])
        self._metrics.results.inc(len(results))
        for (source, _), result in zip(chosen, results, strict=True):
            out = (source.key, result) if self._keyed else result
            yield WindowedValue(out, source.timestamp, (source.window,))


class _BufferedElements(CrossBundleFrontEnd, ElementsFrontEnd):
    """RunKernel's front end in cross-bundle mode: elements buffered in Beam state."""


class RunKernel(KernelTransform):
    """Apply a JAX function to every element, in shape-bucketed, padded, masked batches.

    Elements are validated against ``spec``, grouped per bucket within a bundle, padded to the
    bucket's shape and to one of a few batch sizes, run through ``fn`` (vmapped and jitted
    once per worker process, sharded over its local devices) and cut back per element.
    Where bundles are small (streaming), ``.with_cross_bundle_batching(...)`` keeps rows in
    Beam state across bundles instead (see ``CrossBundle`` and docs/streaming.md).

    Examples:
        >>> import numpy as np
        >>> import beam_jax as bj
        >>> spec = {"x": bj.ArraySpec(("L", 64), np.float32)}
        >>> def mean(params, element, lengths):
        ...     mask = bj.length_mask(lengths["L"], element["x"].shape[0])
        ...     return (element["x"] * mask[:, None]).sum(0) / lengths["L"]
        >>> run = bj.RunKernel(mean, spec=spec, bucketing=bj.Bucketing(boundaries={"L": 512}))

    Args:
        fn: ``fn(params, element, lengths)`` for one element, or for a batch if
            ``batched=True``.
        spec: an ``ArraySpec`` or a pytree of them describing one element.
        keyed: elements are ``(key, value)`` pairs; results are ``(key, output)``.
        options: a ``KernelOptions``; keyword options given here override its fields.
        **kwargs: the fields of ``KernelOptions`` (``bucketing``, ``load_params``,
            ``validation``, ``output_spec``, ``batched``, ``devices``, ``precompile``,
            ``compilation_cache_dir``, ``metrics_namespace``).
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
        self.keyed = keyed

    def expand(self, pcoll):
        config = self.cross_bundle
        if config is not None and config.applies_to(pcoll):
            front = _BufferedElements(
                self.fn, self.spec, self.options, self._handle_errors, self.keyed
            )
            results, dead = buffered_outputs(
                pcoll, front, config, spec=self.spec, options=self.options,
                handle_errors=self._handle_errors, keyed=self.keyed, main="results",
            )  # fmt: skip
            return self._outputs(pcoll, results, dead)
        dofn = ElementsFrontEnd(self.fn, self.spec, self.options, self._handle_errors, self.keyed)
        dofn._start_id = self._start_id  # takes the worker start_workers() started, if any
        outputs = pcoll | "RunKernel" >> beam.ParDo(dofn).with_outputs(DEAD_LETTERS, main="results")
        return self._outputs(pcoll, outputs.results, outputs[DEAD_LETTERS])
