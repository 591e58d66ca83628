"""The dead-letter record: one per failed element, never one per batch."""

from __future__ import annotations

import dataclasses
import json
import traceback as tb
from typing import Any

import numpy as np

from beam_jax._src.core import dtypes

DEAD_LETTERS = "dead_letters"
"""The tag of the dead-letter output of every beam_jax transform."""

METRICS_NAMESPACE = "beam_jax"
"""The Beam metrics namespace of beam_jax's counters (dead letters and reads included)."""


class Stage:
    """Where an element failed: the ``stage`` of its ``FailedElement``.

    Pipelines may add their own stages (e.g. ``"tokenize"``) for records they reject
    before a beam_jax transform.
    """

    VALIDATION = "validation"
    """The element does not match the spec (shape, dtype, range, size)."""
    COMPILE = "compile"
    """The element's batch shape failed to trace or compile."""
    KERNEL = "kernel"
    """The kernel raised on the element (alone, after bisection), or ran out of memory."""
    OUTPUT = "output"
    """The kernel's output for the element broke the output contract or was not finite."""
    ALL = (VALIDATION, COMPILE, KERNEL, OUTPUT)
    """The stages a kernel transform counts (its ``dead_letters_<stage>`` metrics)."""
    INFERENCE = "inference"
    """The element's RunInference batch failed (``beam_jax.FailedInferences``): RunInference
    dead-letters whole batches, so every element of it is one."""
    READ = "read"
    """A file or row group could not be read (``ReadArrowBatches``); its rows never reached
    a kernel transform, so it is counted as ``files_failed``/``row_groups_failed``."""


VALIDATION, COMPILE, KERNEL, OUTPUT = Stage.VALIDATION, Stage.COMPILE, Stage.KERNEL, Stage.OUTPUT
STAGES = Stage.ALL

MAX_ECHO_CHARS = 1000
MAX_TRACEBACK_CHARS = 8000


MAX_MESSAGE_CHARS = 8000


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 20] + f"... [{len(text)} chars]"


def _keep_ends(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its first and last parts.

    Errors raised inside a JAX callback arrive as XLA text whose *last* line holds the
    actual error after a long traceback, so the tail is kept in full.
    """
    if len(text) <= limit:
        return text
    head = limit // 5
    tail = limit - head - 60
    cut = len(text) - head - tail
    return f"{text[:head]}\n... [{cut} of {len(text)} chars cut] ...\n{text[-tail:]}"


def describe(value: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """A bounded, never-failing description of ``value`` for a dead-letter record."""
    try:
        with np.printoptions(threshold=16, edgeitems=3, precision=6):
            text = repr(value)
    except Exception as e:  # noqa: BLE001 - a broken __repr__ must not lose the record
        text = f"<{type(value).__name__} whose repr raised {type(e).__name__}>"
    return _truncate(text, limit)


_SCALARS = (bool, int, float, str)


def _keyable(key: Any) -> Any:
    """``key`` as JSON/Parquet can hold it with its type, or raises ``TypeError``."""
    if key is None or isinstance(key, _SCALARS):
        return _truncate(key, MAX_ECHO_CHARS) if isinstance(key, str) else key
    if isinstance(key, np.generic) and dtypes.kind(key.dtype) in "biuf":  # bfloat16 too
        return key.item()
    if isinstance(key, tuple) and type(key) is tuple:
        return tuple(_keyable(k) for k in key)
    raise TypeError(type(key).__name__)


def encodable_key(key: Any) -> tuple[Any, str | None]:
    """``(key, None)`` when JSON and Parquet can hold ``key`` with its type (``None``, bool,
    int, float, str, numpy numbers, and tuples of these, nested), else ``(stand-in, type
    name)``: bytes decode to text, anything else becomes its bounded repr."""
    try:
        return _keyable(key), None
    except TypeError:
        pass
    if isinstance(key, bytes):
        text = key.decode("utf-8", errors="backslashreplace")
        return _truncate(text, MAX_ECHO_CHARS), "bytes"
    return describe(key), type(key).__name__


_KEEP: Any = object()


@dataclasses.dataclass(frozen=True)
class FailedElement:
    """Why one element produced no result, and where it came from.

    Every field is a plain value (``str``, ``int`` or ``None``; ``key`` a JSON scalar or a
    tuple of them), so records can be written to JSON lines or Parquet without pickling;
    echoes of the element are bounded in size. This module builds every record
    (``from_exception``, ``from_error``), whichever transform or reader failed; the schema
    of records written to files is in docs/dead_letters.md.

    Attributes:
        key: the element's key: the Beam key of keyed input, the id column of the Arrow
            path, the element's index in its batch for ``RunInference``; ``None`` otherwise.
            It keeps its type (tuples stay tuples) unless ``key_type`` is set.
        element: a truncated description of the failed element.
        stage: where it failed: ``"validation"``, ``"compile"``, ``"kernel"``, ``"output"``
            or ``"read"`` (or a pipeline's own stage).
        error_type: the exception's class name.
        message: the exception's message.
        traceback: the formatted traceback, truncated.
        source: the input the element was read from (a file path), when known.
        row: the element's row in ``source`` (0-based), when known.
        key_type: ``None`` when ``key`` has its original type; else that type's name, and
            ``key`` holds a stand-in (bytes decoded as UTF-8, other types their repr).
    """

    key: Any
    element: str
    stage: str
    error_type: str
    message: str
    traceback: str
    source: str | None = None
    row: int | None = None
    key_type: str | None = None

    def __post_init__(self):
        if self.row is not None and (not isinstance(self.row, int) or self.row < 0):
            raise ValueError(f"row must be a non-negative int or None, got {self.row!r}.")
        if self.source is not None and not isinstance(self.source, str):
            raise ValueError(f"source must be a str (a path) or None, got {self.source!r}.")

    @classmethod
    def from_exception(
        cls,
        error: BaseException,
        *,
        stage: str,
        element: Any,
        key: Any = None,
        source: str | None = None,
        row: int | None = None,
    ) -> FailedElement:
        """The record of ``error``, raised for ``element`` at ``stage``.

        ``error_type`` and ``message`` are those of ``error.__cause__`` when it has one (the
        original error under a wrapper such as ``CompileError``, whose hint the message keeps).
        """
        cause = error.__cause__ if error.__cause__ is not None else error
        trace = "".join(tb.format_exception(type(error), error, error.__traceback__))
        # CompileError's text is its cause's, after the cause's type name, then a hint.
        named, text = f"{type(cause).__name__}: ", str(error)
        return cls.from_error(
            type(cause).__name__,
            text.removeprefix(named) if text.startswith(named) else str(cause),
            stage=stage,
            element=describe(element),
            key=key,
            source=source,
            row=row,
            traceback=trace,
        )

    @classmethod
    def from_error(
        cls,
        error_type: str,
        message: str,
        *,
        stage: str,
        element: Any,
        key: Any = None,
        source: str | None = None,
        row: int | None = None,
        traceback: str = "",
    ) -> FailedElement:
        """The record of an error known by its type name and message (no exception object,
        e.g. one reported by another process); ``element`` is a description (a ``str``,
        kept) or a value (described)."""
        key, key_type = encodable_key(key)
        return cls(
            key=key,
            element=element if isinstance(element, str) else describe(element),
            stage=stage,
            error_type=error_type,
            message=_keep_ends(message, MAX_MESSAGE_CHARS),
            traceback=_keep_ends(traceback, MAX_TRACEBACK_CHARS),
            source=source,
            row=None if row is None else int(row),
            key_type=key_type,
        )

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> FailedElement:
        """A record read back from a file (``to_dict``/``to_json`` output, or a row of the
        schema in docs/dead_letters.md): lists become tuples again (JSON has no tuples)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - names)
        if unknown:
            raise ValueError(
                f"not a dead letter: unknown field(s) {unknown}; the fields are {sorted(names)}."
            )
        return cls(**{**fields, "key": _untuple(fields.get("key"))})

    def with_origin(
        self, *, key: Any = _KEEP, source: Any = _KEEP, row: Any = _KEEP
    ) -> FailedElement:
        """This record filed under another origin: the given ``key`` (encoded as
        ``from_error`` encodes keys), ``source`` and ``row``; the others kept."""
        changes: dict[str, Any] = {}
        if key is not _KEEP:
            changes["key"], changes["key_type"] = encodable_key(key)
        if source is not _KEEP:
            changes["source"] = source
        if row is not _KEEP:
            changes["row"] = None if row is None else int(row)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The record as a dict of plain values (a row for Parquet or a DataFrame)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The record as one line of JSON (no newline): its fields in the order of
        ``JSON_FIELDS``, where it came from first; ``FailedElement.from_dict(json.loads(
        line))`` reads it back to an equal record. Text is written as UTF-8, or escaped
        where it holds a lone surrogate that UTF-8 cannot encode."""
        fields = {name: getattr(self, name) for name in JSON_FIELDS}
        line = json.dumps(fields, ensure_ascii=False)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = json.dumps(fields)
        return line


JSON_FIELDS = (
    "key",
    "key_type",
    "source",
    "row",
    "stage",
    "error_type",
    "message",
    "element",
    "traceback",
)
"""The fields of a dead-letter line, in the order written: where the element came from,
then where and why it failed, then its echo and traceback (docs/dead_letters.md)."""


def _untuple(value: Any) -> Any:
    return tuple(_untuple(v) for v in value) if isinstance(value, list) else value
