"""The handler's one-call path: a usual RunInference batch padded once and run once.

Beam's length-bucketed ``BatchElements`` hands ``JaxModelHandler`` batches of one bucket
holding at most the bucket's batch. For such a batch the engine's work is one pad, one
kernel call, one output check and one split; ``run_in_one_call`` does just that, from the
batch's columns (``check_batch``'s leaves and lengths: no ``Validated`` per element, no
generator per element between the kernel and the results), and reports the metrics the
engine reports for it, in the same amounts. Outside Beam, on 160 batches of 64 of the
benchmark's records (main-thread CPU, the two paths alternated in one process), the
handler's main thread spends 3.5 µs less per record than through the engine with the
heavy kernel and 5.5 less with the light one: time it holds the interpreter lock, which
Beam's own per-element work waits for.

Anything else returns ``None`` before a metric is touched, and the handler runs the
batch through the engine (``BatchEngine``), which bisects failures into per-element dead
letters: an element the batch checks refuse (``validate`` then explains it), a spec with
per-value checks, elements of several buckets, more than the bucket's current batch
limit, a shape not compiled yet (the engine counts its compile), a call that raises (a
kernel error, out of memory), outputs that break the contract or that the finiteness
check flags. A batch whose one call failed so runs that call again in the engine, as the
first call of the engine's bisection; the metrics count the engine's calls only, as they
would without this path.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from beam_jax._src.core.batch_validation import check_batch
from beam_jax._src.core.outputs import split_rows
from beam_jax._src.core.plan import Plan
from beam_jax._src.engine.batching import check_row_outputs
from beam_jax._src.engine.metrics import KernelMetrics
from beam_jax._src.engine.worker import Worker


def run_in_one_call(
    worker: Worker, metrics: KernelMetrics, batch: Sequence[Any]
) -> list[Any] | None:
    """Each element's result, from one padded batch and one kernel call; ``None`` (and no
    metric touched) when the batch is not one such call that succeeds: run it through
    the engine instead.

    Example:
        >>> results = run_in_one_call(worker, metrics, batch)  # doctest: +SKIP
        >>> results = results if results is not None else engine_path(batch)  # doctest: +SKIP

    Args:
        worker: the process's worker (plan, kernel, parameters, batch limits).
        metrics: the handler's ``KernelMetrics``; updated only when results are returned.
        batch: Beam's batch of elements.

    Returns:
        One output pytree per element, in order, as the engine's ``PerElement`` gives
        them; or ``None``.
    """
    plan = worker.plan
    if type(plan) is not Plan:  # packing (a PackedPlan) packs records into rows
        return None
    checked = check_batch(plan.layout, batch, validation=plan.validation, max_sizes=plan.max_sizes)
    if checked is None or not checked.ok.all():
        return None
    n = len(batch)
    lengths = checked.lengths
    indices = plan.bucket_indices(lengths)
    first = int(indices[0])
    if n > 1 and (indices != first).any():
        return None
    bucket = plan.buckets[first]
    limit = worker.limit(bucket)
    if n > limit:
        return None
    kernel, treedef = worker.kernel, plan.kernel_treedef
    try:
        padded = plan.pad_columns(bucket, list(zip(*checked.flat, strict=True)), lengths.T)
        if kernel.compiled_for(padded.leaves, tuple(sorted(padded.lengths)), treedef) is None:
            return None
        started = time.perf_counter()
        future = kernel.dispatch(
            worker.params, padded.leaves, padded.lengths, treedef=treedef, num_real=n
        )
        waited = time.perf_counter()
        outputs = jax.device_get(future)
        landed = time.perf_counter()
        outputs, bad = check_row_outputs(plan, outputs, padded)
    except Exception:  # noqa: BLE001 - the engine runs it again and explains each failure
        return None
    if bad.any():
        return None
    # What the engine reports for a batch it launches, runs and lands without a failure.
    metrics.batch_filled(n, limit)
    metrics.kernel_calls.inc()
    metrics.compiled(*worker.take_compile_stats())
    metrics.result_wait_us.inc(int((landed - waited) * 1e6))
    metrics.batch_succeeded(
        bucket, n, padded.padded_volume, padded.real_volume, int((landed - started) * 1000)
    )
    return split_rows(outputs, np.arange(n), lengths=lengths)
