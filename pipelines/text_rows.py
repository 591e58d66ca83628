"""Rows of ``(id, text)``: ids of the input's type (integers or strings) and the row checks
that ``pipelines.embed_yaml`` and the flagship share.

Example:
    >>> IdType(pa.int32()).accepts(2**40), row_problem(IdType(pa.string()), "a", 7)
    (False, "expected a string 'text', got text of type int")
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["IdType", "row_problem", "unicode_problem"]


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
                f"the id {_short(value, 80)} is a {type(value).__name__}, but this input's "
                f"ids are {self.describe()}"
            )
        return unicode_problem(value, "id") if isinstance(value, str) else None


def row_problem(id_type: IdType, key: Any, text: Any, problem: str | None = None) -> str | None:
    """Why a row read as ``(key, text)`` cannot be tokenized (``problem``, from reading it,
    comes first), or None if it can."""
    problem = problem or id_type.problem(key)
    if problem is None and not isinstance(text, str):
        got = f"text of type {type(text).__name__}" if text is not None else "a null text"
        problem = f"expected a string 'text', got {got}"
    return problem
