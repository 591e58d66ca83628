"""The flagship's input files, as matched when the job is launched, and how to open them.

:func:`match_inputs` lists the files a pattern matches (with their sizes and modification
times, which decide whether a rerun may resume), and :func:`id_type_of` reads the run's id
type from the first file that has the columns; a file that cannot be read is left for its
reading to dead-letter. :func:`open_lines` decompresses with Python's own readers, which
raise on a stream cut short. Reading rows is :mod:`pipelines.embed.read`.

Example:
    >>> builtin_inputs(3).files[0].source
    'builtin'
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import glob
import gzip
import hashlib
import lzma
import os
import re
import stat
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines import text_rows as tr

__all__ = [
    "BUILTIN",
    "BOM",
    "InputFile",
    "Inputs",
    "builtin_inputs",
    "id_type_of",
    "input_format",
    "match_inputs",
    "open_file",
    "open_lines",
]

BUILTIN = "builtin"
BOM = b"\xef\xbb\xbf"
_COMPRESSED = (".gz", ".bz2", ".deflate", ".zst", ".zstd", ".lzma", ".xz")
_FORMATS = {"parquet": (".parquet", ".pq"), "jsonl": (".jsonl", ".json", ".ndjson")}
# Python's readers raise on a stream cut short; Beam's gzip reader ends it without a word
# (measured: half a .jsonl.gz read as 1,434 of 3,000 lines, no error).
_DECOMPRESSORS = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    ".bz2": bz2.BZ2File,
    ".xz": lzma.LZMAFile,
    ".lzma": lzma.LZMAFile,
}
_ID_SCAN_LINES = 1000


def input_format(pattern: str) -> str:
    """``"parquet"`` or ``"jsonl"``, from the file extension of ``pattern``.

    Raises:
        ValueError: If the extension is neither.
    """
    name = pattern.lower()
    for suffix in _COMPRESSED:
        name = name.removesuffix(suffix)
    for format_, suffixes in _FORMATS.items():
        if name.endswith(suffixes):
            return format_
    raise ValueError(
        f"cannot tell the format of --input {pattern!r} from its extension; expected "
        "*.parquet (or .pq) for Parquet, *.jsonl (or .json, .ndjson, optionally compressed) "
        "for JSON lines"
    )


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One input file as matched at launch; ``size`` is None for a broken link."""

    path: str
    size: int | None
    mtime: float | None

    @property
    def source(self) -> str:
        """The file's name in part names: its stem and a hash of its full path."""
        if self.path == BUILTIN:
            return BUILTIN
        stem = re.split(r"[\\/]", self.path)[-1].lower()
        for suffix in (*_COMPRESSED, *_FORMATS["parquet"], *_FORMATS["jsonl"]):
            stem = stem.removesuffix(suffix)
        stem = re.sub(r"[^a-z0-9_.]+", "_", stem)[:40] or "input"
        return f"{stem}-{hashlib.sha1(self.path.encode()).hexdigest()[:8]}"


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a run reads: a format and its files (or the built-in corpus)."""

    format: str  # "parquet", "jsonl" or "builtin"
    files: tuple[InputFile, ...]
    builtin_texts: int | None = None
    # The input's column (Parquet) or field (JSON lines) names of each row's id and text;
    # readers hand rows on as "id" and "text", the names the output keeps.
    id_column: str = "id"
    text_column: str = "text"

    def __post_init__(self):
        if not self.id_column or not self.text_column or self.id_column == self.text_column:
            raise ValueError(
                f"the id and text columns must be two different names, got "
                f"{self.id_column!r} and {self.text_column!r}"
            )

    @property
    def columns(self) -> tuple[str, str]:
        """``(id column, text column)`` in the input files."""
        return self.id_column, self.text_column

    def file_name(self, file_index: int) -> str:
        """How dead letters and messages name a file."""
        path = self.files[file_index].path
        return "<built-in corpus>" if path == BUILTIN else path

    def describe(self) -> dict[str, Any]:
        """For the job record: a rerun resumes only if this is unchanged."""
        return {
            "format": self.format,
            "builtin_texts": self.builtin_texts,
            "files": [[f.path, f.size, f.mtime] for f in self.files],
            "columns": list(self.columns),
        }


def builtin_inputs(n: int | None) -> Inputs:
    return Inputs("builtin", (InputFile(BUILTIN, None, None),), n)


def match_inputs(pattern: str) -> Inputs:
    """The files ``pattern`` matches, sorted, with their sizes and modification times.

    Beam's matching skips a link to nothing without a word; for a local pattern it is
    listed here (size None), so that its reading fails and names it.

    Raises:
        ValueError: If the extension names no format.
        FileNotFoundError: If nothing matches.
    """
    format_ = input_format(pattern)
    found = {
        m.path: InputFile(m.path, m.size_in_bytes, m.last_updated_in_seconds)
        for m in FileSystems.match([pattern])[0].metadata_list
    }
    if "://" not in pattern:
        for path in glob.glob(pattern, recursive=True):
            if path not in found and os.path.islink(path) and not os.path.exists(path):
                found[path] = InputFile(path, None, None)
    if not found:
        raise FileNotFoundError(
            f"--input {pattern!r} matches no file; check the path and the glob (quote it so "
            "the shell does not expand it)"
        )
    return Inputs(format_, tuple(found[p] for p in sorted(found)))


def id_type_of(inputs: Inputs, name: str = "auto") -> tr.IdType:
    """The run's id type: ``name``, or read from the first file that has an ``id``.

    Parquet: the ``id`` column's type in the first file that has ``id`` and ``text``
    columns. JSON lines: the type of the first usable id in the first lines. Built-in
    corpus: int64.

    Raises:
        ValueError: If no Parquet file has both columns with an integer or string ``id``
            (each file's problem is named).
    """
    if name != "auto":
        return tr.IdType.from_name(name)
    if inputs.format == "builtin":
        return tr.IdType(pa.int64())
    if inputs.format == "jsonl":
        return _id_type_of_json_lines(inputs)
    problems = []
    for file in inputs.files:
        try:
            with open_file(file.path, CompressionTypes.UNCOMPRESSED) as f:
                schema = pq.read_schema(f)
        except Exception as e:  # noqa: BLE001 - its reading will dead-letter it; try the next
            problems.append(f"{file.path} cannot be read ({type(e).__name__}: {e})")
            continue
        missing = [c for c in inputs.columns if c not in schema.names]
        if missing:
            problems.append(f"{file.path} has no column {missing}; it has {schema.names}")
            continue
        try:
            return tr.IdType(schema.field(inputs.id_column).type)
        except ValueError as e:  # a float id column: this file's rows will say so
            problems.append(f"{file.path}: {e}")
    shown = "; ".join(problems[:5]) + (f"; {len(problems) - 5} more" if problems[5:] else "")
    raise ValueError(
        f"no input file has both columns {inputs.id_column!r} and {inputs.text_column!r} with "
        f"a usable id type: {shown}. The input needs a string column {inputs.text_column!r} "
        f"and an integer or string column {inputs.id_column!r} (--id_column, --text_column)"
    )


def _id_type_of_json_lines(inputs: Inputs) -> tr.IdType:
    for file in inputs.files:
        try:
            with open_lines(file.path) as f:
                for _ in range(_ID_SCAN_LINES):
                    line = f.readline()
                    if not line:
                        break
                    row = tr.parse_json_line(line.removeprefix(BOM), *inputs.columns)
                    if isinstance(row[0], str):
                        return tr.IdType(pa.string())
                    if isinstance(row[0], int) and not isinstance(row[0], bool):
                        return tr.IdType(pa.int64())
        except Exception:  # noqa: BLE001, S112 - its reading will dead-letter it
            continue
    return tr.IdType(pa.int64())


def open_file(path: str, compression: str = CompressionTypes.AUTO):
    """``FileSystems.open``, refusing a local path that is not a regular file."""
    if "://" not in path:
        mode = os.stat(path).st_mode  # follows links; a link to nothing raises here
        if not stat.S_ISREG(mode):
            # Opening a named pipe would wait for a writer forever.
            raise OSError(f"{path} is not a regular file (mode {stat.filemode(mode)})")
    return FileSystems.open(path, compression_type=compression)


@contextlib.contextmanager
def open_lines(path: str) -> Iterator[Any]:
    """A binary file to read lines from, decompressed as its extension says."""
    decompressor = next((d for s, d in _DECOMPRESSORS.items() if path.lower().endswith(s)), None)
    if decompressor is None:
        with open_file(path) as f:  # Beam's own decompression (.deflate, .zst), or none
            yield f
        return
    with open_file(path, CompressionTypes.UNCOMPRESSED) as raw, decompressor(raw) as f:
        yield f
