"""Dead letters as JSON lines, one object per failed element, for people and dataset readers.

:func:`dead_letter_json` turns a ``beam_jax.FailedElement`` into one line that starts with
where the element came from (``id``, ``file``, ``row``) and says in one field what went
wrong (``error``: ``"<type>: <message>"``), then the details. :class:`WriteDeadLetters`
writes a PCollection of records that way, as ``PREFIX-SSSSS-of-NNNNN.jsonl`` files (none at
all when nothing failed), counting each record under ``dead_letters_<stage>``.

Example:
    >>> import json
    >>> import beam_jax as bj
    >>> record = bj.FailedElement.from_error("ValueError", "no text", stage="validation",
    ...                                      element="{}", key=7, source="a.jsonl", row=3)
    >>> line = json.loads(dead_letter_json(record))
    >>> [line[k] for k in ("id", "file", "row", "stage", "error")]
    [7, 'a.jsonl', 3, 'validation', 'ValueError: no text']
"""

from __future__ import annotations

import json
from typing import Any

import apache_beam as beam

from beam_jax._src.core.dead_letter import MAX_ECHO_CHARS, FailedElement
from beam_jax._src.errors import SpecError

__all__ = ["WriteDeadLetters", "dead_letter_json"]


def _json_value(value: Any) -> Any:
    """``value`` if JSON holds it as itself (None, bool, int, str, tuples of these), else
    its bounded repr: a float or a list id could not be a Parquet id column's value."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if type(value) is tuple:
        return [_json_value(v) for v in value]
    text = repr(value)
    return text if len(text) <= MAX_ECHO_CHARS else f"{text[: MAX_ECHO_CHARS - 3]}..."


def dead_letter_json(record: FailedElement, **where: Any) -> str:
    """One dead-letter JSON line: ``id``, ``file``, ``row``, ``stage``, ``error``, details.

    ``id``, ``file`` and ``row`` are the record's ``key``, ``source`` and ``row`` unless
    ``where`` gives them (e.g. the raw id of a row the reader could not type); other
    ``where`` fields follow them. ``error`` is ``"<type>: <message>"``; ``error_type``,
    ``message``, ``element`` (a bounded description) and ``traceback`` come last. Text is
    written as UTF-8, or escaped where it holds a lone surrogate UTF-8 cannot encode.

    Args:
        record: The failed element.
        **where: Fields that say where it came from, overriding the record's.

    Returns:
        One line of JSON, without the newline.
    """
    fields = {"id": record.key, "file": record.source, "row": record.row, **where}
    fields["id"] = _json_value(fields["id"])
    fields.update(
        stage=record.stage,
        error=f"{record.error_type}: {record.message}",
        error_type=record.error_type,
        message=record.message,
        element=record.element,
        traceback=record.traceback,
    )
    line = json.dumps(fields, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(fields)
    return line


class WriteDeadLetters(beam.PTransform):
    """Writes ``FailedElement`` records as JSON lines (:func:`dead_letter_json`).

    The files are ``file_path_prefix-SSSSS-of-NNNNN.jsonl`` (any Beam file system); none is
    written when the input is empty. Each record counts under the Beam metric
    ``dead_letters_<stage>`` of ``metrics_namespace``, so a job can report its dead letters
    per stage (``beam_jax.metric_totals``). Applied, it gives the PCollection of the
    written file names.

    Example:
        >>> read = ReadArrowBatches("in/*.jsonl").with_exception_handling()  # doctest: +SKIP
        >>> batches, dead = pipeline | read  # doctest: +SKIP
        >>> _ = dead | WriteDeadLetters("out/_failed/read")  # doctest: +SKIP

    Args:
        file_path_prefix: Where the files go, up to the shard suffix.
        metrics_namespace: The namespace of the per-stage counters (another than
            ``beam_jax``'s, whose transforms count their own dead letters).
    """

    def __init__(self, file_path_prefix: str, *, metrics_namespace: str = "beam_jax.jobs"):
        super().__init__()
        if not file_path_prefix:
            raise SpecError("file_path_prefix must name where the files go, got ''.")
        self._prefix = file_path_prefix
        self._namespace = metrics_namespace

    def _line(self, record: FailedElement) -> str:
        beam.metrics.Metrics.counter(self._namespace, f"dead_letters_{record.stage}").inc()
        return dead_letter_json(record)

    def expand(self, records):
        return (
            records
            | "ToJson" >> beam.Map(self._line)
            | "Write" >> beam.io.WriteToText(self._prefix, ".jsonl", skip_if_empty=True)
        )
