"""The run's inputs, its parts, and how a row is known on the way: its key.

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
import hashlib
import re
from typing import Any

import numpy as np
import pyarrow as pa

from beam_jax import jobs

__all__ = ["KEY", "Inputs", "Part", "python_values", "row_key", "split_keys"]

KEY = "key"
ROW_BITS = 40  # rows per file < 2**40; files < 2**23
ROW_MASK = (1 << ROW_BITS) - 1
BUILTIN = "builtin"
# Left out of part names, in this order: compression, then format.
_SUFFIXES = (".gz", ".bz2", ".deflate", ".zst", ".zstd", ".lzma", ".xz", ".parquet", ".pq",
             ".jsonl", ".json", ".ndjson")  # fmt: skip


def row_key(file_index: int, position: int) -> int:
    """A row's key in the job: which file, which row, in one ``int64``."""
    return file_index << ROW_BITS | position


def split_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(file_index, row)`` arrays of an array of keys."""
    keys = np.asarray(keys, np.int64)
    return keys >> ROW_BITS, keys & ROW_MASK


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a run reads: ``--input``'s files as matched at launch, or the built-in corpus.

    Attributes:
        format: ``"parquet"``, ``"jsonl"`` or ``"builtin"``.
        files: The files (the built-in corpus is one, ``"builtin"``).
        pattern: ``--input``.
        builtin_texts: ``--builtin_texts``.
        id_column: The input's id column or field (the output names it ``id``).
        text_column: The input's text column or field.
    """

    format: str
    files: tuple[jobs.InputFile, ...]
    pattern: str | None = None
    builtin_texts: int | None = None
    id_column: str = "id"
    text_column: str = "text"

    @classmethod
    def from_args(cls, args: Any) -> Inputs:
        """``--input`` matched now, with ``--id_column`` and ``--text_column``.

        Raises:
            ValueError: If the extension names no format.
            FileNotFoundError: If nothing matches.
        """
        if args.input is None:
            return cls("builtin", (jobs.InputFile(BUILTIN, None, None),), None, args.builtin_texts)
        format_ = jobs.input_format(args.input)
        files = jobs.match_inputs(args.input)
        return cls(format_, files, args.input, None, args.id_column, args.text_column)

    @property
    def columns(self) -> tuple[str, str]:
        """``(id column, text column)`` in the input files."""
        return self.id_column, self.text_column

    def file_name(self, file_index: int) -> str:
        """How dead letters and messages name a file."""
        path = self.files[file_index].path
        return "<built-in corpus>" if path == BUILTIN else path

    def source(self, file_index: int) -> str:
        """The file's name in part names: its stem and a hash of its full path."""
        path = self.files[file_index].path
        if path == BUILTIN:
            return BUILTIN
        stem = re.split(r"[\\/]", path)[-1].lower()
        for suffix in _SUFFIXES:
            stem = stem.removesuffix(suffix)
        stem = re.sub(r"[^a-z0-9_.]+", "_", stem)[:40] or "input"
        return f"{stem}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"

    def describe(self) -> dict[str, Any]:
        """For the job record: a rerun resumes only if this is unchanged."""
        return {
            "format": self.format,
            "builtin_texts": self.builtin_texts,
            "files": [[f.path, f.size, f.mtime] for f in self.files],
            "columns": list(self.columns),
        }


@dataclasses.dataclass(frozen=True)
class Part:
    """One part opened: its file, its rows (positions in the file) and their ids as read."""

    file_index: int
    positions: np.ndarray
    ids: pa.Array

    @property
    def start(self) -> int:
        return int(self.positions[0])

    @property
    def end(self) -> int:
        return int(self.positions[-1]) + 1

    def id_of(self, index: np.ndarray) -> list[Any]:
        """The ids (as Python values, for dead letters) of rows ``index`` of the part."""
        return python_values(self.ids.take(pa.array(np.asarray(index, np.int64))), "id")[0]


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
