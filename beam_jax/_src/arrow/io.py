"""Reading Parquet and JSON lines as Arrow record batches in Beam (``ReadArrowBatches``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import apache_beam as beam
import pyarrow as pa

from beam_jax._src.arrow import coder  # noqa: F401 - registers ArrowCoder for record batches
from beam_jax._src.arrow.json_lines import infer_schema, is_json_lines
from beam_jax._src.arrow.read_files import ListRowGroups, ReadJsonLines, ReadRowGroup
from beam_jax._src.core.dead_letter import DEAD_LETTERS
from beam_jax._src.errors import InputFileError, SpecError
from beam_jax._src.files import dangling_links, match_files
from beam_jax._src.runners.dask_refusals import refuse_beams_dask_runner


class ReadArrowBatches(beam.PTransform):
    """Read Parquet or JSON-lines files as a PCollection of ``pyarrow.RecordBatch``.

    The pattern is matched when the pipeline is built (no match fails the launch). Each
    batch's schema metadata says where it was read from (``beam_jax.file``,
    ``beam_jax.first_row``), so dead letters downstream name the file and row.

    **Parquet** (any file not named as JSON lines): each file's row groups are listed from
    its footer and read in parallel; with ``max_rows``, consecutive small row groups are read
    together up to it. Each worker reads one row group ahead of the steps fused after it;
    memory per worker is about two row groups or ``max_rows`` rows, whatever the dataset's
    size. A local file is memory-mapped, so do not rewrite a file while a job reads it.

    **JSON lines** (``.jsonl``, ``.json``, ``.ndjson``, also compressed; or
    ``format="jsonl"``): one JSON object per line, each file read by one worker in blocks
    that pyarrow parses whole. The columns' types are ``schema``'s, else inferred at launch
    from the first 1,000 object lines (a column none holds is read as string); other fields
    are ignored and a missing one is null. ``first_row`` counts lines from 0 (messages count
    from 1); blank lines are skipped and a leading byte order mark is dropped.

    A file that cannot be read, a row group that cannot be decoded, a line that is not a
    JSON object fitting the columns' types, or a file that breaks off part-way is an
    ``InputFileError`` naming the file (and line). Without ``.with_exception_handling()`` it
    fails the job; with it, each is one ``FailedElement`` (stage ``"read"``, ``source`` the
    file, ``row`` the row group's first row or the line; a bad line's text as ``element``
    and its ``key`` field as ``key``) and everything else is still read.

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
        type_fix: JSON lines only: by column, what a bad line's message advises where its
            field does not fit the column's type (e.g. ``{"id": "pass --id_type string"}``);
            default: read it with a type that holds it (``schema``).
        bad_lines: JSON lines with ``.with_exception_handling()``: where a bad line's dead
            letter goes: ``"dead_letters"`` (the default) or ``"in_batches"``, the metadata
            of the next batch read from its file (:func:`~beam_jax.internal.bad_lines_of`;
            a ``beam_jax.row`` column then says each row's line), so a job cutting its output
            by batches files each bad line with the rows around it.
        spread: Spread the files, then each file's row groups, over the workers (the
            default). ``False`` where one worker runs the whole pipeline: reading then runs
            fused with the steps after it, with no shuffle.

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
        """Dead-letter unreadable files and row groups instead of failing the job: the
        transform then returns ``ReadResult(batches, dead_letters)``.
        """
        clone = copy.copy(self)
        clone._handle_errors = True
        return clone

    def files(self) -> list[str]:
        """The files the pattern matches now, sorted.

        Raises:
            InputFileError: nothing matches.
        """
        try:
            matched = match_files(self.file_pattern)
        except Exception as e:  # noqa: BLE001 - Beam raises for a missing directory too
            matched, cause = [], e
        else:
            cause = None
        paths = sorted({m.path for m in matched} | set(dangling_links(self.file_pattern)))
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
        refuse_beams_dask_runner(pbegin.pipeline, "ReadArrowBatches")
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
                >> beam.ParDo(ListRowGroups(self.columns, handle, self.max_rows)).with_outputs(
                    DEAD_LETTERS, main="groups"
                )
            )
            groups = rows.groups
            if self.spread:
                groups = groups | "Spread" >> beam.Reshuffle()
            read = groups | "ReadRowGroups" >> beam.ParDo(
                ReadRowGroup(self.columns, self.max_rows, handle)
            ).with_output_types(pa.RecordBatch).with_outputs(DEAD_LETTERS, main="batches")
            batches.append(read.batches)
            dead += [rows[DEAD_LETTERS], read[DEAD_LETTERS]]
        if json_files:
            schema = self.json_schema(json_files)
            # A file is read whole: spreading the paths (``_Paths``) spreads the reading.
            json_paths = pbegin | "JsonFiles" >> _Paths(json_files, self.spread)
            lines = json_paths | "ReadJsonLines" >> beam.ParDo(
                ReadJsonLines(
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
    reshuffle), or, unspread, one step after an impulse (``beam.Create`` adds a step)."""

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
