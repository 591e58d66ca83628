"""Reading the flagship's input one file at a time, so no file's fault can fail the job.

:func:`match_inputs` lists the files a pattern matches when the job is launched, and
:func:`id_type_of` reads the id type from the first file that has the columns. At run time
:class:`ReadRows` reads each file with pyarrow (Parquet, column by column) or line by line
(JSON lines) into :class:`~pipelines.text_rows.RowBatch` es. A fault in a row (invalid
UTF-8, a broken JSON line) becomes that row's problem, hence its dead letter. A fault in a
file (it cannot be opened, is not Parquet, lacks the columns, breaks off part-way) ends
that file with one :class:`UnreadableFile` record naming it, after the rows read before it.

Rows are grouped into parts: rows (for JSON lines, lines) ``[k * part_rows, (k + 1) *
part_rows)`` of a file, so every run of the same job cuts the same parts.

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
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines import corpus
from pipelines import text_rows as tr

__all__ = [
    "BUILTIN",
    "InputFile",
    "Inputs",
    "PartRows",
    "ReadRows",
    "UnreadableFile",
    "builtin_inputs",
    "id_type_of",
    "input_format",
    "match_inputs",
    "row_key",
    "split_row_key",
]

BUILTIN = "builtin"
ROWS_PER_BATCH = 1024  # one encode_batch call each
_COMPRESSED = (".gz", ".bz2", ".deflate", ".zst", ".zstd", ".lzma", ".xz")
_FORMATS = {"parquet": (".parquet", ".pq"), "jsonl": (".jsonl", ".json", ".ndjson")}
_BOM = b"\xef\xbb\xbf"
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

    def describe(self) -> dict[str, Any]:
        """For the job record: a rerun resumes only if this is unchanged."""
        return {
            "format": self.format,
            "builtin_texts": self.builtin_texts,
            "files": [[f.path, f.size, f.mtime] for f in self.files],
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
        ValueError: If no Parquet file has both columns (each file's problem is named), or
            the id column's type is neither integer nor string.
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
            with _open(file.path, CompressionTypes.UNCOMPRESSED) as f:
                schema = pq.read_schema(f)
        except Exception as e:  # noqa: BLE001 - its reading will dead-letter it; try the next
            problems.append(f"{file.path} cannot be read ({type(e).__name__}: {e})")
            continue
        missing = [c for c in ("id", "text") if c not in schema.names]
        if not missing:
            try:
                return tr.IdType(schema.field("id").type)
            except ValueError as e:
                raise ValueError(f"{file.path}: {e}") from None
        problems.append(f"{file.path} has no column {missing}; it has {schema.names}")
    shown = "; ".join(problems[:5]) + (f"; {len(problems) - 5} more" if problems[5:] else "")
    raise ValueError(
        f"no input file has both columns 'id' and 'text': {shown}. The input needs a string "
        "column 'text' and an integer or string column 'id'"
    )


def _id_type_of_json_lines(inputs: Inputs) -> tr.IdType:
    for file in inputs.files:
        try:
            with _open_lines(file.path) as f:
                for _ in range(_ID_SCAN_LINES):
                    line = f.readline()
                    if not line:
                        break
                    row = tr.parse_json_line(line.removeprefix(_BOM))
                    if isinstance(row[0], str):
                        return tr.IdType(pa.string())
                    if isinstance(row[0], int) and not isinstance(row[0], bool):
                        return tr.IdType(pa.int64())
        except Exception:  # noqa: BLE001, S112 - its reading will dead-letter it
            continue
    return tr.IdType(pa.int64())


def _open(path: str, compression: str = CompressionTypes.AUTO):
    if "://" not in path:
        mode = os.stat(path).st_mode  # follows links; a link to nothing raises here
        if not stat.S_ISREG(mode):
            # Opening a named pipe would wait for a writer forever.
            raise OSError(f"{path} is not a regular file (mode {stat.filemode(mode)})")
    return FileSystems.open(path, compression_type=compression)


@contextlib.contextmanager
def _open_lines(path: str) -> Iterator[Any]:
    """A binary file to read lines from, decompressed as its extension says."""
    decompressor = next((d for s, d in _DECOMPRESSORS.items() if path.lower().endswith(s)), None)
    if decompressor is None:
        with _open(path) as f:  # Beam's own decompression (.deflate, .zst), or none
            yield f
        return
    with _open(path, CompressionTypes.UNCOMPRESSED) as raw, decompressor(raw) as f:
        yield f


def row_key(file_index: int, position: int) -> str:
    """A row's key in RunKernel and in dead letters: which file, which row."""
    return f"{file_index}:{position}"


def split_row_key(key: str) -> tuple[int, int]:
    file_index, position = key.split(":")
    return int(file_index), int(position)


@dataclasses.dataclass(frozen=True)
class PartRows:
    """Rows of one part that one RowBatch holds: their positions in the file and their ids."""

    positions: list[int]
    ids: list[Any]


@dataclasses.dataclass(frozen=True)
class UnreadableFile:
    """A file whose reading failed after ``after_row`` rows (lines, for JSON lines)."""

    file_index: int
    after_row: int
    error_type: str
    message: str


class _Fault(Exception):
    def __init__(self, position: int, error: BaseException):
        super().__init__(str(error))
        self.position, self.error = position, error


_Row = tuple[int, Any, Any, "str | None"]  # position, id, text, problem
_Slab = tuple[list[int], list[Any], list[Any], list["str | None"]]


class ReadRows(beam.DoFn):
    """A file's index in; its ``RowBatch`` es out, their ``PartRows`` and any fault tagged.

    Outputs: ``RowBatch`` es of at most 1,024 rows of one part each (main); ``((file_index,
    part_start), PartRows)`` for each (``"parts"``); one ``UnreadableFile`` for a file that
    fails (``"unreadable"``).

    Args:
        inputs: The run's inputs.
        part_rows: Rows per part.
        done: ``(file_index, part_start)`` of parts already written; their rows are skipped.
    """

    PARTS = "parts"
    UNREADABLE = "unreadable"

    def __init__(self, inputs: Inputs, part_rows: int, done: frozenset[tuple[int, int]]):
        self._inputs = inputs
        self._part_rows = part_rows
        self._done = done

    def setup(self):
        self._unreadable = beam.metrics.Metrics.counter(tr.METRICS_NAMESPACE, "files_unreadable")

    def process(self, file_index: int) -> Iterator[Any]:
        path = self._inputs.files[file_index].path
        wanted, part_rows = self._wanted(file_index), self._part_rows
        if self._inputs.format == "parquet":
            slabs = _parquet(path, part_rows, wanted)
        elif self._inputs.format == "jsonl":
            slabs = _grouped(_json_lines(path, wanted), part_rows)
        else:
            slabs = _grouped(_builtin(self._inputs.builtin_texts, wanted), part_rows)
        try:
            for positions, ids, texts, problems in slabs:
                start = positions[0] // self._part_rows * self._part_rows
                keys = [row_key(file_index, p) for p in positions]
                yield beam.pvalue.TaggedOutput(
                    self.PARTS, ((file_index, start), PartRows(positions, ids))
                )
                yield tr.RowBatch(ids, texts, problems, keys)
        except _Fault as fault:
            self._unreadable.inc()
            error = fault.error
            yield beam.pvalue.TaggedOutput(
                self.UNREADABLE,
                UnreadableFile(file_index, fault.position, type(error).__name__, str(error)),
            )

    def _wanted(self, file_index: int) -> Callable[[int], bool]:
        part_rows, done = self._part_rows, self._done
        return lambda position: (file_index, position // part_rows * part_rows) not in done


def _parquet(path: str, part_rows: int, wanted: Callable[[int], bool]) -> Iterator[_Slab]:
    position = 0
    try:
        with _open(path, CompressionTypes.UNCOMPRESSED) as f:
            parquet = pq.ParquetFile(f)
            names = parquet.schema_arrow.names
            missing = [c for c in ("id", "text") if c not in names]
            if missing:
                raise ValueError(
                    f"has no column {missing}; it has {names}. Every file needs a string "
                    "column 'text' and an integer or string column 'id'"
                )
            batch_rows = min(ROWS_PER_BATCH, part_rows)
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=["id", "text"]):
                # Cut at part boundaries, so each slab lies in one part.
                offset = 0
                while offset < batch.num_rows:
                    start = position + offset
                    stop = min(batch.num_rows, offset + part_rows - start % part_rows)
                    if wanted(start):
                        yield _arrow_slab(start, batch.slice(offset, stop - offset))
                    offset = stop
                position += batch.num_rows
    except Exception as e:  # noqa: BLE001 - a file's fault ends that file, named
        raise _Fault(position, e) from e


def _arrow_slab(start: int, batch: pa.RecordBatch) -> _Slab:
    ids, id_problems = _python_values(batch.column("id"), "id")
    texts, text_problems = _python_values(batch.column("text"), "text")
    problems = [a or b for a, b in zip(id_problems, text_problems, strict=True)]
    return list(range(start, start + batch.num_rows)), ids, texts, problems


def _python_values(column: pa.Array, what: str) -> tuple[list[Any], list[str | None]]:
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


def _json_lines(path: str, wanted: Callable[[int], bool]) -> Iterator[_Row]:
    position = 0
    try:
        with _open_lines(path) as f:
            for line in iter(f.readline, b""):
                if position == 0:
                    line = line.removeprefix(_BOM)  # some editors write one; it is not JSON
                if line.strip() and wanted(position):
                    yield (position, *tr.parse_json_line(line))
                position += 1  # lines read: where a fault in the next one is reported
    except Exception as e:  # noqa: BLE001 - a file's fault ends that file, named
        raise _Fault(position, e) from e


def _builtin(n: int | None, wanted: Callable[[int], bool]) -> Iterator[_Row]:
    for position, text in corpus.builtin_corpus(n):
        if wanted(position):
            yield position, position, text, None


def _grouped(rows: Iterator[_Row], part_rows: int) -> Iterator[_Slab]:
    """Rows in slabs of at most 1,024 rows of one part; rows before a fault come first."""
    slab: list[_Row] = []
    try:
        for row in rows:
            if slab and (
                len(slab) == ROWS_PER_BATCH or row[0] // part_rows != slab[0][0] // part_rows
            ):
                yield _slab(slab)
                slab = []
            slab.append(row)
    except _Fault:
        if slab:
            yield _slab(slab)
        raise
    if slab:
        yield _slab(slab)


def _slab(rows: list[_Row]) -> _Slab:
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
