"""ReadRowsWithOrigin: Parquet or JSON-lines files as schema'd rows that say where each was read.

Beam YAML passes rows between transforms, and Beam's readers (``ReadFromParquet``,
``ReadFromJson``) give rows without their file, so a dead letter downstream can name only
its key. ``ReadRowsWithOrigin`` reads with ``ReadArrowBatches`` (which knows each batch's
file and first row) and adds two fields to every row: its file and its row in that file, so
beam_jax's YAML transforms file their dead letters under that origin (``source``, ``row``).
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints import arrow_type_compatibility, schemas
from apache_beam.typehints.row_type import RowTypeConstraint

from beam_jax._src.arrow.io import ReadArrowBatches
from beam_jax._src.arrow.origin import origin_of
from beam_jax._src.errors import SpecError


@dataclasses.dataclass(frozen=True)
class OriginFields:
    """The names of the two fields that say where a row was read: its file and its row.

    ``ReadRowsWithOrigin`` adds them to every row; the YAML ``EmbedText`` reads them into
    each dead letter's ``source`` and ``row``.

    Example:
        >>> OriginFields().names
        ('source', 'row')

    Raises:
        SpecError: a name is empty or not a string, or both are the same.
    """

    source: str = "source"
    row: str = "row"

    def __post_init__(self):
        if not all(isinstance(n, str) and n for n in self.names) or self.source == self.row:
            raise SpecError(
                f"the origin fields must be two different non-empty names, got source "
                f"{self.source!r} and row {self.row!r}; e.g. source_field: source, "
                "row_field: row."
            )

    @property
    def names(self) -> tuple[str, str]:
        """``(source, row)``."""
        return (self.source, self.row)

    def of(self, row: Any) -> tuple[str | None, int | None]:
        """``(file, row)`` of a row that has both fields set, else ``(None, None)``."""
        source, at = getattr(row, self.source, None), getattr(row, self.row, None)
        return (None, None) if source is None or at is None else (str(source), int(at))

    def carried_by(self, element_type: Any) -> bool:
        """Whether rows of ``element_type`` (a PCollection's) carry these fields, as
        ``ReadRowsWithOrigin``'s rows do; ``False`` for rows without a schema.

        Raises:
            SpecError: one of the two names is a field of another type (a column of the
                data's own), so the rows' origin cannot be read from it.
        """
        fields = _field_types(element_type)
        expected = {self.source: (str,), self.row: (int, np.int64, np.int32)}
        present = [n for n in self.names if n in fields]
        wrong = {n: fields[n] for n in present if _plain(fields[n]) not in expected[n]}
        if wrong:
            raise SpecError(
                f"the origin fields must be {self.source!r}: str and {self.row!r}: int (as "
                f"ReadRowsWithOrigin adds them), got {wrong}; name the reader's fields "
                "otherwise (source_field, row_field) and give the same names here."
            )
        return len(present) == 2


def _field_types(element_type: Any) -> dict[str, Any]:
    row_type = element_type
    if not isinstance(row_type, RowTypeConstraint):
        try:
            row_type = RowTypeConstraint.from_user_type(element_type)
        except Exception:  # noqa: BLE001 - any type Beam cannot read as a schema
            row_type = None
    return {} if row_type is None else dict(row_type._fields)


def _plain(field_type: Any) -> Any:
    """``T`` of ``Optional[T]``, else the type itself."""
    if typing.get_origin(field_type) is not typing.Union:
        return field_type
    args = [a for a in typing.get_args(field_type) if a is not type(None)]
    return args[0] if len(args) == 1 else field_type


def _beam_type(schema: pa.Schema) -> type:
    beam_schema = arrow_type_compatibility.beam_schema_from_arrow_schema(schema)
    return schemas.named_tuple_from_schema(beam_schema)


class _AddOrigin(beam.DoFn):
    """A record batch as rows (one Arrow table, converted by Beam's batch converter) with
    the file and the row in it of each."""

    def __init__(self, schema: pa.Schema, row_type: type):
        self._schema, self._row_type = schema, row_type

    @beam.DoFn.yields_batches
    def process(self, batch: pa.RecordBatch):
        path, first = origin_of(batch)
        n = batch.num_rows
        rows = np.arange(first, first + n, dtype=np.int64)
        columns = [*batch.columns, pa.array([path] * n, pa.string()), pa.array(rows)]
        yield pa.Table.from_arrays(columns, schema=self._schema)

    def infer_output_type(self, input_type):
        return self._row_type

    def get_output_batch_type(self, input_element_type):
        return pa.Table  # Beam turns each table into rows of ``row_type``


class ReadRowsWithOrigin(beam.PTransform):
    """Read Parquet or JSON-lines files as rows, each with its file and row in that file.

    For Beam YAML, where ``ReadFromParquet`` or ``ReadFromJson`` would be: the rows hold the
    files' columns plus ``source`` (the file's path) and ``row`` (its index in the file, from
    0; for JSON lines, the line), which dead letters downstream carry. Reading is
    ``ReadArrowBatches``'; the schema is the first file's or the sampled lines'.

    Example (YAML)::

        - type: ReadRowsWithOrigin
          config:
            path: "data/*.parquet"
            columns: [id, text]

    Args:
        path: the files to read (any Beam file system); no match fails at launch.
        columns: the columns to read; default all.
        format: ``"parquet"``, ``"jsonl"``, or ``None`` to tell each file by its name.
        source_field: the name of the field holding the file's path.
        row_field: the name of the field holding the row's index in its file.

    Raises:
        SpecError: an origin field is also a column of the files, or the other arguments
            are not valid for ``ReadArrowBatches``.
    """

    def __init__(
        self,
        path: str,
        columns: Sequence[str] | None = None,
        format: str | None = None,  # noqa: A002 - the word users know from Beam's readers
        source_field: str = "source",
        row_field: str = "row",
    ):
        super().__init__()
        self._fields = OriginFields(source_field, row_field)
        self._read = ReadArrowBatches(path, columns=columns, format=format)

    def with_exception_handling(self) -> ReadRowsWithOrigin:
        """Dead-letter unreadable files and row groups instead of failing the job (as
        ``ReadArrowBatches.with_exception_handling`` does): the transform then returns
        ``(rows, dead_letters)``."""
        clone = copy.copy(self)
        clone._read = self._read.with_exception_handling()
        return clone

    def _file_schema(self, files: Sequence[str]) -> pa.Schema:
        read = self._read
        if read._is_json(files[0]):
            return read.json_schema([f for f in files if read._is_json(f)])
        with FileSystems.open(files[0]) as f:
            schema = pq.read_schema(f)
        if read.columns is not None:
            schema = pa.schema([schema.field(c) for c in read.columns])
        return schema

    def expand(self, pbegin):
        schema = self._file_schema(self._read.files()).remove_metadata()
        clash = [n for n in self._fields.names if n in schema.names]
        if clash:
            raise SpecError(
                f"the files already have columns {clash}, which ReadRowsWithOrigin would add "
                f"as the rows' origin (their columns: {schema.names}); name the origin "
                "fields otherwise with source_field and row_field."
            )
        schema = schema.append(pa.field(self._fields.source, pa.string(), nullable=False))
        schema = schema.append(pa.field(self._fields.row, pa.int64(), nullable=False))
        row_type = _beam_type(schema)
        add = beam.ParDo(_AddOrigin(schema, row_type))
        read = pbegin | "Read" >> self._read
        if isinstance(read, beam.PCollection):
            return read | "Rows" >> add
        return read.batches | "Rows" >> add, read.dead_letters
