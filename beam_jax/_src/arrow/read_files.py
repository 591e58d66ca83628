"""The read steps of ``ReadArrowBatches``, one file (or a run of a file's row groups) at a
time: Parquet files listed and read by row groups, JSON-lines files read whole, and the one
failure path of every step (raise, or one dead letter)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_jax._src.arrow import coder  # noqa: F401 - registers ArrowCoder for record batches
from beam_jax._src.arrow.ahead import WorkAhead
from beam_jax._src.arrow.json_lines import (
    BadLine,
    FileCut,
    LineBatch,
    open_stream,
    read_json_lines,
)
from beam_jax._src.arrow.origin import BAD_LINES_KEY, FIRST_ROW_KEY, ROW_COLUMN, stamp_origin
from beam_jax._src.core.dead_letter import DEAD_LETTERS, METRICS_NAMESPACE, FailedElement, Stage
from beam_jax._src.errors import InputFileError, InputLineError


class ListRowGroups(beam.DoFn):
    """A file path -> ``(path, row group, rows)`` for each of its row groups (reads the
    footer); with ``max_rows``, consecutive row groups of at most ``max_rows`` rows in all
    are one ``(path, (row group, ...), rows)``, read together."""

    def __init__(self, columns: list[str] | None, handle_errors: bool, max_rows: int | None = None):
        self._columns = columns
        self._handle_errors = handle_errors
        self._max_rows = max_rows

    def process(self, path: str):
        error = None
        try:
            with FileSystems.open(path) as f:
                parquet = pq.ParquetFile(f)
                meta, names = parquet.metadata, parquet.schema_arrow.names
        except Exception as e:  # noqa: BLE001 - a file that cannot be opened is reported
            error = InputFileError(
                f"cannot read Parquet file {path}: {type(e).__name__}: {e}. Fix or remove the "
                f"file{_or_dead_letter(self._handle_errors, 'it')}."
            )
        if error is None and self._columns:
            missing = [c for c in self._columns if c not in names]
            if missing:
                error = InputFileError(
                    f"Parquet file {path} has no column(s) {missing}; its columns are {names}. "
                    "Every file of the pattern needs the columns read."
                )
        if error is not None:
            yield _unreadable(error, self._handle_errors, "files_failed", path, {"file": path})
            return
        Metrics.counter(METRICS_NAMESPACE, "files_read").inc()
        counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        for groups in row_group_runs(counts, self._max_rows):
            rows = sum(counts[g] for g in groups)
            yield (path, groups[0] if len(groups) == 1 else tuple(groups), rows)


def row_group_runs(counts: Sequence[int], max_rows: int | None) -> list[list[int]]:
    """Consecutive row groups (of ``counts`` rows each) with at most ``max_rows`` rows in
    all, in order; a row group of more rows is a run of its own.

    Example:
        >>> row_group_runs([4, 4, 4, 9, 2, 2], 8)
        [[0, 1], [2], [3], [4, 5]]
    """
    runs: list[list[int]] = []
    total = 0
    for group, rows in enumerate(counts):
        if runs and max_rows is not None and total + rows <= max_rows:
            runs[-1].append(group)
            total += rows
        else:
            runs.append([group])
            total = rows
    return runs


# Footers kept per reader: a worker reads row groups of many files in any order.
_FOOTERS_KEPT = 64


class _Footer(NamedTuple):
    metadata: pq.FileMetaData
    starts: list[int]  # the file row of each row group's first row


class _Read(NamedTuple):
    """One read of consecutive row groups of a Parquet file: their rows, or why not."""

    path: str
    groups: tuple[int, ...]
    rows: int | None  # in all, as the footer says (None: not known)
    table: pa.Table | None
    error: Exception | None
    first: int | None  # the file row of the first group's first row


@contextlib.contextmanager
def _open_parquet(path: str):
    """Opens ``path`` for reading one row group: ``(file, cache key or None)``.

    A local file is memory-mapped for the one read (pyarrow reads the row
    group's pages straight from the page cache, without a Python file object holding the
    GIL on every read or a copy into read buffers; the map is closed after the read, so
    the process's resident memory does not grow with the file). Other files go through
    Beam's file systems.
    """
    if "://" not in path:
        stat = os.stat(path)
        with pa.memory_map(path) as f:
            yield f, (path, stat.st_size, stat.st_mtime_ns)
    else:
        with FileSystems.open(path) as f:
            yield f, None


class ReadRowGroup(beam.DoFn):
    """``(path, row group, rows)`` -> record batches of at most ``max_rows`` rows; for
    ``(path, (row group, ...), rows)`` the row groups are read in one call and their rows
    batched together (if that read fails, they are read one by one, and only a row group
    that cannot be read is a dead letter).

    Reads one element ahead (:class:`~beam_jax._src.arrow.ahead.WorkAhead`): the row
    groups of an element are read in a background thread (pyarrow releases the GIL while
    it reads and decodes) while the batches of the previous one go downstream, so reading
    overlaps the steps fused after it (decoding, padding, the kernel). The last one is
    emitted at the end of the bundle; at most two elements are held at once.
    """

    def __init__(self, columns: list[str] | None, max_rows: int | None, handle_errors: bool):
        self._columns = columns
        self._max_rows = max_rows
        self._handle_errors = handle_errors
        self._footers: dict[Any, _Footer] = {}  # by (path, size, modification time)
        self._ahead = WorkAhead("beam_jax-read")

    def setup(self):
        self._ahead.setup()

    def start_bundle(self):
        self._ahead.start_bundle()

    def process(self, item, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        work = functools.partial(self._read, item)
        yield from self._ahead.submit(work, self._emit_read, window, timestamp)

    def finish_bundle(self):
        yield from self._ahead.finish_bundle()

    def teardown(self):
        self._ahead.teardown()

    def _emit_read(self, reads: list[_Read]):
        for read in reads:
            yield from self._emit(read)

    def _read(self, item) -> list[_Read]:
        """Reads an element's row groups: one read for them all, or one per row group if
        reading them together failed."""
        path, group, rows = item
        if isinstance(group, int):
            return [self._read_groups(path, (group,), rows)]
        together = self._read_groups(path, tuple(group), rows)
        if together.error is None:
            return [together]
        return [self._read_groups(path, (g,), None) for g in group]

    def _read_groups(self, path: str, groups: tuple[int, ...], rows: int | None) -> _Read:
        error, first, table = None, None, None
        try:
            with _open_parquet(path) as (f, key):
                footer = self._footer(f, key)
                if groups[0] < len(footer.starts):
                    first = footer.starts[groups[0]]
                    if rows is None:
                        rows = footer.metadata.row_group(groups[0]).num_rows
                parquet = pq.ParquetFile(f, metadata=footer.metadata)
                if len(groups) == 1:
                    table = parquet.read_row_group(groups[0], columns=self._columns)
                else:
                    table = parquet.read_row_groups(list(groups), columns=self._columns)
        except Exception as e:  # noqa: BLE001 - a corrupt row group is reported, not fatal
            later = _or_dead_letter(self._handle_errors, "its unreadable row groups")
            error = InputFileError(
                f"cannot read {_groups_name(groups)}{'' if rows is None else f' ({rows} rows)'}"
                f" of Parquet file {path}: {type(e).__name__}: {e}. Fix or remove the "
                f"file{later}."
            )
        return _Read(path, groups, rows, table, error, first)

    def _footer(self, f, key) -> _Footer:
        """The file's footer, parsed once per worker for a local file (``key`` its path,
        size and modification time; ``None``: not cached)."""
        footers = self._footers
        footer = footers.get(key) if key is not None else None
        if footer is None:
            metadata = pq.ParquetFile(f).metadata
            counts = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
            starts = [0, *itertools.accumulate(counts)][: len(counts)]
            footer = _Footer(metadata, starts)
            if key is not None:
                if len(footers) >= _FOOTERS_KEPT:
                    footers.pop(next(iter(footers)))
                footers[key] = footer
        return footer

    def _emit(self, read: _Read):
        path, groups, first = read.path, read.groups, read.first
        if read.error is not None:  # one row group: a failed run is read group by group
            where = {"file": path, "row_group": groups[0], "rows": read.rows}
            yield _unreadable(
                read.error, self._handle_errors, "row_groups_failed", path, where, row=first
            )
            return
        table = read.table
        if len(groups) > 1:
            table = table.combine_chunks()  # one chunk: batches span the row groups
        for batch in _to_batches(table, self._max_rows):
            yield stamp_origin(batch, path, f"{path} ({_groups_name(groups)})", first)
            first += batch.num_rows


def _groups_name(groups: Sequence[int]) -> str:
    if len(groups) == 1:
        return f"row group {groups[0]}"
    return f"row groups {groups[0]}-{groups[-1]}"


# What a bad line's message advises a library caller besides fixing the line, where a
# field does not fit its column's type.
_SCHEMA_FIX = "read the column with a type that holds it (the schema argument)"


class ReadJsonLines(beam.DoFn):
    """A JSON-lines file's path -> record batches of its rows; each bad line, and a file
    that cannot be opened or is cut short, one dead letter (``in_batches``: a bad line's
    in the metadata of the batch read after it)."""

    def __init__(
        self,
        schema: pa.Schema,
        max_rows: int | None,
        key: str | None,
        handle_errors: bool,
        type_fix: Mapping[str, str] | None = None,
        in_batches: bool = False,
    ):
        self._schema = schema
        self._max_rows = max_rows
        self._key = key
        self._handle_errors = handle_errors
        self._type_fix = type_fix
        self._in_batches = in_batches and handle_errors

    def process(self, path: str):
        with contextlib.ExitStack() as stack:
            yield from self._read(path, stack)

    def _read(self, path: str, stack: contextlib.ExitStack):
        handle = self._handle_errors
        try:
            stream = open_stream(path, stack)
        except Exception as e:  # noqa: BLE001 - a file that cannot be opened is reported
            error = InputFileError(
                f"cannot open JSON-lines file {path}: {type(e).__name__}: {e}. Fix or remove "
                f"the file{_or_dead_letter(handle, 'it')}."
            )
            yield _unreadable(error, handle, "files_failed", path, {"file": path})
            return
        Metrics.counter(METRICS_NAMESPACE, "files_read").inc()
        pending: list[FailedElement] = []  # in_batches: bad lines before the next batch
        try:
            for item in read_json_lines(
                stream,
                self._schema,
                max_rows=self._max_rows,
                key=self._key,
                gaps=self._in_batches,
            ):
                if isinstance(item, LineBatch):
                    yield self._batch(path, item, pending)
                    pending = []
                elif self._in_batches:
                    pending.append(self._bad_line(path, item).value)
                else:
                    yield self._bad_line(path, item)
        except FileCut as cut:
            if pending:  # the bad lines before the cut, in a batch of no rows
                yield self._batch(path, None, pending)
                pending = []
            error = InputFileError(
                f"JSON-lines file {path} breaks off at line {cut.line + 1} ({cut}); the "
                f"{cut.line} lines before it were read. Fix or replace the "
                f"file{_or_dead_letter(handle, 'it')}."
            )
            where = {"file": path, "line": cut.line}
            yield _unreadable(error, handle, "files_failed", path, where, row=cut.line)
        if pending:  # bad lines after the file's last row, in a batch of no rows
            yield self._batch(path, None, pending)

    def _batch(
        self, path: str, item: LineBatch | None, dead: list[FailedElement]
    ) -> pa.RecordBatch:
        """A batch as read, saying where (a ``ROW_COLUMN`` where its rows skip lines), and
        the dead letters of the bad lines before it in its metadata (:func:`bad_lines_of`)."""
        if item is None:
            batch = pa.RecordBatch.from_pylist([], schema=self._schema)
            first = dead[0].row
        else:
            batch, first = item.batch, item.first_line
        source = f"{path} (line {first + 1})"  # from 1, as editors count
        if item is not None and item.lines is not None:
            batch = batch.append_column(ROW_COLUMN, pa.array(item.lines, pa.int64()))
            batch = stamp_origin(batch, path, source, first)
            meta = {k: v for k, v in batch.schema.metadata.items() if k != FIRST_ROW_KEY}
            batch = batch.replace_schema_metadata(meta)
        else:
            batch = stamp_origin(batch, path, source, first)
        if dead:
            lines = "\n".join(record.to_json() for record in dead).encode()
            batch = batch.replace_schema_metadata({**batch.schema.metadata, BAD_LINES_KEY: lines})
        return batch

    def _bad_line(self, path: str, bad: BadLine):
        # Lines from 1 in messages, as editors count them (a dead letter's row is from 0).
        message = f"line {bad.line + 1} of {path}: {bad.message}"
        if bad.column is not None:
            fix = self._type_fix.get(bad.column) if self._type_fix is not None else _SCHEMA_FIX
            message += f", or {fix}" if fix else ""
        error = InputLineError(message + _or_dead_letter(self._handle_errors, "the line"))
        text = bad.text.decode("utf-8", errors="backslashreplace")
        return _unreadable(
            error, self._handle_errors, "lines_failed", path, text, row=bad.line, key=bad.key
        )


def _or_dead_letter(handle_errors: bool, what: str) -> str:
    """The advice a raised read error adds for a library caller: dead-letter it instead
    (a dead letter, already one, gets none)."""
    return (
        "" if handle_errors else f" (or read with .with_exception_handling() to dead-letter {what})"
    )


def _unreadable(
    error: Exception,
    handle_errors: bool,
    counter: str,
    path: str,
    element: Any,
    row: int | None = None,
    key: Any = None,
):
    """The failure path of every read step: raise, or count and dead-letter what failed
    (its ``source`` the file; its ``row`` the row group's first row or the line, when
    known)."""
    if not handle_errors:
        raise error
    Metrics.counter(METRICS_NAMESPACE, counter).inc()
    record = FailedElement.from_exception(
        error, stage=Stage.READ, element=element, key=key, source=path, row=row
    )
    return beam.pvalue.TaggedOutput(DEAD_LETTERS, record)


def _to_batches(table: pa.Table, max_rows: int | None) -> list[pa.RecordBatch]:
    return [b for b in table.to_batches(max_chunksize=max_rows) if b.num_rows]
