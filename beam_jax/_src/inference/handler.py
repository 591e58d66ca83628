"""JaxModelHandler: beam_jax's batch engine behind Beam's ``RunInference(handler)``.

Beam's ``RunInference`` owns the batching (``BatchElements``), to which the handler gives
length buckets equal to the plan's; the parameters and compiles live in a ``Worker`` that
Beam's model sharing keeps once per process, and each batch runs through ``RunKernel``'s
``BatchEngine`` (``batch.py``). Every compile is one of ``Plan.shapes()``.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, PredictionResult
from typing_extensions import Unpack

from beam_jax._src.core.dead_letter import FailedElement
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.core.plan import Plan
from beam_jax._src.engine.batching import BatchEngine
from beam_jax._src.engine.elements import ElementFrontEnd, PerElement
from beam_jax._src.engine.metrics import KernelMetrics
from beam_jax._src.engine.options import (
    KernelOptions,
    KernelOptionsKwargs,
    make_plan,
    resolve_options,
)
from beam_jax._src.engine.worker import Worker
from beam_jax._src.errors import InferenceBatchError, SpecError
from beam_jax._src.inference.batch import BatchResults, drain
from beam_jax._src.kernel.params import read_params

_SHOWN_FAILURES = 20
METRICS_NAMESPACE = "BeamML_Jax"
"""RunInference's own metrics (``num_inferences``, ...) for this handler, as Beam's
handlers use ``BeamML_PyTorch`` and the like; the engine's go to ``options``' namespace."""


def _length_at(getters: tuple, axis: int, element: Any) -> int:
    """The length of ``axis`` of the leaf ``getters`` reach; 0 for an element of the wrong
    structure (rejected with a message when its batch is validated, not in Beam's)."""
    try:
        for get in getters:
            element = get(element)
        return int((element.shape if type(element) is np.ndarray else np.shape(element))[axis])
    except Exception:  # noqa: BLE001 - the length only routes; validation explains
        return 0


def _value_length(length_fn: Callable[[Any], int], element: Any) -> int:
    """``length_fn`` of a ``(key, value)`` pair's value."""
    try:
        return length_fn(element[1])
    except Exception:  # noqa: BLE001 - as _length_at
        return 0


def _bucket_number(plan: Plan, axes: tuple, numbers: dict, element: Any) -> int:
    """The index of ``element``'s bucket in ``plan.buckets``, from the lengths of its ragged
    axes; 0 for an element of the wrong structure (as ``_length_at``)."""
    try:
        return numbers[plan.bucket_for([_length_at(g, a, element) for g, a in axes])]
    except Exception:  # noqa: BLE001 - the number only routes; validation explains
        return 0


def _getters(path: tuple) -> tuple:
    """Accessors of the entries of a pytree path (attributes, dict keys, indices)."""
    return tuple(
        operator.attrgetter(e.name)
        if hasattr(e, "name")
        else operator.itemgetter(e.key if hasattr(e, "key") else e.idx)
        for e in path
    )


def default_length_fn(plan: Plan) -> tuple[Callable[[Any], int] | None, list[int]]:
    """What Beam's ``BatchElements`` buckets elements by, and its boundaries, so that its
    length buckets are exactly the plan's: with one ragged axis, the axis's length (Beam's
    boundaries lower-inclusive, so ``b + 1`` for each of the plan's ``b``); with several,
    the number of the element's bucket in ``plan.buckets`` (boundaries ``1, 2, ...``); each
    axis read from the first leaf with it. ``(None, [])`` for one bucket (no grouping)."""
    if len(plan.buckets) < 2:
        return None, []
    first: dict[str, tuple[tuple, int]] = {}
    for path, spec in zip(plan.layout.paths, plan.layout.specs, strict=True):
        for axis, name in spec.ragged_axes:
            first.setdefault(name, (_getters(path), axis))
    axes = tuple(first[name] for name in plan.layout.axis_names)
    if len(axes) == 1:
        return functools.partial(_length_at, *axes[0]), [b + 1 for b in plan.boundaries[0][:-1]]
    numbers = {bucket: i for i, bucket in enumerate(plan.buckets)}
    bounds = list(range(1, len(plan.buckets)))
    return functools.partial(_bucket_number, plan, axes, numbers), bounds


class JaxModelHandler(ModelHandler[Any, PredictionResult, Worker]):
    """Run a JAX function with ``RunInference``, batched the way ``RunKernel`` batches.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> import beam_jax as bj
        >>> def mean(params, element, lengths):  # padding is zeros; cast: no implicit promotion
        ...     return element["x"].sum(0) / lengths["L"].astype(jnp.float32)
        >>> spec = {"x": bj.ArraySpec(("L", 64), np.float32)}
        >>> handler = bj.JaxModelHandler(
        ...     mean, spec=spec, bucketing=bj.Bucketing(boundaries={"L": 512}, batch_size=32)
        ... )
        >>> model = handler.load_model()  # what RunInference does once per process
        >>> batch = [{"x": np.ones((5, 64), np.float32)}, {"x": np.ones((9, 64), np.float32)}]
        >>> with jax.numpy_dtype_promotion("strict"):  # as docs/testing.md recommends
        ...     results = handler.run_inference(batch, model)  # PredictionResults, in order
        >>> [r.inference.shape for r in results], [float(r.inference[0]) for r in results]
        ([(64,), (64,)], [1.0, 1.0])
        >>> from apache_beam.ml.inference.base import RunInference
        >>> predictions = elements | RunInference(handler)  # doctest: +SKIP

    Each Beam batch is validated, padded to its buckets and run by ``RunKernel``'s engine;
    each element's result is a ``PredictionResult(example, inference, model_id)``. With
    ``packing=Packing(...)`` (as for ``RunKernel``) each Beam batch is packed into rows.

    Args:
        fn: ``fn(params, element, lengths)``, as for ``RunKernel``.
        spec: an ``ArraySpec`` or a pytree of them describing one element.
        params_path: a ``.safetensors`` or ``.npz`` file (local or any Beam file system)
            read once per process as the parameters; ``update_model_path`` replaces it
            (RunInference's model updates). Exclusive with ``load_params``.
        batch_length_fn: the length Beam's ``BatchElements`` buckets elements by; default
            the element's bucket in the plan, so each Beam batch holds one bucket's
            elements. Refused with packing.
        max_batch_duration_secs: how long Beam's stateful ``BatchElements`` may hold a
            batch; its length buckets exist only on that path. ``None`` turns both off.
        min_batch_size: Beam's smallest batch; default the plan's largest batch (a fixed
            batch size, so batches fill the compiled shapes); with packing, the records
            packed together (``Packing``'s planned buffer, else rows x ``max_segments``).
        options: a ``KernelOptions``; keyword options given here override its fields.
        **kwargs: the fields of ``KernelOptions``.

    Raises:
        SpecError: the options, spec and bucketing do not fit together.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        spec: Any,
        params_path: str | None = None,
        batch_length_fn: Callable[[Any], int] | None = None,
        max_batch_duration_secs: float | None = 1.0,
        min_batch_size: int | None = None,
        options: KernelOptions | None = None,
        **kwargs: Unpack[KernelOptionsKwargs],
    ):
        if not callable(fn):
            raise SpecError(f"the kernel fn must be callable, got {fn!r}.")
        self._fn = fn
        self._spec = spec
        self._options = resolve_options(options, kwargs)
        packed = self._options.packing is not None
        if packed and batch_length_fn is not None:
            raise SpecError(
                "batch_length_fn groups elements by length for bucketing; with packing, "
                "records of every length share rows, so Beam's batches need no grouping. "
                "Drop batch_length_fn, or use bucketing=... instead of packing=...."
            )
        if params_path is not None and self._options.load_params is not None:
            raise SpecError(
                "give either params_path or load_params, not both; params_path is what "
                "RunInference's model updates replace."
            )
        self._params_path = params_path
        plan = self.plan()
        if batch_length_fn is None:
            length_fn, beam_bounds = (None, []) if packed else default_length_fn(plan)
        else:
            length_fn = batch_length_fn
            # Beam's buckets are lower-inclusive (bisect_right), beam_jax's boundaries
            # upper-inclusive: Beam's b + 1 groups exactly the lengths of beam_jax's b. A
            # user's length over several axes gets Beam's default buckets.
            one = len(plan.boundaries) == 1
            beam_bounds = [b + 1 for b in plan.boundaries[0][:-1]] if one else []
        # A Beam batch is what one engine run takes: a bucket's largest batch, or with
        # packing the records packed together.
        top = max(plan.records_per_flush(b, plan.max_batch(b)) for b in plan.buckets)
        if min_batch_size is not None and not 1 <= min_batch_size <= top:
            raise SpecError(
                f"min_batch_size must be within [1, {top}] (the records of the plan's largest "
                f"batch), got {min_batch_size}; raise Bucketing.batch_size (or Packing's "
                "rows_per_batch) for larger batches."
            )
        if max_batch_duration_secs is None:
            length_fn = None  # Beam buckets by length only on its stateful path
        try:
            super().__init__(
                min_batch_size=top if min_batch_size is None else min_batch_size,
                max_batch_size=top,
                max_batch_duration_secs=max_batch_duration_secs,
                batch_length_fn=length_fn,
                batch_bucket_boundaries=beam_bounds if length_fn and beam_bounds else None,
            )
        except TypeError as e:  # ModelHandler's length buckets arrived in Beam 2.77
            raise SpecError(
                f"this apache-beam's ModelHandler lacks length-bucketed batching ({e}); "
                "JaxModelHandler needs apache-beam>=2.77: pip install 'beam_jax[yaml]'."
            ) from e
        self._metrics: KernelMetrics | None = None

    def plan(self, num_devices: int = 1) -> Plan | PackedPlan:
        """The batching plan a worker with ``num_devices`` devices uses (lists all shapes):
        a ``PackedPlan`` with ``packing``."""
        return make_plan(self._spec, self._options, num_devices)

    # --- RunInference's ModelHandler interface ------------------------------------------

    def load_model(self) -> Worker:
        """Parameters on the devices and the kernel, once per process (Beam shares it)."""
        options = self._options
        if self._params_path is not None:
            options = dataclasses.replace(
                options, load_params=functools.partial(read_params, self._params_path)
            )
        return Worker(self._fn, self._spec, options)

    def run_inference(
        self,
        batch: Sequence[Any],
        model: Worker,
        inference_args: dict[str, Any] | None = None,
    ) -> list[PredictionResult]:
        """Run one Beam batch through the engine; one ``PredictionResult`` per element.

        Raises:
            InferenceBatchError: elements failed (validation, compile, kernel or output);
                its ``failures`` names each one. RunInference then fails or dead-letters
                the whole batch, as it does for every handler.
        """
        results = self._run(batch, model)
        return [
            PredictionResult(x, r, self._params_path) for x, r in zip(batch, results, strict=True)
        ]

    def get_num_bytes(self, batch: Sequence[Any]) -> int:
        """Bytes of the elements' arrays (Beam's default pickles the whole batch)."""
        # One flatten of the whole batch: Beam asks this of every batch, holding the GIL.
        return sum(
            leaf.nbytes if type(leaf) is np.ndarray else int(np.asarray(leaf).nbytes)
            for leaf in jax.tree_util.tree_leaves(list(batch))
        )

    def get_metrics_namespace(self) -> str:
        return METRICS_NAMESPACE

    def update_model_path(self, model_path: str | None = None) -> None:
        """Read the parameters from ``model_path`` at the next load (RunInference's model
        updates); the new worker's shapes compile again, from JAX's caches where they hit."""
        if model_path:
            if self._options.load_params is not None:
                raise SpecError(
                    "this handler loads its parameters with load_params; give params_path "
                    "instead for RunInference's model updates to replace them."
                )
            self._params_path = model_path

    def share_model_across_processes(self) -> bool:
        # Device arrays cannot be proxied to other processes; each process loads its own.
        return False

    # --- the engine ---------------------------------------------------------------------

    def _kernel_metrics(self) -> KernelMetrics:
        if self._metrics is None:
            self._metrics = KernelMetrics(self._options.metrics_namespace)
        return self._metrics

    def _run(self, batch: Sequence[Any], worker: Worker) -> list[Any]:
        """Run ``batch`` through the ``BatchEngine``: every element's result, or raise
        ``InferenceBatchError`` naming each failed element."""
        metrics = self._kernel_metrics()
        metrics.elements_in.inc(len(batch))
        plan = worker.plan

        def engine(front: Any) -> BatchEngine:
            def report_compiles() -> None:
                metrics.compiled(*worker.take_compile_stats())

            return BatchEngine(
                worker, metrics, front, handle_errors=True, report_compiles=report_compiles
            )

        if isinstance(plan, PackedPlan):  # records of every length packed into rows
            results, failures = _run_packed(plan, engine, batch)
        else:  # the batch as columns, bucket by bucket
            front = BatchResults(plan, len(batch))
            front.run(engine(front), batch)
            results, failures = front.results, front.failures
        if failures:
            raise _batch_error(batch, failures)
        metrics.results.inc(len(batch))
        return results


def _run_packed(plan: PackedPlan, engine: Callable, batch: Sequence[Any]):
    """``batch`` through the element front end and its ``PackedStage``: ``(results,
    failures)``."""
    results: list[Any] = [None] * len(batch)
    failures: list[tuple[int, str, BaseException]] = []
    front = ElementFrontEnd(
        plan,
        PerElement(plan, results.__setitem__),
        lambda error, stage, index: failures.append((index, stage, error)),
    )
    front.engine = engine(front)
    # The batch's checks once over all its elements; an element they do not pass is
    # validated alone, so a bad one never changes the others' results.
    items = front.validate_many(enumerate(batch), [])
    if not failures:  # the batch fails anyway: don't run the kernel for it
        drain(front.add_many(items))
        drain(front.drain())  # the records still staged, packed and run
        drain(front.engine.flush())
    return results, failures


def _batch_error(batch: Sequence[Any], failures) -> InferenceBatchError:
    failures = sorted(failures, key=lambda f: f[0])
    records = tuple(
        FailedElement.from_exception(error, stage=stage, element=batch[index], key=index)
        for index, stage, error in failures
    )
    first = records[0]
    shown = ", ".join(str(r.key) for r in records[:_SHOWN_FAILURES])
    more = ", ..." if len(records) > _SHOWN_FAILURES else ""
    return InferenceBatchError(
        f"{len(records)} of the {len(batch)} elements of this RunInference batch failed "
        f"(elements [{shown}{more}] failed); the first, element {first.key}, at stage "
        f"{first.stage!r}: {first.error_type}: {first.message} RunInference fails or "
        "dead-letters whole batches; this error's `failures` holds one FailedElement per "
        "failing element. For per-element dead letters that keep every good result, use "
        "beam_jax.RunKernel(...).with_exception_handling().",
        records,
        len(batch),
    )


class KeyedJaxModelHandler(KeyedModelHandler):
    """``JaxModelHandler`` for ``(key, example)`` pairs; results are ``(key, prediction)``.

    Unlike Beam's ``KeyedModelHandler``, it measures the example, not the pair, so Beam's
    length buckets still apply.

    Example:
        >>> handler = KeyedJaxModelHandler(mean, spec=spec, bucketing=bucketing)  # doctest: +SKIP
        >>> keyed_predictions = pairs | RunInference(handler)  # doctest: +SKIP

    Args:
        fn: as for ``JaxModelHandler``.
        **kwargs: the arguments of ``JaxModelHandler``.
    """

    def __init__(self, fn: Callable[..., Any], **kwargs: Any):
        super().__init__(JaxModelHandler(fn, **kwargs))

    def batch_elements_kwargs(self):
        kwargs = dict(self._unkeyed.batch_elements_kwargs())
        if "length_fn" in kwargs:
            kwargs["length_fn"] = functools.partial(_value_length, kwargs["length_fn"])
        return kwargs

    def plan(self, num_devices: int = 1) -> Plan | PackedPlan:
        """The unkeyed handler's plan."""
        return self._unkeyed.plan(num_devices)
