"""What one worker process holds once: parameters on device, the compiled kernel, limits."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.engine.fit import FitReport, fit_batch_limits
from beam_jax._src.engine.options import KernelOptions, make_kernel
from beam_jax._src.kernel.cache import enable_compilation_cache
from beam_jax._src.kernel.precompile import BackgroundCompile
from beam_jax._src.probe import tpu_host_buffer_advice

_LOG = logging.getLogger(__name__)


class Worker:
    """Per-process state shared by all DoFn instances and threads of one transform.

    Built once per process through ``apache_beam.utils.shared``: parameters are loaded and
    placed on the devices once, and every shape is compiled once. On a TPU it logs a
    warning where its largest batch moves an array larger than the TPU's host buffer
    (:func:`~beam_jax._src.probe.tpu_host_buffer_advice`).

    Args:
        fn: the function the kernel runs (per element, or batched per ``options.batched``).
        spec: the element spec.
        options: the transform's options.
    """

    def __init__(self, fn: Callable[..., Any], spec: Any, options: KernelOptions):
        if options.compilation_cache_dir:
            enable_compilation_cache(options.compilation_cache_dir)
        self.options = options
        self.kernel, self.plan = make_kernel(fn, spec, options)
        raw = options.load_params() if options.load_params is not None else None
        self.params = self.kernel.put_params(raw)
        self.fit: FitReport | None = None
        if options.fit_to_memory is not None:
            # Batch limits fitted to memory: the plan keeps only the sizes up to them.
            self.fit = fit_batch_limits(self.kernel, self.params, self.plan, options.fit_to_memory)
            self.plan = self.plan.with_batch_limits(
                self.fit.limits, one_size=options.fit_to_memory.one_size
            )
        if self.kernel.platform == "tpu":
            advice = tpu_host_buffer_advice(self._largest_transfer())
            if advice is not None:
                _LOG.warning("beam_jax: %s", advice)
        self._lock = threading.Lock()
        self._limits = {b: self.plan.max_batch(b) for b in self.plan.buckets}
        self._reported = (0, 0.0, 0.0, 0.0)
        self._background: BackgroundCompile | None = None
        self._compile_order = sorted(
            self.plan.shapes(), key=lambda bs: bs[1] != self.plan.max_batch(bs[0])
        )
        self._rank = {shape: i for i, shape in enumerate(self._compile_order)}
        if options.precompile:
            # Started here and not waited for: reading and tokenizing go on meanwhile, and
            # a batch waits only for its own shape.
            self._background = BackgroundCompile(
                self.kernel, self.params, self._listed_shapes(), self.plan.kernel_treedef
            )

    def _largest_transfer(self) -> int:
        """The bytes of the largest leaf of any padded batch, per device it is split over."""
        devices = max(1, len(self.kernel.devices))
        return max(
            (
                -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // devices)
                for b, s in self.plan.shapes()
                for shape, dtype in self.plan.leaf_shapes(b, s)
            ),
            default=0,
        )

    def _listed_shapes(self) -> list:
        """Every listed shape, those full batches use (each bucket's largest size) first."""
        names = self.plan.kernel_axis_names
        return [(self.plan.leaf_shapes(b, s), names) for b, s in self._compile_order]

    def compile_rank(self, buffer) -> int:
        """Where ``buffer``'s batch shape comes in the start-up compile order."""
        size = self.plan.padded_batch_size(
            buffer.bucket, min(buffer.size, self.limit(buffer.bucket))
        )
        return self._rank.get((buffer.bucket, size), len(self._rank))

    def precompile(self) -> int:
        """Compile every listed shape now; returns how many compiles that took."""
        return self.kernel.precompile(
            self.params, self._listed_shapes(), self.plan.kernel_treedef, background=True
        )

    def ready(self, bucket: Bucket, n: int) -> bool:
        """Whether a batch of ``n`` rows of ``bucket`` can run without waiting for a
        compile: its shape is compiled, or no start-up compile is running (the batch then
        compiles its shape itself, as without ``precompile``)."""
        if self._background is None or self._background.done():
            return True
        if n > self._limits[bucket]:
            return True  # run in chunks by the engine; not worth holding back
        size = self.plan.padded_batch_size(bucket, n)
        return self.kernel.is_compiled(
            self.plan.leaf_shapes(bucket, size),
            tuple(sorted(self.plan.kernel_axis_names)),
            self.plan.kernel_treedef,
        )

    def wait_precompiled(self) -> None:
        """Wait for the start-up compiles, if any are still running (counted as waiting)."""
        if self._background is not None and not self._background.done():
            start = time.perf_counter()
            self._background.wait()
            self.kernel.count_wait(time.perf_counter() - start)

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

    def take_compile_stats(self) -> tuple[int, float, float, float]:
        """Compiles, compile seconds, seconds batches waited for compiles and seconds of the
        compiles spent tracing and lowering, not yet reported to metrics."""
        k = self.kernel
        if (k.compiles, k.compile_seconds, k.wait_seconds, k.trace_seconds) == self._reported:
            return 0, 0.0, 0.0, 0.0  # the common case after start-up: no lock taken per batch
        with self._lock:
            now = (k.compiles, k.compile_seconds, k.wait_seconds, k.trace_seconds)
            done = self._reported
            self._reported = now
        return tuple(a - b for a, b in zip(now, done, strict=True))


# How long a process that exits waits for a worker still being built (opening the devices,
# loading and placing the parameters: seconds to a minute or two for a large model).
EXIT_WAIT_SECONDS = 60.0
_STARTING: weakref.WeakSet[WorkerStart] = weakref.WeakSet()


def _wait_for_starts() -> None:
    """At exit: waits, :data:`EXIT_WAIT_SECONDS` at most in all, for the workers still
    being built; warns of each that is not built by then, and leaves it behind."""
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    for start in list(_STARTING):
        if not start._done.wait(max(0.0, deadline - time.monotonic())):
            _LOG.warning(
                "beam_jax: the process exits without waiting longer for a worker still being "
                "built after %.0f s (its load_params, the devices' opening or the parameters' "
                "placing has not returned); check what load_params waits for (a download, a "
                "lock, a device another process holds)",
                EXIT_WAIT_SECONDS,
            )


# After the interpreter has joined its non-daemon threads (the compiles, which the
# compiles' own exit hook has stopped), and before it finalizes.
atexit.register(_wait_for_starts)


class WorkerStart:
    """A ``Worker`` being built on a background thread: what waits for the device.

    Building a worker opens the devices (seconds on a TPU), loads and places the
    parameters, fits batch limits to memory and starts the precompiles. None of that is
    needed to read, decode, tokenize or bucket the first elements, so the caller goes on
    with that work and waits (``get``) only when a batch must run on the device. A process
    that exits meanwhile (a job that failed) waits for the build to end, for
    :data:`EXIT_WAIT_SECONDS` at most, then exits with its own status; a build still
    running then (a ``load_params`` that never returns) is left behind with a warning
    rather than keeping the process from exiting.

    Example:
        >>> import numpy as np, beam_jax as bj
        >>> options = bj.KernelOptions(bucketing=bj.Bucketing(boundaries={"L": 8}))
        >>> start = WorkerStart(lambda p, x, lengths: x.sum(),
        ...                     bj.ArraySpec(("L",), np.float32), options)
        >>> type(start.get()).__name__  # waits for it
        'Worker'

    Args:
        fn, spec, options: as for ``Worker``.
    """

    def __init__(self, fn: Callable[..., Any], spec: Any, options: KernelOptions):
        self._done = threading.Event()
        self._worker: Worker | None = None
        self._error: BaseException | None = None
        # A daemon, so a build that never ends cannot keep the process from exiting; exit
        # waits for it (``_wait_for_starts``, a bounded wait), since a daemon thread still
        # inside XLA (opening the devices, placing the parameters) as the interpreter
        # finalizes is cut off as it returns, which aborted a failed job's process at exit
        # ("terminate called after throwing", status 134) instead of ending with its
        # error. The compiles a build finishing during exit starts compile nothing
        # (``precompile``).
        self._thread = threading.Thread(
            target=self._build,
            args=(fn, spec, options),
            name="beam_jax-worker-start",
            daemon=True,
        )
        _STARTING.add(self)
        self._thread.start()

    def _build(self, fn, spec, options) -> None:
        try:
            self._worker = Worker(fn, spec, options)
        except BaseException as e:  # noqa: BLE001 - raised to every caller of get()
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        """Whether the worker is built (or failed to build)."""
        return self._done.is_set()

    def get(self) -> Worker:
        """The worker, once built (waits for it).

        Raises:
            Exception: whatever building it raised (opening the devices, ``load_params``,
                fitting to memory), the same error for every caller: the job's error.
        """
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._worker is not None
        return self._worker
