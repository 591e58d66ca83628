"""Rows of ``(id, text)`` for ``pipelines.embed_yaml``: the library's id types
(``beam_jax.text.IdType``) and the YAML rows' check.

Example:
    >>> row_problem(IdType(pa.string()), "a", 7)
    "expected a string 'text', got text of type int"
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # noqa: F401 - the example's

from beam_jax.text import IdType, unicode_problem

__all__ = ["IdType", "row_problem", "unicode_problem"]


def row_problem(id_type: IdType, key: Any, text: Any, problem: str | None = None) -> str | None:
    """Why a row read as ``(key, text)`` cannot be tokenized (``problem``, from reading it,
    comes first), or None if it can."""
    problem = problem or id_type.problem(key)
    if problem is None and not isinstance(text, str):
        got = f"text of type {type(text).__name__}" if text is not None else "a null text"
        problem = f"expected a string 'text', got {got}"
    return problem
