"""Rows of ``(id, text)``: ids of the input's type (integers or strings) and the row checks
that the tokenize step (:class:`beam_jax.text.TokenizeBatches`) and the YAML front end share.

Example:
    >>> IdType(pa.int32()).accepts(2**40), IdType(pa.string()).problem(7)
    (False, "the id 7 is an int, but this input's ids are strings (string)")
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pyarrow as pa

from beam_jax._src.core.wording import article

__all__ = ["IdType", "python_values", "unicode_problem"]


def _short(value: Any, limit: int) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unicode_problem(value: str, what: str) -> str | None:
    """Why ``value`` cannot be written as UTF-8 (a lone surrogate), or None if it can."""
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"the {what} holds a lone surrogate ({value[e.start]!r} at index {e.start}), which "
            "JSON's \\uXXXX escapes allow but Unicode text does not; fix the program that "
            "wrote it (it split a UTF-16 pair)"
        )
    return None


@dataclasses.dataclass(frozen=True)
class IdType:
    """The type of the ``id`` column: integer or string, and its Arrow type for the output.

    Args:
        arrow_type: An Arrow integer or string type.
    """

    arrow_type: pa.DataType

    def __post_init__(self):
        t = self.arrow_type
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise ValueError(
                f"the id column has Arrow type {t}; expected an integer or string type. "
                "Cast the ids (e.g. to int64 or string) before embedding"
            )

    @classmethod
    def from_name(cls, name: str) -> IdType:
        """``"int"`` (int64) or ``"string"``."""
        types = {"int": pa.int64(), "string": pa.string()}
        if name not in types:
            raise ValueError(f"id type must be one of {sorted(types)}, got {name!r}")
        return cls(types[name])

    @property
    def is_integer(self) -> bool:
        return pa.types.is_integer(self.arrow_type)

    @functools.cached_property
    def _range(self) -> tuple[int, int]:
        t = self.arrow_type
        kind = "i" if pa.types.is_signed_integer(t) else "u"
        info = np.iinfo(np.dtype(f"{kind}{t.bit_width // 8}"))
        return int(info.min), int(info.max)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (a Python scalar) fits this id type."""
        if self.is_integer:
            if isinstance(value, bool) or not isinstance(value, int):
                return False
            low, high = self._range
            return low <= value <= high
        return isinstance(value, str)

    def describe(self) -> str:
        return f"{'integers' if self.is_integer else 'strings'} ({self.arrow_type})"

    def problem(self, value: Any) -> str | None:
        """Why ``value`` cannot be this input's id, or None if it can."""
        if value is None:
            return "the row has no id (null or missing); every row needs one"
        if not self.accepts(value):
            return (
                f"the id {_short(value, 80)} is {article(type(value).__name__)} "
                f"{type(value).__name__}, but this input's "
                f"ids are {self.describe()}"
            )
        return unicode_problem(value, "id") if isinstance(value, str) else None


def python_values(column: pa.Array, what: str) -> tuple[list[Any], list[str | None]]:
    """The column as Python values; invalid UTF-8 makes a row's problem, not an exception."""
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        try:
            return column.to_pylist(), [None] * len(column)
        except UnicodeDecodeError:
            binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
            column = column.cast(binary)  # the same bytes, unchecked
    values, problems = [], []
    for raw in column.to_pylist():
        try:
            values.append(None if raw is None else raw.decode("utf-8"))
            problems.append(None)
        except UnicodeDecodeError as e:
            values.append(raw.decode("utf-8", errors="backslashreplace"))
            problems.append(
                f"the {what} is not valid UTF-8 ({e.reason} at byte {e.start}, near "
                f"{raw[max(0, e.start - 20) : e.end + 20]!r}); fix the program that wrote it"
            )
    return values, problems
