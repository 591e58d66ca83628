"""A part, and how its rows are known on the way: keys, the part record, ids as read.

A part is rows ``[start, end)`` of one input file (lines, for JSON lines), read as one
Arrow record batch. A row's key is ``file_index << 40 | row``: it travels with the row
through tokenizing and the kernel (as ``RunKernelOnArrow``'s id column), so every result
and dead letter finds its part. The tokenize step tells the writer which part it opened
(:class:`Part`: its rows and their ids).

Example:
    >>> split_keys(np.array([row_key(3, 17)]))
    (array([3]), array([17]))
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["KEY", "PROBLEM", "RAW_ID", "Part", "python_values", "row_key", "split_keys"]

KEY = "key"
PROBLEM = "problem"  # why a row cannot be used as read (JSON lines), else null
RAW_ID = "raw_id"  # a problem row's id as read, as JSON (it may fit no Arrow type)
ROW_BITS = 40  # rows per file < 2**40; files < 2**23
ROW_MASK = (1 << ROW_BITS) - 1


def row_key(file_index: int, position: int) -> int:
    """A row's key in the job: which file, which row, in one ``int64``."""
    return file_index << ROW_BITS | position


def split_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(file_index, row)`` arrays of an array of keys."""
    keys = np.asarray(keys, np.int64)
    return keys >> ROW_BITS, keys & ROW_MASK


@dataclasses.dataclass(frozen=True)
class Part:
    """One part opened: its rows (positions in the file) and their ids as read.

    Attributes:
        file_index: The input file.
        positions: Each row's position (row, or line for JSON lines), increasing.
        ids: The rows' ids as read (an Arrow column).
        raw: For JSON lines, ``[id, text]`` as read (JSON) of each row that could not be
            used, else null; ``None`` for other inputs.
    """

    file_index: int
    positions: np.ndarray
    ids: pa.Array
    raw: pa.Array | None = None

    @property
    def start(self) -> int:
        return int(self.positions[0])

    @property
    def end(self) -> int:
        return int(self.positions[-1]) + 1

    def id_of(self, index: np.ndarray) -> list[Any]:
        """The ids (as Python values, for dead letters) of rows ``index`` of the part."""
        take = pa.array(np.asarray(index, np.int64))
        values, _ = python_values(self.ids.take(take), "id")
        if self.raw is not None:
            for i, raw in enumerate(self.raw.take(take).to_pylist()):
                if raw is not None:
                    values[i] = json.loads(raw)[0]
        return values


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
