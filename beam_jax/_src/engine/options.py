"""The settings every kernel transform shares, stated once (a frozen, validated dataclass)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import numpy as np

from beam_jax._src.bucketing.buckets import Bucketing
from beam_jax._src.bucketing.fit import FitToMemory
from beam_jax._src.bucketing.packing import Packing
from beam_jax._src.bucketing.packing_choice import PackingChoice
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.core.plan import Plan
from beam_jax._src.core.validation import Validation
from beam_jax._src.engine.metrics import NAMESPACE
from beam_jax._src.errors import SpecError
from beam_jax._src.kernel.compiled import Kernel
from beam_jax._src.kernel.devices import device_indices, select_devices
from beam_jax._src.kernel.stored import ProgramStore
from beam_jax._src.kernel.wrappers import SegmentKernel


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """How a kernel transform batches, validates, loads parameters and places work.

    ``RunKernel``, ``RunKernelOnArrow`` and ``ReduceKernel`` take these as keyword
    arguments (``RunKernel(fn, spec=..., bucketing=...)``) or whole
    (``RunKernel(fn, spec=..., options=KernelOptions(...))``).

    Examples:
        >>> opts = KernelOptions(bucketing=Bucketing(boundaries={"L": 256}), precompile=True)
        >>> opts.bucketing.boundaries["L"][-1], opts.precompile
        (256, True)

    Args:
        bucketing: bucket boundaries per ragged axis and batch sizes.
        load_params: zero-argument callable run once per worker process; its result is
            placed on the devices and passed to the kernel as ``params``.
        validation: input checks (casting, NaN handling, byte limit, output checks).
        output_spec: pytree of ``ArraySpec`` for the per-element outputs; named axes are cut
            back to each element's own length.
        batched: the function already handles a leading batch axis; don't vmap it. It then
            gets ``lengths`` as a ``BatchLengths`` whose ``valid`` marks the real rows.
        devices: the devices of each worker to use; default all local devices.
        precompile: compile every listed shape when a worker starts, in background
            threads; a batch whose shape is still compiling waits while others run.
        compilation_cache_dir: enables JAX's persistent compilation cache there (refused
            if other users can write to it: the cache runs code from that directory).
        program_key: what ``fn`` computes, as a string to key its compiled programs by:
            with a local ``compilation_cache_dir``, each compiled shape is also stored
            whole there, and a later worker loads it without tracing ``fn`` (JAX's cache
            traces every shape first to find its entry). Give a new key whenever ``fn`` or
            what it closes over changes; beam_jax adds the shapes, the devices and the
            versions of JAX and of itself. Default ``None``: JAX's cache alone.
        metrics_namespace: the Beam metrics namespace.
        fit_to_memory: per bucket, the largest allowed batch size whose compiled program
            fits a memory budget (``FitToMemory``), chosen at worker start; default off.
        packing: pack several short records per row instead of bucketing (a ``Packing`` or
            ``PackingChoice``); the kernel is then ``fn(params, packed_row, segments)``,
            one output per segment (docs/guide.md, "Sequence packing").
        chunk_units: the most padded units (batch rows x padded bucket volume, e.g.
            tokens) the kernel runs at once: a larger batch runs as chunks inside the same
            call, one dispatch, activations cache-sized on a CPU. Default off.
    """

    bucketing: Bucketing = dataclasses.field(default_factory=Bucketing)
    load_params: Callable[[], Any] | None = None
    validation: Validation = dataclasses.field(default_factory=Validation)
    output_spec: Any = None
    batched: bool = False
    devices: Sequence[Any] | str | None = None
    precompile: bool = False
    compilation_cache_dir: str | None = None
    program_key: str | None = None
    metrics_namespace: str = NAMESPACE
    fit_to_memory: FitToMemory | None = None
    packing: Packing | PackingChoice | None = None
    chunk_units: int | None = None

    def __post_init__(self):
        if self.bucketing is None:
            object.__setattr__(self, "bucketing", Bucketing())
        if self.validation is None:
            object.__setattr__(self, "validation", Validation())
        if not isinstance(self.bucketing, Bucketing):
            raise SpecError(f"bucketing must be a Bucketing, got {self.bucketing!r}.")
        if not isinstance(self.validation, Validation):
            raise SpecError(f"validation must be a Validation, got {self.validation!r}.")
        if self.fit_to_memory is not None and not isinstance(self.fit_to_memory, FitToMemory):
            raise SpecError(
                f"fit_to_memory must be a FitToMemory or None, got {self.fit_to_memory!r}; "
                "e.g. fit_to_memory=FitToMemory(budget_bytes=1 << 30)."
            )
        if self.load_params is not None and not callable(self.load_params):
            raise SpecError(
                f"load_params must be a zero-argument callable returning the parameters, got "
                f"{self.load_params!r}; e.g. load_params=lambda: bj.read_params(path)."
            )
        if not isinstance(self.metrics_namespace, str) or not self.metrics_namespace:
            raise SpecError(
                f"metrics_namespace must be a non-empty str, got {self.metrics_namespace!r}."
            )
        if self.program_key is not None and (
            not isinstance(self.program_key, str) or not self.program_key
        ):
            raise SpecError(
                f"program_key must be a non-empty str or None, got {self.program_key!r}; "
                "e.g. program_key='my-model-v3', changed whenever the kernel's code changes."
            )
        if self.packing is not None:
            self._check_packing()
        if self.chunk_units is not None and (
            not isinstance(self.chunk_units, int | np.integer)
            or isinstance(self.chunk_units, bool)
            or self.chunk_units < 1
        ):
            raise SpecError(
                f"chunk_units must be a positive int or None, got {self.chunk_units!r}; e.g. "
                "chunk_units=1024 runs a batch of 4,096 padded tokens as 4 chunks of 1,024."
            )
        if self.devices is not None and not isinstance(self.devices, str):
            # Device objects cannot be pickled into a DoFn; workers re-resolve the indices.
            object.__setattr__(self, "devices", device_indices(self.devices))

    def _check_packing(self) -> None:
        if not isinstance(self.packing, Packing | PackingChoice):
            raise SpecError(
                f"packing must be a Packing or what plan_packing returned, got "
                f"{self.packing!r}; e.g. packing=Packing(row_lengths=128, rows_per_batch=32)."
            )
        if self.bucketing != Bucketing():
            raise SpecError(
                "bucketing and packing are two ways to shape batches; give one, got both "
                f"(bucketing={self.bucketing!r}). Packing fixes the row lengths itself."
            )


class KernelOptionsKwargs(TypedDict, total=False):
    """``KernelOptions`` as keyword arguments (for ``Unpack`` in transform signatures).

    A test keeps its keys and types equal to ``KernelOptions``'s fields.
    """

    bucketing: Bucketing
    load_params: Callable[[], Any] | None
    validation: Validation
    output_spec: Any
    batched: bool
    devices: Sequence[Any] | str | None
    precompile: bool
    compilation_cache_dir: str | None
    program_key: str | None
    metrics_namespace: str
    fit_to_memory: FitToMemory | None
    packing: Packing | PackingChoice | None
    chunk_units: int | None


def resolve_options(options: KernelOptions | None, kwargs: dict[str, Any]) -> KernelOptions:
    """``options`` with ``kwargs`` applied on top; unknown names fail with the known ones."""
    fields = {f.name for f in dataclasses.fields(KernelOptions)}
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise SpecError(
            f"unknown option(s) {unknown}; the kernel options are {sorted(fields)} (see "
            "beam_jax.KernelOptions)."
        )
    if options is None:
        return KernelOptions(**kwargs)
    if not isinstance(options, KernelOptions):
        raise SpecError(f"options must be a KernelOptions, got {options!r}.")
    return dataclasses.replace(options, **kwargs) if kwargs else options


def chunk_rows_for(plan: Plan | PackedPlan, chunk_units: int | None):
    """``Kernel``'s ``chunk_rows`` for ``plan``: per batch shape (its rows' leaf shapes),
    the rows of ``chunk_units`` padded units of its bucket (at least one); ``None`` without
    ``chunk_units``, and for a shape the plan does not list."""
    if chunk_units is None:
        return None
    rows = {}
    for bucket in plan.buckets:
        shapes = tuple(tuple(shape[1:]) for shape, _ in plan.leaf_shapes(bucket, 1))
        rows[shapes] = max(1, chunk_units // int(np.prod(bucket, dtype=np.int64)))
    return lambda row_shapes: rows.get(tuple(tuple(s) for s in row_shapes))


def make_kernel(fn: Callable[..., Any], spec: Any, options: KernelOptions):
    """The compiled kernel and the plan ``fn`` runs with under ``options``, as a worker
    runs it: packed rows through ``SegmentKernel``, on ``options.devices``, a batch of more
    than ``chunk_units`` in chunks.

    Returns:
        ``(Kernel, Plan | PackedPlan)``.
    """
    if options.packing is not None:
        fn = SegmentKernel(fn)  # the kernel gets (element, SegmentInfo) per packed row
    devices = select_devices(options.devices)
    plan = make_plan(spec, options, len(devices))
    store = None
    if ProgramStore.usable(options.compilation_cache_dir, options.program_key):
        store = ProgramStore(options.compilation_cache_dir, options.program_key)
    kernel = Kernel(
        fn,
        batched=options.batched,
        devices=devices,
        chunk_rows=chunk_rows_for(plan, options.chunk_units),
        store=store,
    )
    return kernel, plan


def make_plan(spec: Any, options: KernelOptions, num_devices: int = 1) -> Plan | PackedPlan:
    """The batching plan of ``spec`` under ``options`` for ``num_devices`` devices: a
    ``PackedPlan`` with ``packing``, else the bucketed ``Plan``."""
    if options.packing is not None:
        return PackedPlan(
            spec,
            options.packing,
            validation=options.validation,
            output_spec=options.output_spec,
            num_devices=num_devices,
        )
    return Plan(
        spec,
        options.bucketing,
        validation=options.validation,
        output_spec=options.output_spec,
        num_devices=num_devices,
    )
