"""Where a record batch's rows were read from: the file, the row group and the file row of
each row, carried in the batch's schema metadata (or a column of file rows) so that a row's
dead letter can name them."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from beam_jax._src.core.dead_letter import FailedElement

SOURCE_KEY = b"beam_jax.source"
FILE_KEY = b"beam_jax.file"
FIRST_ROW_KEY = b"beam_jax.first_row"
BAD_LINES_KEY = b"beam_jax.bad_lines"  # ReadArrowBatches(bad_lines="in_batches")
ROW_COLUMN = "beam_jax.row"
"""The column of each row's file row in a batch whose rows are not consecutive rows of its
file (rows were dropped on the way, e.g. by the tokenize step); its metadata names the
file but no first row."""


def stamp_origin(batch: pa.RecordBatch, path: str, source: str, first: int) -> pa.RecordBatch:
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
    return stamp_origin(batch, path, path, first_row)


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
