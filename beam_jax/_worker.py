"""What one worker process holds once: parameters on device, the compiled kernel, limits."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax

from beam_jax._buckets import Bucket, Bucketing
from beam_jax._errors import SpecError
from beam_jax._kernel import Kernel, device_indices
from beam_jax._plan import Plan
from beam_jax._validate import Validation


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Everything needed to build a worker's kernel; picklable, shipped with the DoFn."""

    fn: Callable[..., Any]
    spec: Any
    bucketing: Bucketing
    validation: Validation
    output_spec: Any = None
    load_params: Callable[[], Any] | None = None
    batched: bool = False
    devices: Sequence[Any] | str | None = None
    precompile: bool = False
    compilation_cache_dir: str | None = None
    reduce: bool = False

    def __post_init__(self):
        if not callable(self.fn):
            raise SpecError(f"the kernel fn must be callable, got {self.fn!r}.")
        if self.load_params is not None and not callable(self.load_params):
            raise SpecError(
                f"load_params must be a zero-argument callable returning the parameters, got "
                f"{self.load_params!r}."
            )
        Plan(self.spec, self.bucketing, validation=self.validation, output_spec=self.output_spec)
        if self.devices is not None and not isinstance(self.devices, str):
            # Device objects cannot be pickled into a DoFn; workers re-resolve the indices.
            object.__setattr__(self, "devices", device_indices(self.devices))


def enable_compilation_cache(directory: str) -> None:
    """Turn on JAX's persistent compilation cache in ``directory`` for this process."""
    if "://" not in directory:
        os.makedirs(directory, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != directory:
        # JAX opens its cache once per process; a new directory needs it reopened.
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


class Worker:
    """Per-process state shared by all DoFn instances and threads of one transform.

    Built once per process through ``apache_beam.utils.shared``: parameters are loaded and
    placed on the devices once, and every shape is compiled once.
    """

    def __init__(self, config: KernelConfig):
        if config.compilation_cache_dir:
            enable_compilation_cache(config.compilation_cache_dir)
        self.config = config
        self.kernel = Kernel(
            config.fn, batched=config.batched, devices=config.devices, reduce=config.reduce
        )
        self.plan = Plan(
            config.spec,
            config.bucketing,
            validation=config.validation,
            output_spec=config.output_spec,
            num_devices=self.kernel.num_devices,
        )
        raw = config.load_params() if config.load_params is not None else None
        self.params = self.kernel.put_params(raw)
        self._lock = threading.Lock()
        self._limits = {b: self.plan.max_batch(b) for b in self.plan.buckets}
        self._reported = (0, 0.0)
        if config.precompile:
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
