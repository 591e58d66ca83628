"""A run's final metrics as JSON, written next to its output for ``beam-jax report``.

``OUTPUT/_metrics.json`` holds the pipeline's name, its summary (rows, results, dead
letters by stage, padding, compiles, batches, wall time) and the kernel's metrics per
bucket (elements, batches, padding, compiles, mean batch latency). Its name starts with
``_``, so dataset readers of ``OUTPUT`` skip it.

Example:
    >>> record = metrics_record("embed_text", summary, result)  # doctest: +SKIP
    >>> write_metrics(record, "out/")  # doctest: +SKIP
    'out/_metrics.json'
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_jax.internal import bucket_totals
from pipelines.embed.write import write_atomically
from pipelines.output_dir import METRICS

__all__ = ["METRICS", "metrics_record", "write_metrics"]

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


def metrics_record(pipeline: str, summary: Any, result: Any, namespace: str | None = None):
    """The JSON-ready metrics of a finished run.

    Args:
        pipeline: The job's name.
        summary: The job's summary dataclass; its fields (and ``kernel``, a
            ``beam_jax.Summary``) are copied.
        result: The finished ``PipelineResult``, for the per-bucket metrics.
        namespace: The kernel's metrics namespace (default beam_jax's).
    """
    fields = dataclasses.asdict(summary)
    kernel = fields.pop("kernel", None)
    for name in ("sentences_per_second", "conserved"):
        if hasattr(summary, name):
            fields[name] = getattr(summary, name)
    buckets = bucket_totals(result) if namespace is None else bucket_totals(result, namespace)
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
    """Writes ``record`` to ``output/_metrics.json`` (local or e.g. gs://); returns the path."""
    path = FileSystems.join(output, METRICS)
    write_atomically(path, json.dumps(record, indent=1).encode())
    return path
