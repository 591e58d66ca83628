"""Fitting each bucket's batch limit to memory at worker start, and reporting on it.

The three layers of batch-size control, outermost first: the plan's allowed sizes (a row
count and an optional token budget, ``Bucketing(batch_size=..., max_padded_size=...)``);
this fit, which picks the largest allowed size per bucket whose compiled program XLA
analyses as fitting the memory budget (``FitToMemory``); and the out-of-memory back-off of
the batch engine, which still splits a batch that runs out of memory and lowers the limit.
When that back-off fires after a fitted choice, ``record_fit_miss`` says in the metrics by
how much the analysis was off.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from beam_jax._src.bucketing.fit import FitRow, FitToMemory, search_limits
from beam_jax._src.bucketing.rule import Bucket
from beam_jax._src.core.plan import Plan
from beam_jax._src.engine.options import make_kernel
from beam_jax._src.errors import SpecError
from beam_jax._src.kernel.compiled import Kernel
from beam_jax._src.kernel.memory import analyse_shape, device_free_bytes, params_bytes

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FitReport:
    """The outcome of fitting batch limits to memory on one worker.

    Attributes:
        budget: bytes per device the programs had to fit.
        budget_source: ``"stated"`` (``budget_bytes``) or ``"device"`` (a fraction of
            the device's free memory).
        limits: per bucket, the chosen batch limit.
        rows: every analysed ``(bucket, batch size)`` shape, by bucket then size.
        compiles: compiles the search needed (cached: the run reuses them).
        compile_seconds: time those compiles took.
        params_bytes: one copy of the parameters, held by each device.
        num_devices: local devices the batch is sharded over (per-device batch =
            batch size / num_devices).
    """

    budget: int
    budget_source: str
    limits: dict[Bucket, int]
    rows: tuple[FitRow, ...]
    compiles: int
    compile_seconds: float
    params_bytes: int
    num_devices: int

    def table(self) -> list[dict]:
        """The plan table: one dict of plain values per analysed shape (see
        ``FitRow.as_dict``), with the per-device batch and the parameters' bytes."""
        out = []
        for r in self.rows:
            row = r.as_dict()
            row["per_device_batch"] = r.size // self.num_devices
            row["params_bytes"] = self.params_bytes
            out.append(row)
        return out

    def missed_by_pct(self, bucket: Bucket, size: int) -> float | None:
        """After a batch of ``size`` rows of ``bucket`` ran out of memory: at least how much
        more memory it needed than analysed, in percent; ``None`` if the fit did not vouch
        for that size.

        The fit judged the shape to need ``A`` bytes within the budget ``B``; running out of
        memory shows it needed more than ``B``, so the analysis was off by at least
        ``(B - A) / A``. A size the search did not analyse is judged by the smallest analysed
        fitting size above it (bytes grow with the batch, so the bound still holds).
        """
        candidates = [r for r in self.rows if r.bucket == bucket and r.size >= size and r.fits]
        if not candidates:
            return None
        row = min(candidates, key=lambda r: r.size)
        return 100.0 * (self.budget - row.total) / max(row.total, 1)


def fit_budget(policy: FitToMemory, kernel: Kernel, params: Any) -> tuple[int, str]:
    """``(bytes per device, source)``: the stated budget, else a fraction of free memory."""
    if policy.budget_bytes is not None:
        return policy.budget_bytes, "stated"
    free = device_free_bytes(kernel.devices)
    if free is None:
        raise SpecError(
            f"FitToMemory has no budget_bytes and the {kernel.platform} devices do not report "
            "their memory (memory_stats() is None); state one, e.g. "
            "FitToMemory(budget_bytes=2 << 30) for 2 GiB per device."
        )
    # The parameters are already placed (in use) and the analysis counts them again.
    return int(policy.device_fraction * free) + params_bytes(params), "device"


def fit_batch_limits(kernel: Kernel, params: Any, plan: Plan, policy: FitToMemory) -> FitReport:
    """Per bucket of ``plan``, the largest allowed batch size whose program fits the budget.

    Only the plan's own shapes are compiled, through the kernel's cache. For a packed plan
    a bucket is a row length and a batch size a number of rows.

    Args:
        kernel: the compiled kernel (its devices set the per-device figures).
        params: the parameters, already placed.
        plan: the plan, whose allowed sizes are searched.
        policy: the budget.
    """
    budget, source = fit_budget(policy, kernel, params)
    # What the kernel is called with: for a packed plan, the element and its segments.
    names = plan.kernel_axis_names
    treedef = plan.kernel_treedef
    before, started = kernel.compiles, time.perf_counter()
    limits, rows = search_limits(
        plan.buckets,
        {b: plan.batch_sizes(b) for b in plan.buckets},
        lambda bucket, size: analyse_shape(
            kernel, params, plan.leaf_shapes(bucket, size), names, treedef
        ),
        budget,
    )
    report = FitReport(
        budget=budget,
        budget_source=source,
        limits=limits,
        rows=tuple(rows),
        compiles=kernel.compiles - before,
        compile_seconds=time.perf_counter() - started,
        params_bytes=params_bytes(params),
        num_devices=kernel.num_devices,
    )
    _log.info(
        "FitToMemory: budget %d bytes per device (%s) on %d device(s); batch limits %s; "
        "%d shapes analysed, %d compiles in %.1f s",
        budget,
        source,
        kernel.num_devices,
        {b: limits[b] for b in plan.buckets},
        len(rows),
        report.compiles,
        report.compile_seconds,
    )
    return report


def fit_plan(fn: Callable[..., Any], spec: Any, options: Any) -> FitReport:
    """Fit ``options``' plan to memory on this process's devices, as a worker would.

    For a ``beam-jax plan``-style listing: loads the parameters (``options.load_params``),
    compiles what the search needs and returns the report (``report.table()`` for rows).

    Args:
        fn: the kernel function.
        spec: the element spec.
        options: ``KernelOptions`` with ``fit_to_memory`` set.
    """
    policy = options.fit_to_memory
    if policy is None:
        raise SpecError(
            "options.fit_to_memory is None; set it, e.g. "
            "KernelOptions(fit_to_memory=FitToMemory(budget_bytes=1 << 30))."
        )
    kernel, plan = make_kernel(fn, spec, options)  # as the worker builds them
    raw = options.load_params() if options.load_params is not None else None
    return fit_batch_limits(kernel, kernel.put_params(raw), plan, policy)


def record_fit_miss(report: FitReport | None, metrics: Any, bucket: Bucket, size: int) -> None:
    """A batch of ``size`` padded rows of ``bucket`` ran out of memory: if the fit chose
    that size, count it and record by how much (at least) the analysis was off."""
    if report is None:
        return
    pct = report.missed_by_pct(bucket, size)
    if pct is None:
        return
    metrics.fit_out_of_memory.inc()
    metrics.fit_missed_by_pct.update(int(round(pct)))
