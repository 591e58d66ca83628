"""Reading Parquet and JSON lines as Arrow record batches in Beam, and the coder that
carries them."""

from __future__ import annotations

import contextlib
import functools
import glob
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_jax._src.arrow.ahead import WorkAhead
from beam_jax._src.arrow.json_lines import (
    BadLine,
    FileCut,
    LineBatch,
    infer_schema,
    is_json_lines,
    open_stream,
    read_json_lines,
)
from beam_jax._src.core.dead_letter import DEAD_LETTERS, METRICS_NAMESPACE, FailedElement, Stage
from beam_jax._src.errors import InputFileError, InputLineError, SpecError

# Record batches carry where they were read from in their schema metadata, so a row's
# dead letter can say: the file and row group (for the echo), the file, and the file row of
# the batch's first row.
SOURCE_KEY = b"beam_jax.source"
FILE_KEY = b"beam_jax.file"
FIRST_ROW_KEY = b"beam_jax.first_row"
BAD_LINES_KEY = b"beam_jax.bad_lines"  # ReadArrowBatches(bad_lines="in_batches")
ROW_COLUMN = "beam_jax.row"
"""The column of each row's file row in a batch whose rows are not consecutive rows of its
file (rows were dropped on the way, e.g. by the tokenize step); its metadata names the
file but no first row."""


class ArrowCoder(beam.coders.Coder):
    """Encodes ``pyarrow.Table`` and ``RecordBatch`` as Arrow IPC streams.

    Registered for both types when ``beam_jax`` is imported. Beam samples the encoded size
    of elements for its metrics; with the default pickle coder that re-serialises whole
    tables (hundreds of MB per run), while this coder reports ``nbytes`` without encoding.
    """

    _TABLE, _BATCH = b"T", b"B"

    def encode(self, value) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, value.schema) as writer:
            writer.write(value)
        kind = self._TABLE if isinstance(value, pa.Table) else self._BATCH
        return kind + sink.getvalue().to_pybytes()

    def decode(self, encoded: bytes):
        reader = pa.ipc.open_stream(pa.py_buffer(encoded)[1:])
        if encoded[:1] == self._TABLE:
            return reader.read_all()
        return reader.read_next_batch()

    def estimate_size(self, value) -> int:
        return int(value.nbytes)

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return pa.Table | pa.RecordBatch

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


beam.coders.registry.register_coder(pa.Table, ArrowCoder)
beam.coders.registry.register_coder(pa.RecordBatch, ArrowCoder)


class _ListRowGroups(beam.DoFn):
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
        for groups in _runs(counts, self._max_rows):
            rows = sum(counts[g] for g in groups)
            yield (path, groups[0] if len(groups) == 1 else tuple(groups), rows)


def _runs(counts: Sequence[int], max_rows: int | None) -> list[list[int]]:
    """Consecutive row groups (of ``counts`` rows each) with at most ``max_rows`` rows in
    all, in order; a row group of more rows is a run of its own.

    Example:
        >>> _runs([4, 4, 4, 9, 2, 2], 8)
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


class _ReadRowGroup(beam.DoFn):
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
            yield _with_origin(batch, path, f"{path} ({_groups_name(groups)})", first)
            first += batch.num_rows


def _groups_name(groups: Sequence[int]) -> str:
    if len(groups) == 1:
        return f"row group {groups[0]}"
    return f"row groups {groups[0]}-{groups[-1]}"


# What a bad line's message advises a library caller besides fixing the line, where a
# field does not fit its column's type.
_SCHEMA_FIX = "read the column with a type that holds it (the schema argument)"


class _ReadJsonLines(beam.DoFn):
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
            batch = _with_origin(batch, path, source, first)
            meta = {k: v for k, v in batch.schema.metadata.items() if k != FIRST_ROW_KEY}
            batch = batch.replace_schema_metadata(meta)
        else:
            batch = _with_origin(batch, path, source, first)
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


def _with_origin(batch: pa.RecordBatch, path: str, source: str, first: int) -> pa.RecordBatch:
    origin = {
        SOURCE_KEY: source.encode(),
        FILE_KEY: path.encode(),
        FIRST_ROW_KEY: str(first).encode(),
    }
    return batch.replace_schema_metadata({**(batch.schema.metadata or {}), **origin})


def with_origin(batch: pa.RecordBatch, path: str, first_row: int) -> pa.RecordBatch:
    """``batch`` saying it holds rows ``first_row, first_row + 1, ...`` of ``path``, as
    ``ReadArrowBatches``' batches do (:func:`origin_of` reads it back), for batches made
    another way whose rows' dead letters should name where they came from."""
    return _with_origin(batch, path, path, first_row)


def bad_lines_of(batch: pa.RecordBatch) -> list[FailedElement]:
    """The dead letters of the bad JSON lines read just before ``batch`` (its rows' file,
    after the batch before it), which ``ReadArrowBatches(bad_lines="in_batches")`` carries
    in the batch's metadata; ``[]`` for any other batch."""
    lines = (batch.schema.metadata or {}).get(BAD_LINES_KEY)
    if not lines:
        return []
    return [FailedElement.from_dict(json.loads(line)) for line in lines.decode().splitlines()]


def source_of(batch: pa.RecordBatch) -> str | None:
    """The file (and row group) ``ReadArrowBatches`` read ``batch`` from, if it did."""
    value = (batch.schema.metadata or {}).get(SOURCE_KEY)
    return None if value is None else value.decode()


def origin_of(batch: pa.RecordBatch) -> tuple[str | None, int | None]:
    """``(file, file row of the batch's first row)`` when ``ReadArrowBatches`` read
    ``batch``, else ``(None, None)``."""
    meta = batch.schema.metadata or {}
    path, first = meta.get(FILE_KEY), meta.get(FIRST_ROW_KEY)
    return (
        None if path is None else path.decode(),
        None if first is None else int(first.decode()),
    )


def row_origin(batch: pa.RecordBatch) -> tuple[str | None, int | np.ndarray | None]:
    """``(file, at)``: ``at`` is the file row of the batch's first row (an ``int``: its rows
    are consecutive), each row's file row (an ``int64`` array: the batch's ``ROW_COLUMN``),
    or ``None`` when not known; ``(None, None)`` for a batch that says no file.
    :func:`file_rows` reads a row's file row from ``at``."""
    path, first = origin_of(batch)
    if path is not None and first is None and ROW_COLUMN in batch.schema.names:
        column = batch.column(ROW_COLUMN)
        return path, column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return path, first


def file_rows(at: int | np.ndarray | None, rows: Any) -> Any:
    """The file rows of batch rows ``rows`` (an int or an int array), ``at`` being what
    :func:`row_origin` gave; ``None`` when ``at`` is."""
    if at is None:
        return None
    if isinstance(at, np.ndarray):
        found = at[rows]
        return int(found) if np.ndim(found) == 0 else found
    return at + rows


def carry_origin(
    out: pa.RecordBatch, batch: pa.RecordBatch, rows: np.ndarray | None = None
) -> pa.RecordBatch:
    """``out``, whose rows are rows ``rows`` of ``batch`` (all of them, in order, when
    ``None``), saying where they were read as ``batch`` says: a batch of consecutive rows by
    its metadata alone, any other by a ``ROW_COLUMN`` of its rows' file rows too (one int
    per row, no Python object per row). ``out`` as it is where ``batch`` says no file."""
    path, at = row_origin(batch)
    if path is None:
        return out
    meta = batch.schema.metadata or {}
    origin = {k: meta[k] for k in (SOURCE_KEY, FILE_KEY) if k in meta}
    if at is not None and (rows is not None or isinstance(at, np.ndarray)):
        picked = np.arange(batch.num_rows) if rows is None else np.asarray(rows, np.int64)
        if ROW_COLUMN in out.schema.names:  # ``out`` taken from ``batch``: its rows' anew
            out = out.drop_columns([ROW_COLUMN])
        out = out.append_column(ROW_COLUMN, pa.array(file_rows(at, picked), pa.int64()))
    elif at is not None:
        origin[FIRST_ROW_KEY] = str(at).encode()
    kept = {k: v for k, v in (out.schema.metadata or {}).items() if k != FIRST_ROW_KEY}
    return out.replace_schema_metadata({**kept, **origin})


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


class ReadArrowBatches(beam.PTransform):
    """Read Parquet or JSON-lines files as a PCollection of ``pyarrow.RecordBatch``.

    The pattern is matched when the pipeline is built (no match fails the launch, naming the
    pattern). Each batch has at most ``max_rows`` rows, and its schema metadata says where
    it was read from (``beam_jax.file``, ``beam_jax.first_row``: the file, and the file row
    or line of its first row), so dead letters downstream (``RunKernelOnArrow``) name the
    file and row of each failed row.

    **Parquet** (any file not named as JSON lines): each file's footer is read to list its
    row groups, which are then read in parallel. With ``max_rows``, consecutive row groups
    of at most ``max_rows`` rows in all are read together and batched as one (a file
    written in small row groups still gives batches of about ``max_rows`` rows, not one
    small batch per row group). Each worker reads one row group (or run of them) ahead of
    the steps fused after the read (decoding, padding, the kernel), so reading overlaps
    them; memory per worker is about two row groups or ``max_rows`` rows, whichever is
    larger, whatever the size of the dataset, so write files with row groups of a few MB.
    A local file is memory-mapped for each read (and its footer parsed once per worker),
    so do not rewrite a file while a job reads it. A file that cannot be read (truncated,
    not Parquet, lacking a column read) or a row group that cannot be decoded is an
    ``InputFileError`` naming the file.

    **JSON lines** (``.jsonl``, ``.json``, ``.ndjson``, also compressed: ``.gz``, ``.bz2``,
    ``.xz``, ``.lzma``, ``.zst``, ``.deflate``; or ``format="jsonl"``): one JSON object per
    line, each file read by one worker in blocks that pyarrow parses whole. The columns'
    types are ``schema``'s when given, else inferred at launch from the first 1,000 object
    lines of the files (pyarrow's inference: int64, double, bool, string, lists, structs; a
    column none of them holds is read as string). Other fields are ignored and a missing
    field is null. A row's ``first_row`` counts lines from 0 (messages name a line from 1,
    as editors count it); blank lines are skipped (not
    rows) and a leading byte order mark is dropped. A line that is not UTF-8, not JSON, not
    an object, or whose fields do not fit the columns' types is an ``InputFileError``
    naming the file and line; so is a file that cannot be opened, or that breaks off
    part-way (a truncated ``.gz``), after the lines before the break were read.

    Without ``.with_exception_handling()`` such a fault fails the job. With it, each
    becomes one ``FailedElement`` on the dead-letter output (stage ``"read"``, ``source``
    the file's path, ``row`` the row group's first row, the bad line, or the line a file
    broke off at; a bad line's text as its ``element`` and its ``key`` field as its
    ``key``), and everything else is still read: every line ends as one row or one dead
    letter.

    Examples:
        >>> read = ReadArrowBatches("data/*.parquet", columns=["id", "x"], max_rows=4096)
        >>> batches, unreadable = read.with_exception_handling()  # doctest: +SKIP
        >>> lines = ReadArrowBatches("in/*.jsonl.gz", schema=pa.schema([("text", pa.string())]))

    Args:
        file_pattern: the files to read (any Beam file system).
        columns: the columns to read; default all (for JSON lines: all of ``schema``, or
            all the sampled lines hold).
        max_rows: the most rows in one emitted record batch (Parquet: smaller
            consecutive row groups are read together up to it); default one batch per row
            group (Parquet) or per block of about 1 MB of lines (JSON lines).
        format: ``"parquet"``, ``"jsonl"``, or ``None`` to tell each file by its name.
        schema: JSON lines only: the columns' names and types (with ``columns``, those
            columns of it); default inferred.
        key: JSON lines only: a field whose value becomes a bad line's dead-letter ``key``
            when the line can be read that far (an id, so the dead letter names the row).
        type_fix: JSON lines only: what a bad line's message advises besides fixing the
            line, by column, where its field does not fit the column's type; default, for
            every column: read it with a type that holds it (``schema``). A job with flags
            names them (``{"id": "pass --id_type string if the ids are strings"}``); a
            column it leaves out gets "fix the line" alone.
        bad_lines: JSON lines with ``.with_exception_handling()``: where a bad line's dead
            letter goes: ``"dead_letters"`` (the default), the dead-letter output; or
            ``"in_batches"``, the metadata of the next batch read from its file
            (:func:`~beam_jax.internal.bad_lines_of` reads them; a batch of no rows carries
            those after a file's last row), whose rows then span bad and blank lines (a
            ``beam_jax.row`` column says each row's line), so that a job cutting its output
            by batches files each bad line with the rows around it, in the same part.
        spread: Spread the files, then each file's row groups, over the workers (a
            ``Reshuffle`` each; the default). ``False`` where one worker runs the whole
            pipeline (the in-process runners): reading then runs fused with the steps after
            it, with no shuffle and no stage of its own.

    Raises:
        SpecError: ``max_rows``, ``format``, ``schema`` or ``columns`` is not valid.
    """

    FORMATS = ("parquet", "jsonl")
    BAD_LINES = ("dead_letters", "in_batches")

    def __init__(
        self,
        file_pattern: str,
        *,
        columns: Sequence[str] | None = None,
        max_rows: int | None = None,
        format: str | None = None,  # noqa: A002 - the word users know from Beam's readers
        schema: pa.Schema | None = None,
        key: str | None = None,
        spread: bool = True,
        type_fix: Mapping[str, str] | None = None,
        bad_lines: str = "dead_letters",
    ):
        super().__init__()
        if bad_lines not in self.BAD_LINES:
            raise SpecError(f"bad_lines must be one of {self.BAD_LINES}, got {bad_lines!r}.")
        if max_rows is not None and max_rows < 1:
            raise SpecError(f"max_rows must be a positive int or None, got {max_rows!r}.")
        if format is not None and format not in self.FORMATS:
            raise SpecError(
                f"format must be one of {self.FORMATS} or None (by each file's name), got "
                f"{format!r}."
            )
        if schema is not None and not isinstance(schema, pa.Schema):
            raise SpecError(
                f"schema must be a pyarrow.Schema, got {type(schema).__name__}; e.g. "
                "pa.schema([('id', pa.int64()), ('text', pa.string())])."
            )
        if schema is not None and columns is not None:
            missing = [c for c in columns if schema.get_field_index(c) < 0]
            if missing:
                raise SpecError(
                    f"columns {missing} are not in schema (its fields are {schema.names}); "
                    "add them to the schema or drop them from columns."
                )
        self.file_pattern = file_pattern
        self.columns = None if columns is None else list(columns)
        self.max_rows = max_rows
        self.format = format
        self.schema = schema
        self.key = key
        self.spread = bool(spread)
        self.type_fix = None if type_fix is None else dict(type_fix)
        self.bad_lines = bad_lines
        self._handle_errors = False

    def with_exception_handling(self) -> ReadArrowBatches:
        """Dead-letter unreadable files and row groups instead of failing the job.

        The transform then returns ``(batches, dead_letters)``, a ``RunKernelResult``-like
        pair; dead letters are ``FailedElement`` records whose ``source`` is the file's
        path.
        """
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._handle_errors = True
        return clone

    def files(self) -> list[str]:
        """The files the pattern matches now, sorted.

        Raises:
            InputFileError: nothing matches.
        """
        try:
            matched = FileSystems.match([self.file_pattern])[0].metadata_list
        except Exception as e:  # noqa: BLE001 - Beam raises for a missing directory too
            matched, cause = [], e
        else:
            cause = None
        paths = {m.path for m in matched}
        if "://" not in self.file_pattern:
            # Beam's local match leaves out a link to nothing: the user named it, so its
            # reading fails and says so, as any other unreadable file's does.
            found = glob.glob(self.file_pattern, recursive=True)
            paths |= {p for p in found if os.path.islink(p) and not os.path.exists(p)}
        paths = sorted(paths)
        if not paths:
            raise InputFileError(
                f"no files match {self.file_pattern!r}"
                + (f" ({type(cause).__name__}: {cause})" if cause else "")
                + "; check the path and the glob."
            )
        return paths

    def json_schema(self, files: Sequence[str] | None = None) -> pa.Schema:
        """The columns and types JSON lines are read with: ``schema`` (its ``columns``), or
        inferred from the first lines of ``files`` (default: the JSON-lines files matched)."""
        if self.schema is not None:
            if self.columns is None:
                return self.schema
            return pa.schema([self.schema.field(c) for c in self.columns])
        if files is None:
            files = [f for f in self.files() if self._is_json(f)]
        return infer_schema(files, self.columns)

    def _is_json(self, path: str) -> bool:
        return self.format == "jsonl" or (self.format is None and is_json_lines(path))

    def expand(self, pbegin):
        handle = self._handle_errors
        files = self.files()
        json_files = [f for f in files if self._is_json(f)]
        parquet_files = [f for f in files if not self._is_json(f)]
        batches, dead = [], []
        if parquet_files:
            rows = (
                pbegin
                | "Files" >> _Paths(parquet_files, self.spread)
                | "RowGroups"
                >> beam.ParDo(_ListRowGroups(self.columns, handle, self.max_rows)).with_outputs(
                    DEAD_LETTERS, main="groups"
                )
            )
            groups = rows.groups
            if self.spread:
                groups = groups | "Spread" >> beam.Reshuffle()
            read = groups | "ReadRowGroups" >> beam.ParDo(
                _ReadRowGroup(self.columns, self.max_rows, handle)
            ).with_output_types(pa.RecordBatch).with_outputs(DEAD_LETTERS, main="batches")
            batches.append(read.batches)
            dead += [rows[DEAD_LETTERS], read[DEAD_LETTERS]]
        if json_files:
            schema = self.json_schema(json_files)
            # A file is read whole: spreading the paths (``_Paths``) spreads the reading.
            json_paths = pbegin | "JsonFiles" >> _Paths(json_files, self.spread)
            lines = json_paths | "ReadJsonLines" >> beam.ParDo(
                _ReadJsonLines(
                    schema,
                    self.max_rows,
                    self.key,
                    handle,
                    self.type_fix,
                    in_batches=self.bad_lines == "in_batches",
                )
            ).with_output_types(pa.RecordBatch).with_outputs(DEAD_LETTERS, main="batches")
            batches.append(lines.batches)
            dead.append(lines[DEAD_LETTERS])
        out = batches[0] if len(batches) == 1 else tuple(batches) | "Batches" >> beam.Flatten()
        if not handle:
            return out
        return ReadResult(out, tuple(dead) | "DeadLetters" >> beam.Flatten())


class _Paths(beam.PTransform):
    """The file paths as a PCollection: spread over the workers (``beam.Create``'s
    reshuffle, where there is more than one path), or, where one worker reads every file
    (no spread), one step after an impulse (``beam.Create`` adds a step that decodes
    each value, and each step costs every launch a few milliseconds)."""

    def __init__(self, paths: Sequence[str], spread: bool):
        super().__init__()
        self._paths, self._spread = tuple(paths), spread

    def expand(self, pbegin):
        if self._spread:
            return pbegin | beam.Create(self._paths, reshuffle=True)
        return pbegin | beam.Impulse() | beam.FlatMap(_constant, self._paths)


def _constant(_, values):
    return values


class ReadResult(NamedTuple):
    """The outputs of ``ReadArrowBatches(...).with_exception_handling()``."""

    batches: beam.PCollection
    dead_letters: beam.PCollection


def _to_batches(table: pa.Table, max_rows: int | None) -> list[pa.RecordBatch]:
    return [b for b in table.to_batches(max_chunksize=max_rows) if b.num_rows]
