"""Reading the flagship's rows one file at a time, so no file's fault can fail the job.

:class:`ReadRows` reads each file with pyarrow (Parquet, column by column) or line by line
(JSON lines) into :class:`~pipelines.text_rows.RowBatch` es. A fault in a row (invalid
UTF-8, a broken JSON line) becomes that row's problem, hence its dead letter. A fault in a
file (it cannot be opened, is not Parquet, lacks the columns, breaks off part-way) ends
that file with one :class:`UnreadableFile` record naming it, after the rows read before it.
Which files, and the id type, are settled at launch (:mod:`pipelines.input_files`).

Rows are grouped into parts: rows (for JSON lines, lines) ``[k * part_rows, (k + 1) *
part_rows)`` of a file, so every run of the same job cuts the same parts.

Example:
    >>> split_row_key(row_key(3, 17))
    (3, 17)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes

from pipelines import corpus
from pipelines import text_rows as tr
from pipelines.input_files import BOM, Inputs, open_file, open_lines

__all__ = [
    "FileFault",
    "PartRows",
    "ReadRows",
    "UnreadableFile",
    "parquet_batches",
    "python_values",
    "row_key",
    "split_row_key",
]

ROWS_PER_BATCH = 1024  # one encode_batch call each


def row_key(file_index: int, position: int) -> tuple[int, int]:
    """A row's key in RunKernel and in dead letters: which file, which row (a tuple, which
    ``FailedElement.key`` keeps as one)."""
    return (file_index, position)


def split_row_key(key: tuple[int, int]) -> tuple[int, int]:
    file_index, position = key
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


class FileFault(Exception):
    """A fault that ends a file's reading after ``position`` rows; ``error`` is the cause."""

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
            slabs = (
                _arrow_slab(*b)
                for b in parquet_batches(path, part_rows, wanted, self._inputs.columns)
            )
        elif self._inputs.format == "jsonl":
            slabs = _grouped(_json_lines(path, wanted, self._inputs.columns), part_rows)
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
        except FileFault as fault:
            self._unreadable.inc()
            error = fault.error
            yield beam.pvalue.TaggedOutput(
                self.UNREADABLE,
                UnreadableFile(file_index, fault.position, type(error).__name__, str(error)),
            )

    def _wanted(self, file_index: int) -> Callable[[int], bool]:
        part_rows, done = self._part_rows, self._done
        return lambda position: (file_index, position // part_rows * part_rows) not in done


def parquet_batches(
    path: str,
    part_rows: int,
    wanted: Callable[[int], bool],
    columns: tuple[str, str] = ("id", "text"),
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(first row's position, record batch of id and text)``: a file's wanted rows, in
    batches of at most 1,024 rows of one part each. ``columns`` are the file's id and text
    columns, renamed ``id`` and ``text``.

    Raises:
        FileFault: The file cannot be read (on or after the rows already yielded).
    """
    position = 0
    try:
        with open_file(path, CompressionTypes.UNCOMPRESSED) as f:
            parquet = pq.ParquetFile(f)
            names = parquet.schema_arrow.names
            missing = [c for c in columns if c not in names]
            if missing:
                raise ValueError(
                    f"has no column {missing}; it has {names}. Every file needs a string "
                    f"column {columns[1]!r} and an integer or string column {columns[0]!r}"
                )
            batch_rows = min(ROWS_PER_BATCH, part_rows)
            for read in parquet.iter_batches(batch_size=batch_rows, columns=list(columns)):
                batch = pa.RecordBatch.from_arrays(
                    [read.column(columns[0]), read.column(columns[1])], names=["id", "text"]
                )
                # Cut at part boundaries, so each slab lies in one part.
                offset = 0
                while offset < batch.num_rows:
                    start = position + offset
                    stop = min(batch.num_rows, offset + part_rows - start % part_rows)
                    if wanted(start):
                        yield start, batch.slice(offset, stop - offset)
                    offset = stop
                position += batch.num_rows
    except Exception as e:  # noqa: BLE001 - a file's fault ends that file, named
        raise FileFault(position, e) from e


def _arrow_slab(start: int, batch: pa.RecordBatch) -> _Slab:
    ids, id_problems = python_values(batch.column("id"), "id")
    texts, text_problems = python_values(batch.column("text"), "text")
    problems = [a or b for a, b in zip(id_problems, text_problems, strict=True)]
    return list(range(start, start + batch.num_rows)), ids, texts, problems


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


def _json_lines(
    path: str, wanted: Callable[[int], bool], columns: tuple[str, str] = ("id", "text")
) -> Iterator[_Row]:
    position = 0
    try:
        with open_lines(path) as f:
            for line in iter(f.readline, b""):
                if position == 0:
                    line = line.removeprefix(BOM)  # some editors write one; it is not JSON
                if line.strip() and wanted(position):
                    yield (position, *tr.parse_json_line(line, *columns))
                position += 1  # lines read: where a fault in the next one is reported
    except Exception as e:  # noqa: BLE001 - a file's fault ends that file, named
        raise FileFault(position, e) from e


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
    except FileFault:
        if slab:
            yield _slab(slab)
        raise
    if slab:
        yield _slab(slab)


def _slab(rows: list[_Row]) -> _Slab:
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
