"""Dead letters as JSON lines, one ``FailedElement`` per line, written and read back.

Every dead-letter file beam_jax and its pipelines write holds the one schema of
``beam_jax.FailedElement`` (docs/dead_letters.md): :func:`dead_letter_json` writes a record
as one line, :class:`WriteDeadLetters` writes a PCollection of records as
``PREFIX-SSSSS-of-NNNNN.jsonl`` files (none at all when nothing failed), counting each under
``dead_letters_<stage>``, and :func:`read_dead_letters` reads any of these files back as
records equal to those written.

Example:
    >>> import json
    >>> import beam_jax as bj
    >>> record = bj.FailedElement.from_error("ValueError", "no text", stage="validation",
    ...                                      element="{}", key=7, source="a.jsonl", row=3)
    >>> line = dead_letter_json(record)
    >>> [json.loads(line)[k] for k in ("key", "source", "row", "stage", "error_type")]
    [7, 'a.jsonl', 3, 'validation', 'ValueError']
    >>> bj.FailedElement.from_dict(json.loads(line)) == record
    True
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jax._src.core.dead_letter import FailedElement
from beam_jax._src.errors import SpecError

__all__ = ["WriteDeadLetters", "dead_letter_json", "read_dead_letters"]


def dead_letter_json(record: FailedElement) -> str:
    """One dead-letter JSON line (no newline): the fields of ``record``, where it came from
    first (``key``, ``key_type``, ``source``, ``row``), then ``stage``, ``error_type``,
    ``message``, ``element`` and ``traceback``; nothing else, so
    ``FailedElement.from_dict(json.loads(line))`` gives back an equal record.

    A record's origin is its ``source`` and ``row`` (and ``key``): to file a record under
    another origin, build it with that origin (``FailedElement.with_origin``).

    Args:
        record: The failed element.

    Returns:
        One line of JSON, UTF-8 text (escaped only where a lone surrogate needs it).

    Raises:
        TypeError: ``record`` is not a ``FailedElement``.
    """
    if not isinstance(record, FailedElement):
        raise TypeError(
            f"dead_letter_json writes a beam_jax.FailedElement, got {type(record).__name__}; "
            "build one with FailedElement.from_exception or from_error."
        )
    return record.to_json()


def read_dead_letters(pattern: str) -> Iterator[FailedElement]:
    """The records in the dead-letter files matching ``pattern`` (any Beam file system,
    e.g. ``out/_failed/*.jsonl``), file by file in name order, line by line.

    Raises:
        ValueError: A line is not a dead letter (names the file and line).
    """
    matched = FileSystems.match([pattern])[0].metadata_list
    for path in sorted(m.path for m in matched):
        with FileSystems.open(path, compression_type="uncompressed") as f:
            for number, line in enumerate(f, start=1):  # as editors count lines
                if not line.strip():
                    continue
                try:
                    yield FailedElement.from_dict(json.loads(line))
                except (ValueError, TypeError) as e:
                    raise ValueError(
                        f"line {number} of {path} is not a dead letter ({e}); dead-letter "
                        "files hold one FailedElement per line (docs/dead_letters.md)."
                    ) from e


def _from_error_row(row: Any) -> FailedElement:
    """The record a beam_jax YAML transform's error row carries (its ``dead_letter``)."""
    line = getattr(row, "dead_letter", None)
    if not isinstance(line, str):
        raise TypeError(
            f"WriteDeadLetters writes beam_jax.FailedElement records, or the error rows of "
            f"beam_jax's YAML transforms (with a 'dead_letter' field); got {row!r}."
        )
    return FailedElement.from_dict(json.loads(line))


class WriteDeadLetters(beam.PTransform):
    """Writes ``FailedElement`` records as JSON lines (:func:`dead_letter_json`).

    The records may also come as the error rows of beam_jax's Beam YAML transforms
    (``error_handling: {output: failed}``; their ``dead_letter`` field), so a YAML pipeline
    writes the same files (``type: WriteDeadLetters`` in ``beam_jax_provider.yaml``).

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

    def _line(self, record: Any) -> str:
        if not isinstance(record, FailedElement):
            record = _from_error_row(record)
        beam.metrics.Metrics.counter(self._namespace, f"dead_letters_{record.stage}").inc()
        return dead_letter_json(record)

    def expand(self, records):
        return (
            records
            | "ToJson" >> beam.Map(self._line)
            | "Write" >> beam.io.WriteToText(self._prefix, ".jsonl", skip_if_empty=True)
        )
