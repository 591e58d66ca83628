"""What every kernel transform shares: the worker DoFn, exception handling, the threshold."""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.transforms import window as beam_window
from apache_beam.utils import shared
from apache_beam.utils.windowed_value import WindowedValue

from beam_jax._src.core.dead_letter import DEAD_LETTERS, FailedElement
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.core.plan import Plan
from beam_jax._src.engine.batching import BatchEngine
from beam_jax._src.engine.cross_bundle import CrossBundle
from beam_jax._src.engine.metrics import KernelMetrics
from beam_jax._src.engine.options import KernelOptions, make_plan, resolve_options
from beam_jax._src.engine.worker import Worker, WorkerStart
from beam_jax._src.errors import DeadLetterThresholdError, SpecError


class RunKernelResult(NamedTuple):
    """The outputs of a kernel transform's ``.with_exception_handling()``.

    Attributes:
        results: the transform's results, as without exception handling.
        dead_letters: one ``FailedElement`` per element that produced no result.
    """

    results: beam.PCollection
    dead_letters: beam.PCollection


class Source(NamedTuple):
    """How a dead letter describes its row: key, a bounded echo, where it belongs (timestamp
    and window) and where it was read from (``source`` file and ``row``, when known)."""

    key: Any
    element: Any
    timestamp: Any
    window: Any
    source: str | None = None
    row: int | None = None


def dead_letter_output(error: BaseException, stage: str, source: Source) -> Any:
    """The dead-letter output of one row: its ``FailedElement``, tagged ``DEAD_LETTERS``, in
    the row's timestamp and window. Every front end's ``dead_letter`` is this function."""
    record = FailedElement.from_exception(
        error,
        stage=stage,
        element=source.element,
        key=source.key,
        source=source.source,
        row=source.row,
    )
    return beam.pvalue.TaggedOutput(
        DEAD_LETTERS, WindowedValue(record, source.timestamp, (source.window,))
    )


class _Holder:
    # apache_beam.utils.shared needs a weak-referenceable object.
    def __init__(self, start: WorkerStart):
        self.start = start


class WorkerDoFn(beam.DoFn):
    """A DoFn whose instances in one process share one ``Worker`` (params, compiled shapes),
    each running its batches through a ``BatchEngine`` of which it is the front end.

    A subclass either is a front end (the ``FrontEnd`` methods) or holds one (an
    ``ElementFrontEnd`` built with ``new_engine``), and implements ``process``.

    The worker is built on a background thread from ``setup`` (or taken from
    ``start_workers``/``start_worker_here``) while the bundle's earlier steps read; ``plan``
    and the engine wait for it. A subclass that calls ``open_bundle_once()`` first thing in
    ``process`` waits only when its first element arrives. An error building the worker is
    raised where it is waited for.

    Args:
        fn: the kernel's function.
        spec: its element spec.
        options: the transform's options.
        handle_errors: failures become dead letters instead of failing the bundle.
        start_id: the transform's ``start_workers()`` id: the DoFn takes the worker started
            under it in this process, if any (``None``: always its own).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        spec: Any,
        options: KernelOptions,
        handle_errors: bool,
        start_id: str | None = None,
    ):
        self._fn = fn
        self._spec = spec
        self._options = options
        self._handle_errors = handle_errors
        self._shared = shared.Shared()
        self._tag = uuid.uuid4().hex
        self._start_id = start_id

    def setup(self):
        fn, spec, options, start_id = self._fn, self._spec, self._options, self._start_id
        # Not waited for here: see the class's docstring.
        self._holder = self._shared.acquire(
            lambda: _Holder(_take_started(start_id) or WorkerStart(fn, spec, options)),
            tag=self._tag,
        )
        self._metrics = KernelMetrics(options.metrics_namespace)

    @functools.cached_property
    def _worker(self) -> Worker:
        """This process's worker for the transform, waited for the first time."""
        return self._holder.start.get()

    @property
    def _plan(self) -> Plan:
        return self._worker.plan

    @property
    def plan(self) -> Plan:
        """The worker's plan (after ``setup``; waits for the worker)."""
        return self._plan

    @property
    def metrics(self) -> KernelMetrics:
        """The kernel metrics every front end counts (``elements_in`` on arrival)."""
        return self._metrics

    def start_bundle(self):
        # The bundle's engine is built by its first element (open_bundle_once), so that a
        # worker still starting holds up none of the bundle's earlier steps.
        self._opened = False

    def open_bundle(self):
        """Builds the bundle's engine (waits for the worker): a subclass extends it."""
        # A fresh engine per bundle: nothing of a failed bundle is carried into the next.
        self._engine = self.new_engine(self)

    def open_bundle_once(self) -> None:
        """``open_bundle`` the first time in a bundle; call it first thing in ``process``."""
        if not self._opened:
            self.open_bundle()
            self._opened = True

    def new_engine(self, front: Any) -> BatchEngine:
        """A ``BatchEngine`` of this DoFn's worker and metrics, with ``front`` its front end."""
        return BatchEngine(
            self._worker,
            self._metrics,
            front,
            handle_errors=self._handle_errors,
            report_compiles=self._report_compiles,
        )

    def finish_bundle(self) -> Iterator[Any]:
        # A subclass that builds its engine in its own start_bundle never sets _opened.
        if not getattr(self, "_opened", True):
            return  # no element came: nothing to run, nor to wait for
        yield from self._engine.flush()
        # Start-up compiles still running are waited for, so that the bundle's metrics
        # count every compile and no compile outlives the worker's work.
        self._worker.wait_precompiled()
        self._report_compiles()

    def _report_compiles(self) -> None:
        self._metrics.compiled(*self._worker.take_compile_stats())

    def release(self, buffer) -> None:
        """Buffers are dropped after their batch lands, unless a subclass reuses them."""

    def dead_letter(self, error: BaseException, stage: str, source: Source) -> Any:
        return dead_letter_output(error, stage, source)


# Workers started early by start_workers(), until the transform's own DoFn takes them.
_STARTED: dict[str, WorkerStart] = {}
_STARTED_LOCK = threading.Lock()


def _take_started(start_id: str | None) -> WorkerStart | None:
    with _STARTED_LOCK:
        return _STARTED.pop(start_id, None) if start_id else None


def _start(start_id: str, fn, spec, options: KernelOptions) -> None:
    """Starts building the transform's worker in the background, once per process."""
    with _STARTED_LOCK:
        if start_id not in _STARTED:
            _STARTED[start_id] = WorkerStart(fn, spec, options)


class _StartWorker(beam.DoFn):
    """Starts building a kernel transform's worker in the background, in the first stage
    that runs in a process (an error surfaces where the transform's DoFn waits for it)."""

    def __init__(self, fn, spec, options: KernelOptions, start_id: str):
        self._args = (fn, spec, options)
        self._start_id = start_id

    def setup(self):
        _start(self._start_id, *self._args)

    def process(self, element) -> Iterator[Any]:
        return iter(())


class StartWorkers(beam.PTransform):
    """Apply to the pipeline to start a kernel transform's worker as the pipeline starts.

    Example:
        >>> embed = RunKernel(fn, spec=spec, precompile=True)  # doctest: +SKIP
        >>> _ = pipeline | embed.start_workers()  # doctest: +SKIP
    """

    def __init__(self, transform: KernelTransform):
        super().__init__()
        self._transform = transform

    def expand(self, pbegin):
        t = self._transform
        return (
            pbegin
            | "Impulse" >> beam.Impulse()
            | "Start" >> beam.ParDo(_StartWorker(t.fn, t.spec, t.options, t._start_id))
        )


def _check_threshold(bad: int, total: int, threshold: float):
    if total and bad / total > threshold:
        raise DeadLetterThresholdError(
            f"{bad} of {total} elements failed ({bad / total:.2%}), more than the threshold "
            f"{threshold:.2%}; inspect the dead letters, fix the data or kernel, or raise "
            "with_exception_handling(threshold=...)."
        )


class KernelTransform(beam.PTransform):
    """The base of RunKernel, RunKernelOnArrow and ReduceKernel: the function, spec and
    options, Beam-style exception handling with a failure threshold, and the plan.

    Subclasses build their DoFn in ``expand`` and call ``_outputs`` on its tagged outputs.
    """

    def __init__(self, fn: Callable[..., Any], *, spec: Any, options: KernelOptions | None, kwargs):
        super().__init__()
        if not callable(fn):
            raise SpecError(f"the kernel fn must be callable, got {fn!r}.")
        self.fn = fn
        self.spec = spec
        self.options = resolve_options(options, kwargs)
        self.plan()  # the spec, bucketing and output spec must fit together: fail now
        self._start_id = uuid.uuid4().hex
        self._handle_errors = False
        self._threshold = 1.0
        self._threshold_windowing = None
        self.cross_bundle: CrossBundle | None = None  # bundle mode

    @property
    def metrics_namespace(self) -> str:
        return self.options.metrics_namespace

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
        clone = copy.copy(self)
        clone._handle_errors = True
        clone._threshold = threshold
        clone._threshold_windowing = threshold_windowing
        return clone

    def with_cross_bundle_batching(self, config: CrossBundle | None = None, **kwargs):
        """Batch across bundles: buffer elements in Beam state until a batch is full, has
        waited ``max_wait_s`` or its window ends (``CrossBundle``, docs/streaming.md).
        Returns a copy; combine with ``with_exception_handling`` in either order.

        Example:
            >>> run = RunKernel(fn, spec=spec).with_cross_bundle_batching(  # doctest: +SKIP
            ...     max_wait_s=0.5, shards=4, when="unbounded")

        Args:
            config: a ``CrossBundle``; keyword arguments given here override its fields.
            **kwargs: the fields of ``CrossBundle`` (``max_wait_s``, ``shards``, ``when``,
                ``clock``).
        """
        if config is None:
            config = CrossBundle(**kwargs)
        elif not isinstance(config, CrossBundle):
            raise SpecError(f"config must be a CrossBundle, got {config!r}.")
        elif kwargs:
            config = dataclasses.replace(config, **kwargs)
        clone = copy.copy(self)
        clone.cross_bundle = config
        return clone

    def start_workers(self) -> StartWorkers:
        """A transform to apply to the pipeline root (``pipeline | t.start_workers()``): the
        worker is built in the pipeline's first stage, so its parameters load and (with
        ``precompile``) its shapes compile while earlier stages read. Only a process that
        runs that first stage starts early; the others start as before.
        """
        return StartWorkers(self)

    def start_worker_here(self) -> None:
        """Start building this process's worker now, in the background, for a runner that
        runs the pipeline in this process (the FnApiRunner): Beam's start-up overlaps it, and
        the transform's DoFn takes it. Elsewhere its compiles still fill a compilation cache."""
        _start(self._start_id, self.fn, self.spec, self.options)

    def forget_worker_here(self) -> None:
        """Drop a worker ``start_worker_here`` built that the pipeline did not take (e.g.
        it failed first), so it is not kept for the rest of the process."""
        _take_started(self._start_id)

    def plan(self, num_devices: int = 1) -> Plan | PackedPlan:
        """The batching plan a worker with ``num_devices`` devices uses (lists all shapes): a
        ``PackedPlan`` with ``packing``, else the bucketed ``Plan``."""
        return make_plan(self.spec, self.options, num_devices)

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
