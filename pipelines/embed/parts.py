"""The run's inputs, its parts, and how a row is known on the way: its key.

A part is rows ``[start, end)`` of one input file (lines, for JSON lines), read as one
Arrow record batch. A row's key is ``file_index << 40 | row``: it travels with the row
through tokenizing and the kernel (as ``RunKernelOnArrow``'s id column), so every result
and dead letter finds its part (:class:`Part`: its rows and their ids).

Example:
    >>> split_keys(np.array([3 << ROW_BITS | 17]))
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

__all__ = ["KEY", "METRICS_NAMESPACE", "ROW_BITS", "Inputs", "Part", "split_keys"]

KEY = "key"
METRICS_NAMESPACE = "embed_text"  # the job's own counters (rows, parts, dead letters)
ROW_BITS = 40  # rows per file < 2**40; files < 2**23
ROW_MASK = (1 << ROW_BITS) - 1
BUILTIN = "builtin"
BUILTIN_NAME = "<built-in corpus>"  # how dead letters name it
# Left out of part names, in this order: compression, then format.
_SUFFIXES = (
    *(".gz", ".bz2", ".deflate", ".zst", ".zstd", ".lzma", ".xz"),
    *(".parquet", ".pq", ".jsonl", ".json", ".ndjson"),
)


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
        return BUILTIN_NAME if path == BUILTIN else path

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
    """One part: its file, its rows (positions in the file) and their ids as read."""

    file_index: int
    positions: np.ndarray
    ids: pa.Array

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> Part:
        """The part a record batch of ``key`` and ``id`` holds."""
        files, positions = split_keys(batch.column(KEY).to_numpy())
        return cls(int(files[0]), positions, batch.column("id"))

    @property
    def start(self) -> int:
        return int(self.positions[0])

    @property
    def end(self) -> int:
        return int(self.positions[-1]) + 1

    def id_of(self, index: int) -> Any:
        """The id of row ``index`` of the part, for a dead letter of the kernel (whose rows'
        ids passed the tokenize step's checks: valid UTF-8)."""
        return self.ids[index].as_py()
