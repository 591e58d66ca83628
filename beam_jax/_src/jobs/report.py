"""A run's final metrics as JSON, written next to its output for ``beam-jax report``.

``OUTPUT/_metrics.json`` holds the pipeline's name, its summary (the fields and the
properties of the job's summary dataclass: rows, results, dead letters by stage, wall
time...; its ``kernel`` field, a ``beam_jax.Summary``, as its own entry) and the kernel's
metrics per bucket (elements, batches, padding, compiles, mean batch latency). Its name
starts with ``_``, so dataset readers of ``OUTPUT`` skip it.

Example:
    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class JobSummary:
    ...     rows: int
    >>> record = metrics_record("my_job", JobSummary(rows=3), result=None)
    >>> record["summary"], write_metrics(record, "out/")
    ({'rows': 3}, 'out/_metrics.json')
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_jax._src.engine.metrics import NAMESPACE, bucket_totals
from beam_jax._src.jobs.output_dir import METRICS, write_atomically

__all__ = ["metrics_record", "write_metrics"]

VERSION = 1


def _finite(value: Any) -> Any:
    """NaN and infinities become None, so the file is standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def metrics_record(
    pipeline: str, summary: Any, result: Any, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """The JSON-ready metrics of a finished run.

    Args:
        pipeline: The job's name.
        summary: The job's summary dataclass: its fields are copied (``kernel``, a
            ``beam_jax.Summary``, to its own entry), and so are its properties whose
            values are numbers, strings or booleans (e.g. a rate).
        result: The finished ``PipelineResult``, for the per-bucket metrics (``None``:
            none).
        namespace: The kernel's metrics namespace (default beam_jax's).

    Returns:
        ``{"version", "pipeline", "summary", "kernel", "buckets"}``, with NaN and
        infinities as ``None`` (standard JSON).

    Raises:
        TypeError: ``summary`` is not a dataclass instance.
    """
    if not dataclasses.is_dataclass(summary) or isinstance(summary, type):
        raise TypeError(
            f"summary must be a dataclass instance (the job's summary), got "
            f"{type(summary).__name__}; wrap the figures in a dataclass"
        )
    fields = dataclasses.asdict(summary)
    kernel = fields.pop("kernel", None)
    for name in dir(type(summary)):
        if not name.startswith("_") and isinstance(getattr(type(summary), name), property):
            value = getattr(summary, name)
            if value is None or isinstance(value, bool | int | float | str):
                fields[name] = value
    buckets = {} if result is None else bucket_totals(result, namespace)
    return _finite(
        {
            "version": VERSION,
            "pipeline": pipeline,
            "summary": fields,
            "kernel": kernel,
            "buckets": buckets,
        }
    )


def write_metrics(record: dict[str, Any], output: str) -> str:
    """Writes ``record`` to ``output/_metrics.json`` (local or e.g. gs://); returns the path.

    Written whole or not at all (:func:`write_atomically`); ``beam-jax report OUTPUT``
    prints it as tables.
    """
    path = FileSystems.join(output, METRICS)
    write_atomically(path, json.dumps(record, indent=1).encode())
    return path
