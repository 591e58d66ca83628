"""Reading Parquet as Arrow record batches in Beam, and the coder that carries them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_jax._src.core.dead_letter import DEAD_LETTERS, METRICS_NAMESPACE, FailedElement, Stage
from beam_jax._src.errors import InputFileError, SpecError

# Record batches carry where they were read from in their schema metadata, so a row's
# dead letter can say: the file and row group (for the echo), the file, and the file row of
# the batch's first row.
SOURCE_KEY = b"beam_jax.source"
FILE_KEY = b"beam_jax.file"
FIRST_ROW_KEY = b"beam_jax.first_row"


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
    """A file path -> ``(path, row group)`` for each of its row groups (reads the footer)."""

    def __init__(self, columns: list[str] | None, handle_errors: bool):
        self._columns = columns
        self._handle_errors = handle_errors

    def process(self, path: str):
        error = None
        try:
            with FileSystems.open(path) as f:
                parquet = pq.ParquetFile(f)
                meta, names = parquet.metadata, parquet.schema_arrow.names
        except Exception as e:  # noqa: BLE001 - a file that cannot be opened is reported
            error = InputFileError(
                f"cannot read Parquet file {path}: {type(e).__name__}: {e}. Fix or remove the "
                "file (or read with .with_exception_handling() to dead-letter it)."
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
        for group in range(meta.num_row_groups):
            yield (path, group, meta.row_group(group).num_rows)


class _ReadRowGroup(beam.DoFn):
    """``(path, row group, rows)`` -> record batches of at most ``max_rows`` rows."""

    def __init__(self, columns: list[str] | None, max_rows: int | None, handle_errors: bool):
        self._columns = columns
        self._max_rows = max_rows
        self._handle_errors = handle_errors

    def process(self, item):
        path, group, rows = item
        error, first = None, None
        try:
            with FileSystems.open(path) as f:
                parquet = pq.ParquetFile(f)
                if group < parquet.metadata.num_row_groups:
                    first = sum(parquet.metadata.row_group(g).num_rows for g in range(group))
                table = parquet.read_row_group(group, columns=self._columns)
        except Exception as e:  # noqa: BLE001 - a corrupt row group is reported, not fatal
            error = InputFileError(
                f"cannot read row group {group} ({rows} rows) of Parquet file {path}: "
                f"{type(e).__name__}: {e}. Fix or remove the file (or read with "
                ".with_exception_handling() to dead-letter its unreadable row groups)."
            )
        if error is not None:
            where = {"file": path, "row_group": group, "rows": rows}
            yield _unreadable(
                error, self._handle_errors, "row_groups_failed", path, where, row=first
            )
            return
        for batch in _to_batches(table, self._max_rows):
            source = {
                SOURCE_KEY: f"{path} (row group {group})".encode(),
                FILE_KEY: path.encode(),
                FIRST_ROW_KEY: str(first).encode(),
            }
            first += batch.num_rows
            yield batch.replace_schema_metadata({**(batch.schema.metadata or {}), **source})


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


def _unreadable(
    error: Exception,
    handle_errors: bool,
    counter: str,
    path: str,
    element: dict,
    row: int | None = None,
):
    """The failure path of both read steps: raise, or count and dead-letter what failed
    (its ``source`` the file; its ``row`` the row group's first row, when known)."""
    if not handle_errors:
        raise error
    Metrics.counter(METRICS_NAMESPACE, counter).inc()
    record = FailedElement.from_exception(
        error, stage=Stage.READ, element=element, source=path, row=row
    )
    return beam.pvalue.TaggedOutput(DEAD_LETTERS, record)


class ReadArrowBatches(beam.PTransform):
    """Read Parquet files as a PCollection of ``pyarrow.RecordBatch``, file by file.

    The pattern is matched when the pipeline is built (no match fails the launch, naming the
    pattern). Each file's footer is read to list its row groups, which are then read in
    parallel and split into record batches of at most ``max_rows`` rows; memory per worker is
    about one row group, whatever the size of the dataset, so write files with row groups of
    a few MB.

    A file that cannot be read (truncated, not Parquet, lacking a column read) or a row
    group that cannot be decoded fails the job with an ``InputFileError`` naming the file;
    with ``.with_exception_handling()`` it becomes one ``FailedElement`` (stage ``"read"``,
    ``source`` the file's path, ``row`` the row group's first row) and every other file
    and row group is still read.

    Examples:
        >>> read = ReadArrowBatches("data/*.parquet", columns=["id", "x"], max_rows=4096)
        >>> batches, unreadable = read.with_exception_handling()  # doctest: +SKIP

    Args:
        file_pattern: the files to read (any Beam file system).
        columns: the columns to read; default all.
        max_rows: the most rows in one emitted record batch; default one per row group.
    """

    def __init__(
        self,
        file_pattern: str,
        *,
        columns: Sequence[str] | None = None,
        max_rows: int | None = None,
    ):
        super().__init__()
        if max_rows is not None and max_rows < 1:
            raise SpecError(f"max_rows must be a positive int or None, got {max_rows!r}.")
        self.file_pattern = file_pattern
        self.columns = None if columns is None else list(columns)
        self.max_rows = max_rows
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
        paths = sorted(m.path for m in matched)
        if not paths:
            raise InputFileError(
                f"no files match {self.file_pattern!r}"
                + (f" ({type(cause).__name__}: {cause})" if cause else "")
                + "; check the path and the glob."
            )
        return paths

    def expand(self, pbegin):
        handle = self._handle_errors
        rows = (
            pbegin
            | "Files" >> beam.Create(self.files())
            | "RowGroups"
            >> beam.ParDo(_ListRowGroups(self.columns, handle)).with_outputs(
                DEAD_LETTERS, main="groups"
            )
        )
        read = (
            rows.groups
            | "Spread" >> beam.Reshuffle()
            | "ReadRowGroups"
            >> beam.ParDo(_ReadRowGroup(self.columns, self.max_rows, handle))
            .with_output_types(pa.RecordBatch)
            .with_outputs(DEAD_LETTERS, main="batches")
        )
        if not handle:
            return read.batches
        dead = (rows[DEAD_LETTERS], read[DEAD_LETTERS]) | "DeadLetters" >> beam.Flatten()
        return ReadResult(read.batches, dead)


class ReadResult(NamedTuple):
    """The outputs of ``ReadArrowBatches(...).with_exception_handling()``."""

    batches: beam.PCollection
    dead_letters: beam.PCollection


def _to_batches(table: pa.Table, max_rows: int | None) -> list[pa.RecordBatch]:
    return [b for b in table.to_batches(max_chunksize=max_rows) if b.num_rows]
