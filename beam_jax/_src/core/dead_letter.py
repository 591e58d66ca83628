"""The dead-letter record: one per failed element, never one per batch."""

from __future__ import annotations

import dataclasses
import json
import traceback as tb
from typing import Any

import numpy as np

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


def encodable_key(key: Any) -> Any:
    """``key`` itself if JSON and Parquet can hold it, else its bounded repr."""
    if key is None or isinstance(key, bool | int | float | str):
        if isinstance(key, str):
            return _truncate(key, MAX_ECHO_CHARS)
        return key
    if isinstance(key, np.generic) and key.dtype.kind in "biuf":
        return key.item()
    if isinstance(key, bytes):
        return _truncate(key.decode("utf-8", errors="backslashreplace"), MAX_ECHO_CHARS)
    return describe(key)


@dataclasses.dataclass(frozen=True)
class FailedElement:
    """Why one element produced no result.

    Every field is a plain ``str`` (or a JSON scalar for ``key``), so records can be written
    to JSON lines or Parquet without pickling; echoes of the element are bounded in size.

    Attributes:
        key: the element's key for keyed input (``None`` otherwise).
        element: a truncated description of the failed element.
        stage: where it failed: ``"validation"``, ``"compile"``, ``"kernel"`` or ``"output"``.
        error_type: the exception's class name.
        message: the exception's message.
        traceback: the formatted traceback, truncated.
    """

    key: Any
    element: str
    stage: str
    error_type: str
    message: str
    traceback: str

    @classmethod
    def from_exception(
        cls, error: BaseException, *, stage: str, element: Any, key: Any = None
    ) -> FailedElement:
        """The record of ``error``, raised for ``element`` at ``stage``.

        ``error_type`` and ``message`` are those of ``error.__cause__`` when it has one (the
        original error under a wrapper such as ``CompileError``).
        """
        cause = error.__cause__ if error.__cause__ is not None else error
        trace = "".join(tb.format_exception(type(error), error, error.__traceback__))
        return cls(
            key=encodable_key(key),
            element=describe(element),
            stage=stage,
            error_type=type(cause).__name__,
            message=_keep_ends(str(cause), MAX_MESSAGE_CHARS),
            traceback=_keep_ends(trace, MAX_TRACEBACK_CHARS),
        )

    def to_dict(self) -> dict[str, Any]:
        """The record as a dict of plain values (a row for Parquet or a DataFrame)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The record as one line of JSON, keys sorted; ``FailedElement(**json.loads(line))``
        reads it back."""
        return json.dumps(self.to_dict(), sort_keys=True)
