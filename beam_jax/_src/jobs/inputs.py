"""A job's input files at launch: their format, what a rerun must find unchanged, the id
type, a sample of their texts.

:func:`match_inputs` lists the files with their sizes and modification times (a resumable
job records them, so a rerun resumes only over the same files). A file that cannot be read
is skipped here: reading it (``ReadArrowBatches``) dead-letters it.

Example:
    >>> input_format("gs://bucket/in/part-*.jsonl.gz"), input_format("in/*.parquet")
    ('jsonl', 'parquet')
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jax._src.arrow.json_lines import (
    BOM,
    JSON_LINES_SUFFIXES,
    SAMPLE_LINES,
    infer_schema,
    open_stream,
    uncompressed_name,
)
from beam_jax._src.arrow.texts import is_text_type, utf8_texts
from beam_jax._src.core.wording import counted
from beam_jax._src.files import dangling_links, match_files

__all__ = [
    "InputFile",
    "RowCount",
    "column_types",
    "id_type_of",
    "input_format",
    "match_inputs",
    "sample_texts",
    "text_sample",
    "values_type",
]

PARQUET_SUFFIXES = (".parquet", ".pq")
# Files whose Parquet footers are read to count a job's rows; beyond this the count is
# extrapolated from their mean (each footer is one read, which on gs:// is ~50 ms).
MAX_FOOTERS = 64


def input_format(pattern: str) -> str:
    """``"parquet"`` or ``"jsonl"``, from the extension of ``pattern`` (compressed or not).

    Raises:
        ValueError: If the extension is neither.
    """
    name = uncompressed_name(pattern)
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSON_LINES_SUFFIXES):
        return "jsonl"
    if pattern.endswith("/") or os.path.isdir(pattern):
        folder = pattern.rstrip("/")
        raise ValueError(
            f"--input {pattern!r} is a directory; give its files as a glob, e.g. "
            f"'{folder}/*.parquet' or '{folder}/*.jsonl'"
        )
    raise ValueError(
        f"cannot tell the format of --input {pattern!r} from its extension; expected "
        "*.parquet (or .pq) for Parquet, *.jsonl (or .json, .ndjson, optionally compressed) "
        "for JSON lines"
    )


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One input file as matched at launch; ``size`` and ``mtime`` are None for a link to
    nothing (listed so that its reading fails and names it)."""

    path: str
    size: int | None
    mtime: float | None


def match_inputs(pattern: str) -> tuple[InputFile, ...]:
    """The files ``pattern`` matches (any Beam file system), sorted by path.

    Raises:
        FileNotFoundError: If nothing matches.
    """
    found = {
        m.path: InputFile(m.path, m.size_in_bytes, m.last_updated_in_seconds)
        for m in match_files(pattern)
    }
    for path in dangling_links(pattern):
        found.setdefault(path, InputFile(path, None, None))
    if not found:
        raise FileNotFoundError(
            f"--input {pattern!r} matches no file; check the path and the glob (quote it so "
            "the shell does not expand it)"
        )
    return tuple(found[p] for p in sorted(found))


@dataclasses.dataclass(frozen=True)
class RowCount:
    """How many rows an input holds, as far as a launch knows.

    Attributes:
        rows: Counted (Parquet footers), estimated (a JSON-lines file's size over its first
            lines', or footers extrapolated), or ``None`` when not known (compressed JSON
            lines).
        exact: Whether ``rows`` is counted rather than estimated.

    Example:
        >>> str(RowCount(71, exact=True)), str(RowCount(1200)), str(RowCount())
        ('71 rows', '~1,200 rows', 'an unknown number of rows')
    """

    rows: int | None = None
    exact: bool = False

    def __post_init__(self):
        if self.rows is not None and self.rows < 0:
            raise ValueError(f"rows must be an int >= 0 or None, got {self.rows}")

    def less(self, rows: int) -> RowCount:
        """The count without ``rows`` of them (e.g. those an earlier run did)."""
        return self if self.rows is None else RowCount(max(self.rows - rows, 0), self.exact)

    def __str__(self) -> str:
        if self.rows is None:
            return "an unknown number of rows"
        return f"{'' if self.exact else '~'}{counted(self.rows, 'row')}"


def values_type(t: pa.DataType) -> pa.DataType:
    """The type of a column's values: a dictionary-encoded column's (a pandas categorical
    written to Parquet) is its dictionary's; any other column's is its own."""
    return t.value_type if pa.types.is_dictionary(t) else t


def _usable(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def _kind(t: pa.DataType) -> str:
    return "integers" if pa.types.is_integer(t) else "strings"


def _flag(t: pa.DataType) -> str:
    """The ``--id_type`` of ``t``."""
    return "int" if pa.types.is_integer(t) else "string"


def id_type_of(
    paths: Sequence[str], id_column: str, text_column: str, *, given: pa.DataType | None = None
) -> pa.DataType:
    """The type of the id column: integers or strings, as the first usable file says.

    Parquet: the first file with both columns and an integer or string id says. JSON lines:
    the first integer or string id in the first 1,000 lines (int64 if none).

    With ``given`` (a job's ``--id_type``), the input is checked against it instead, and
    ``given`` is returned: a Parquet file's ids keep their column's type, so that column
    must hold the same kind (integers or strings); JSON lines are read with ``given``, so
    at least one of the sampled ids must be of that kind (a line whose id is not is then
    that line's dead letter).

    Example:
        >>> id_type_of(["in/a.parquet", "in/b.parquet"], "id", "text")  # doctest: +SKIP
        DataType(int64)

    Raises:
        ValueError: If no Parquet file has both columns with an integer or string id (each
            file's problem is named), or the input's ids are not of ``given``'s kind (every
            row would be a dead letter).
    """
    if paths and all(input_format(p) == "jsonl" for p in paths):
        return _json_lines_id_type(paths, id_column, given)
    problems = []
    for path in paths:
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                schema = pq.read_schema(f)
        except Exception as e:  # noqa: BLE001 - its reading will dead-letter it; try the next
            problems.append(f"{path} cannot be read ({type(e).__name__}: {e})")
            continue
        missing = [c for c in (id_column, text_column) if c not in schema.names]
        if missing:
            problems.append(f"{path} has no column {missing}; it has {schema.names}")
        elif not _usable(values_type(schema.field(id_column).type)):
            problems.append(f"{path}: its {id_column!r} is {schema.field(id_column).type}")
        else:
            found = values_type(schema.field(id_column).type)
            if given is not None and _kind(given) != _kind(found):
                raise ValueError(
                    f"the ids were given as {_kind(given)} (--id_type {_flag(given)}), but "
                    f"{path}'s id column {id_column!r} is {found}: a Parquet input's ids keep "
                    f"their column's type, so every row would be a dead letter. Pass "
                    f"--id_type {_flag(found)} or leave --id_type out (the column's type)"
                )
            return found if given is None else given
    shown = "; ".join(problems[:5]) + (f"; {len(problems) - 5} more" if problems[5:] else "")
    raise ValueError(
        f"no input file has both columns {id_column!r} and {text_column!r} with a usable id "
        f"type: {shown}. The input needs a string column {text_column!r} and an integer or "
        f"string column {id_column!r}; name the input's own columns with --text_column and "
        "--id_column"
    )


def column_types(paths: Sequence[str], columns: Sequence[str]) -> pa.Schema:
    """The types of ``columns`` in the input files, for columns a job carries through as
    they are: a Parquet file's (the first that can be read), or for JSON lines those the
    first 1,000 lines give (a column none of them holds: string).

    Raises:
        ValueError: The first readable Parquet file lacks a column (it lists those it has).
        SpecError: The sampled JSON lines give a column two types.
    """
    if paths and all(input_format(p) == "jsonl" for p in paths):
        return infer_schema(paths, list(columns))
    for path in paths:
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                schema = pq.read_schema(f)
        except Exception:  # noqa: BLE001, S112 - its reading will dead-letter it; try the next
            continue
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise ValueError(f"{path} has no column {missing}; it has {schema.names}")
        return pa.schema([schema.field(c) for c in columns])
    return pa.schema([(c, pa.string()) for c in columns])


def _json_lines_id_type(
    paths: Sequence[str], id_column: str, given: pa.DataType | None
) -> pa.DataType:
    wanted = None if given is None else pa.int64() if pa.types.is_integer(given) else pa.string()
    first, lines = _first_json_ids(paths, id_column, wanted)
    if given is None:
        return next(iter(first), pa.int64())
    if first and wanted not in first:
        [(found, (path, line, value))] = first.items()
        raise ValueError(
            f"the ids were given as {_kind(given)} (--id_type {_flag(given)}), but the ids "
            f"in the input's first {counted(lines, 'line')} are all {_kind(found)} (the "
            f"first: {value!r} on line {line} of {path}): JSON lines are read with the ids' "
            f"type, so every line would be a dead letter. Pass --id_type {_flag(found)} or "
            f"leave --id_type out (the first id's type), or write the ids as JSON {_kind(given)}"
        )
    return given


def _first_json_ids(
    paths: Sequence[str], id_column: str, wanted: pa.DataType | None
) -> tuple[dict[pa.DataType, tuple], int]:
    """The first integer and string ids (by type, int64 or string, in the order found: each
    one's file, line from 1 and value) in the first 1,000 lines, and the lines read; up to
    the first id of type ``wanted`` (``None``: the first id)."""
    first: dict[pa.DataType, tuple] = {}
    lines = 0
    for path in paths:
        try:
            with contextlib.ExitStack() as stack:
                stream = open_stream(path, stack)
                for line, raw in enumerate(iter(stream.readline, b""), start=1):
                    if lines == SAMPLE_LINES:
                        return first, lines
                    lines += 1
                    try:
                        value = json.loads(raw.removeprefix(BOM)).get(id_column)
                    except (ValueError, AttributeError):
                        continue
                    if isinstance(value, str):
                        first.setdefault(pa.string(), (path, line, value))
                    elif isinstance(value, int) and not isinstance(value, bool):
                        first.setdefault(pa.int64(), (path, line, value))
                    if wanted in first or (wanted is None and first):
                        return first, lines
        except Exception:  # noqa: BLE001, S112 - its reading will dead-letter it
            continue
    return first, lines


def text_sample(
    file: InputFile, column: str, n: int, format: str | None = None
) -> tuple[pa.Array, int | None]:
    """The first texts of an input file, ``n`` at most, and its row count where that costs
    no more reading: a Parquet file's from its footer, an uncompressed JSON-lines file's
    estimated from its size and the sampled lines' (None otherwise).

    The texts are ``column``'s strings as a ``large_string`` array: a Parquet file's first
    ``n``, read a few row groups at a time; a JSON-lines file's among its first ``n`` lines.
    A text that is null, not a string or not valid UTF-8 is left out (the job dead-letters it).

    Example:
        >>> [file] = match_inputs("in/part-0.parquet")  # doctest: +SKIP
        >>> texts, rows = text_sample(file, "text", 1000)  # doctest: +SKIP

    Args:
        file: The file, as :func:`match_inputs` gives it.
        column: The text column (a JSON line's field).
        n: The most texts to read.
        format: ``"parquet"`` or ``"jsonl"``; default: from the file's extension.

    Raises:
        Exception: Whatever reading the file raises (e.g. ``OSError``, ``pyarrow.ArrowInvalid``).
    """
    if (format or input_format(file.path)) == "parquet":
        return _parquet_texts(file.path, column, n)
    return _json_lines_texts(file, column, n)


def sample_texts(
    files: Sequence[InputFile], column: str, n: int, format: str | None = None
) -> tuple[pa.Array, RowCount]:
    """Up to ``n`` texts of ``files`` (a ``large_string`` array), and how many rows the
    files hold: a sample for a plan made at launch, and the total its progress counts to.

    Every file gives a share of the sample (its first rows); ``n=0`` counts the rows alone.
    The count is exact when every file is Parquet and at most :data:`MAX_FOOTERS`; else an
    estimate, or unknown (compressed JSON lines). A file that breaks off gives the texts
    before its break.

    Example:
        >>> texts, rows = sample_texts(match_inputs("in/*.parquet"), "text", 1000)  # doctest: +SKIP

    Args:
        files: The input files (:func:`match_inputs`).
        column: The text column.
        n: The most texts.
        format: ``"parquet"`` or ``"jsonl"``; default: from each file's extension.
    """
    files = [f for f in files if f.size]
    per_file = max(1, math.ceil(n / len(files))) if files else 0
    texts: list[pa.Array] = []
    got = rows = counted_files = 0
    exact = True
    for i, file in enumerate(files):
        want = min(per_file, n - got)
        if want <= 0 and counted_files >= MAX_FOOTERS:
            exact = False  # the other files' rows are extrapolated
            break
        try:
            some, count = text_sample(file, column, want, format)
        except Exception:  # noqa: BLE001, S112 - the job reads it again and names the fault
            exact = False
            continue
        texts.append(some)
        got += len(some)
        exact = exact and (format or input_format(file.path)) == "parquet"
        if count is not None and i < MAX_FOOTERS:
            rows, counted_files = rows + count, counted_files + 1
    if not counted_files:
        return _joined(texts), RowCount(None)
    total = round(rows * len(files) / counted_files)
    exact = exact and counted_files == len(files)
    return _joined(texts), RowCount(max(total, got), exact)


def _parquet_texts(path: str, column: str, n: int) -> tuple[pa.Array, int]:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        parquet = pq.ParquetFile(f)
        meta, texts, got, group = parquet.metadata, [], 0, 0
        while column in parquet.schema_arrow.names and got < n and group < meta.num_row_groups:
            first, rows = group, 0
            while rows < n - got and group < meta.num_row_groups:  # the groups still wanted
                rows, group = rows + meta.row_group(group).num_rows, group + 1
            read = parquet.read_row_groups(list(range(first, group)), columns=[column])
            texts.append(_strings(read.column(0)))
            got += len(texts[-1])
        return _joined(texts)[:n], meta.num_rows


def _strings(column: pa.ChunkedArray) -> pa.Array:
    """A column's non-null texts (``large_string``; a binary column's UTF-8 alike, as the
    jobs embed it): none if it holds neither strings nor bytes; a value not valid UTF-8 is
    left out (reading the file dead-letters its row)."""
    if not is_text_type(column.type):
        return pa.array([], pa.large_string())
    return utf8_texts(column)[0]


def _joined(texts: list[pa.Array]) -> pa.Array:
    return pa.concat_arrays(texts) if texts else pa.array([], pa.large_string())


def _json_lines_texts(file: InputFile, column: str, n: int) -> tuple[pa.Array, int | None]:
    texts: list[str] = []
    lines = read = 0
    cut = False
    with contextlib.ExitStack() as stack:
        stream = open_stream(file.path, stack)
        try:
            for raw in iter(stream.readline, b""):
                if lines >= max(n, 1):
                    break
                if raw.strip():
                    lines, read = lines + 1, read + len(raw)
                    try:
                        value = json.loads(raw.removeprefix(BOM)).get(column)
                        if isinstance(value, str) and len(texts) < n:
                            value.encode()  # raises for a lone surrogate
                            texts.append(value)
                    except (ValueError, AttributeError):  # the row is a dead letter
                        continue
        except Exception:  # noqa: BLE001 - a file cut short: its texts before the cut (the
            cut = True  # job reads it again and names the fault)
    sampled = pa.array(texts, pa.large_string())
    if cut or not lines or uncompressed_name(file.path) != file.path.lower() or file.size is None:
        return sampled, None
    # Lines in the file, from its size and the sampled bytes per line.
    return sampled, max(lines, round(file.size * lines / max(read, 1)))
