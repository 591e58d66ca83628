"""The run's inputs, its parts, and how a row is known on the way: its key.

A part is rows ``[start, end)`` of one input file, read as one Arrow record batch. A row's
key, ``file_index << 40 | row``, travels with it through the kernel (as its id column), so
every result and dead letter finds its part.

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
from beam_jax.internal import bad_lines_of

KEY = "key"
# Before a carried column's name on the way, so that an input column named "key" or "text"
# is carried beside the job's own columns of those names.
CARRIED = "embed_text.carried."
PART_FILE = b"embed_text.file"  # a part's file index (a part may hold no row, only bad lines)
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
    """What a run reads: ``--input``'s files as matched at launch (``format`` ``"parquet"``
    or ``"jsonl"``), or the built-in corpus (``"builtin"``, one file), with the flags that
    name its columns and ``carried``, the columns ``--keep_columns`` carries, typed."""

    format: str
    files: tuple[jobs.InputFile, ...]
    pattern: str | None = None
    builtin_texts: int | None = None
    id_column: str = "id"
    text_column: str = "text"
    carried: pa.Schema = pa.schema([])

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
        keep = args.keep_columns
        carried = jobs.column_types([f.path for f in files], keep) if keep else pa.schema([])
        return cls(format_, files, args.input, None, args.id_column, args.text_column, carried)

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
            **({"carried": self.carried.names} if self.carried.names else {}),
        }


@dataclasses.dataclass(frozen=True)
class Part:
    """One part: its file, its rows (positions in the file) and their ids, the columns it
    carries, and the dead letters of its bad JSON lines (``beam_jax.internal.bad_lines_of``)."""

    file_index: int
    positions: np.ndarray
    ids: pa.Array
    carried: pa.RecordBatch | None = None
    bad_lines: tuple = ()

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> Part:
        """The part in a record batch of ``key``, ``id``, ``text`` and the columns carried."""
        files, positions = split_keys(batch.column(KEY).to_numpy())
        meta = batch.schema.metadata or {}
        file_index = int(meta[PART_FILE]) if PART_FILE in meta else int(files[0])
        extra = [c for c in batch.schema.names if c.startswith(CARRIED)]
        names = [c.removeprefix(CARRIED) for c in extra]
        carried = batch.select(extra).rename_columns(names) if extra else None
        return cls(file_index, positions, batch.column("id"), carried, tuple(bad_lines_of(batch)))

    @property
    def size(self) -> int:
        """Its rows and its bad lines: each ends as an embedding or a dead letter."""
        return len(self.positions) + len(self.bad_lines)

    @property
    def start(self) -> int:
        return min([*self.positions[:1].tolist(), *(d.row for d in self.bad_lines)])

    @property
    def end(self) -> int:
        return max([*self.positions[-1:].tolist(), *(d.row for d in self.bad_lines)]) + 1
