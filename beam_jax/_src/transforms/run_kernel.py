"""RunKernel: the per-element front end of the batch engine (pytrees of arrays in and out)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import apache_beam as beam
from typing_extensions import Unpack

from beam_jax._src.core.dead_letter import DEAD_LETTERS
from beam_jax._src.engine.options import KernelOptions, KernelOptionsKwargs
from beam_jax._src.runners.dask_refusals import refuse_beams_dask_runner
from beam_jax._src.transforms.base import KernelTransform
from beam_jax._src.transforms.cross_bundle import CrossBundleDoFn, buffered_outputs
from beam_jax._src.transforms.elements import ElementsDoFn


class RunKernel(KernelTransform):
    """Apply a JAX function to every element, in shape-bucketed, padded, masked batches.

    Elements are validated against ``spec``, grouped per bucket within a bundle, padded to the
    bucket's shape and to one of a few batch sizes, run through ``fn`` (vmapped and jitted
    once per worker process, sharded over its local devices) and cut back per element.
    Where bundles are small (streaming), ``.with_cross_bundle_batching(...)`` keeps rows in
    Beam state across bundles instead (see ``CrossBundle`` and docs/streaming.md).

    Examples:
        >>> import apache_beam as beam, jax, jax.numpy as jnp, numpy as np
        >>> import beam_jax as bj
        >>> def mean(params, element, lengths):  # one element, padded to its bucket
        ...     mask = bj.length_mask(lengths["L"], element["x"].shape[0])
        ...     total = jnp.where(mask[:, None], element["x"], 0.0).sum(0)
        ...     return total / lengths["L"].astype(total.dtype)  # no implicit promotion
        >>> spec = {"x": bj.ArraySpec(("L", 2), np.float32)}
        >>> run = bj.RunKernel(mean, spec=spec, bucketing=bj.Bucketing(boundaries={"L": 8}))
        >>> with jax.numpy_dtype_promotion("strict"), beam.Pipeline("FnApiRunner") as p:
        ...     _ = p | beam.Create([{"x": np.arange(6.0).reshape(3, 2)}]) | run | beam.Map(print)
        [2. 3.]

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
        refuse_beams_dask_runner(pcoll.pipeline, "RunKernel")
        config = self.cross_bundle
        if config is not None and config.applies_to(pcoll):
            front = CrossBundleDoFn(
                self.fn, self.spec, self.options, self._handle_errors, self.keyed,
                start_id=self._start_id,
            )  # fmt: skip
            results, dead = buffered_outputs(
                pcoll, front, config, spec=self.spec, options=self.options,
                handle_errors=self._handle_errors, keyed=self.keyed, main="results",
            )  # fmt: skip
            return self._outputs(pcoll, results, dead)
        dofn = ElementsDoFn(
            self.fn, self.spec, self.options, self._handle_errors, self.keyed,
            start_id=self._start_id,
        )  # fmt: skip
        outputs = pcoll | "RunKernel" >> beam.ParDo(dofn).with_outputs(DEAD_LETTERS, main="results")
        return self._outputs(pcoll, outputs.results, outputs[DEAD_LETTERS])
