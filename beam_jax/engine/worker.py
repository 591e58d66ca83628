"""What one worker process holds once: parameters on device, the compiled kernel, limits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from beam_jax.core.buckets import Bucket
from beam_jax.core.plan import Plan
from beam_jax.engine.fit import FitReport, fit_batch_limits
from beam_jax.engine.options import KernelOptions
from beam_jax.kernel.cache import enable_compilation_cache
from beam_jax.kernel.compiled import Kernel


def make_plan(spec: Any, options: KernelOptions, num_devices: int = 1) -> Plan:
    """The batching plan of ``spec`` under ``options`` for ``num_devices`` devices."""
    return Plan(
        spec,
        options.bucketing,
        validation=options.validation,
        output_spec=options.output_spec,
        num_devices=num_devices,
    )


class Worker:
    """Per-process state shared by all DoFn instances and threads of one transform.

    Built once per process through ``apache_beam.utils.shared``: parameters are loaded and
    placed on the devices once, and every shape is compiled once.

    Args:
        fn: the function the kernel runs (per element, or batched per ``options.batched``).
        spec: the element spec.
        options: the transform's options.
    """

    def __init__(self, fn: Callable[..., Any], spec: Any, options: KernelOptions):
        if options.compilation_cache_dir:
            enable_compilation_cache(options.compilation_cache_dir)
        self.options = options
        self.kernel = Kernel(fn, batched=options.batched, devices=options.devices)
        self.plan = make_plan(spec, options, self.kernel.num_devices)
        raw = options.load_params() if options.load_params is not None else None
        self.params = self.kernel.put_params(raw)
        self.fit: FitReport | None = None
        if options.fit_to_memory is not None:
            # Batch limits fitted to memory: the plan keeps only the sizes up to them.
            self.fit = fit_batch_limits(self.kernel, self.params, self.plan, options.fit_to_memory)
            self.plan = self.plan.with_batch_limits(
                self.fit.limits, one_size=options.fit_to_memory.one_size
            )
        self._lock = threading.Lock()
        self._limits = {b: self.plan.max_batch(b) for b in self.plan.buckets}
        self._reported = (0, 0.0)
        if options.precompile:
            self.precompile()

    def precompile(self) -> int:
        """Compile every listed shape now; returns how many compiles that took."""
        names = self.plan.layout.axis_names
        shapes = [(self.plan.leaf_shapes(b, s), names) for b, s in self.plan.shapes()]
        return self.kernel.precompile(self.params, shapes, self.plan.layout.treedef)

    def limit(self, bucket: Bucket) -> int:
        """How many elements a batch of ``bucket`` may hold now (lowered after OOM)."""
        return self._limits[bucket]

    def lower_limit(self, bucket: Bucket, new_limit: int) -> bool:
        """Lower ``bucket``'s batch limit to ``new_limit`` for the rest of this worker's life.

        Returns whether the limit changed.
        """
        with self._lock:
            if 1 <= new_limit < self._limits[bucket]:
                self._limits[bucket] = new_limit
                return True
            return False

    def take_compile_stats(self) -> tuple[int, float]:
        """Compiles and compile seconds not yet reported to metrics."""
        with self._lock:
            now = (self.kernel.compiles, self.kernel.compile_seconds)
            done = self._reported
            self._reported = now
        return now[0] - done[0], now[1] - done[1]
