"""JSON lines as Arrow record batches: whole blocks through pyarrow, bad lines found apart.

pyarrow parses a block of about a megabyte of whole lines at once, so no Python runs per
line when every line fits the columns (the common case). A block that fails is halved until
each bad line stands alone (``k`` bad lines among ``n`` cost about ``2k log2(n)`` more
parses), and each bad line is described in Python. Line numbers count every line from 0;
a blank line is neither a row nor a fault, and blank and bad lines end a batch.

Example:
    >>> import io
    >>> schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    >>> data = b'{"id": 1, "text": "a"}\\nnot json\\n{"id": 2, "text": "b"}\\n'
    >>> for item in read_json_lines(io.BytesIO(data), schema, max_rows=10):
    ...     if isinstance(item, LineBatch):
    ...         print(item.first_line, item.batch.to_pylist())
    ...     else:
    ...         print(item.line, item.message[:26])
    0 [{'id': 1, 'text': 'a'}]
    1 the line is not valid JSON
    2 [{'id': 2, 'text': 'b'}]
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import gzip
import io
import json
import lzma
import os
import re
import stat
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jax._src.core.wording import article
from beam_jax._src.errors import SpecError

__all__ = [
    "BadLine",
    "FileCut",
    "LineBatch",
    "infer_schema",
    "is_json_lines",
    "open_stream",
    "read_json_lines",
    "uncompressed_name",
]

JSON_LINES_SUFFIXES = (".jsonl", ".json", ".ndjson")
# Compression Beam's FileSystems recognise by extension.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".deflate", ".zst", ".zstd", ".lzma", ".xz")
BOM = b"\xef\xbb\xbf"
# Python's decompressors raise on a stream cut short; Beam's gzip reader ends it without a
# word (half a .jsonl.gz read as 1,434 of 3,000 lines, no error), so these go through them.
_DECOMPRESSORS = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    ".bz2": bz2.BZ2File,
    ".xz": lzma.LZMAFile,
    ".lzma": lzma.LZMAFile,
}
BLOCK_BYTES = 1 << 20  # one pyarrow parse per ~1 MB of whole lines
SAMPLE_LINES = 1000  # lines read at launch to infer the columns' types


@dataclasses.dataclass(frozen=True)
class LineBatch:
    """Rows parsed from consecutive lines ``first_line, first_line + 1, ...``, or, where
    ``lines`` is given (:func:`read_json_lines` with ``gaps``), from those lines."""

    first_line: int
    batch: pa.RecordBatch
    lines: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class BadLine:
    """A line that is not a row of the schema: its number (from 0), text (bytes), what is
    wrong and how to fix it, its key field when readable, and the column whose type a field
    does not fit, when that is what is wrong."""

    line: int
    text: bytes
    message: str
    key: Any = None
    column: str | None = None


class FileCut(Exception):
    """A file's reading stopped at ``line`` (lines before it were read); ``error`` is why."""

    def __init__(self, line: int, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.line, self.error = line, error


def is_json_lines(path: str) -> bool:
    """Whether ``path`` names JSON lines (``.jsonl``, ``.json``, ``.ndjson``, compressed or not).

    Example:
        >>> is_json_lines("gs://b/part-0.jsonl.gz"), is_json_lines("x.parquet")
        (True, False)
    """
    return uncompressed_name(path).endswith(JSON_LINES_SUFFIXES)


def uncompressed_name(path: str) -> str:
    """``path`` lower-cased, without the compression suffixes :func:`open_stream` reads
    (``"in/a.jsonl.gz"`` -> ``"in/a.jsonl"``): the name that tells its format."""
    name = path.lower()
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def open_stream(path: str, stack: contextlib.ExitStack) -> BinaryIO:
    """``path`` opened for reading, decompressed as its extension says; ``stack`` closes it.
    A local path that is not a regular file is refused: opening a pipe would wait forever.

    Raises:
        OSError: The file cannot be opened.
    """
    if "://" not in path:
        mode = os.stat(path).st_mode  # follows links; a link to nothing raises here
        if not stat.S_ISREG(mode):
            raise OSError(f"{path} is not a regular file (mode {stat.filemode(mode)})")
    lower = path.lower()
    decompressor = next((d for s, d in _DECOMPRESSORS.items() if lower.endswith(s)), None)
    if decompressor is None:  # Beam's own decompression (.deflate, .zst), or none
        return stack.enter_context(FileSystems.open(path, compression_type=CompressionTypes.AUTO))
    raw = stack.enter_context(
        FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    )
    return stack.enter_context(decompressor(raw))  # closed first; it leaves raw open


def _read_some(stream: BinaryIO, size: int) -> bytes:
    """Up to about ``size`` bytes; what was decompressed before a fault is never lost."""
    read1 = getattr(stream, "read1", None)
    if read1 is None:
        return stream.read(size)
    parts, total = [], 0
    while total < size:
        try:
            part = read1(size - total)
        except Exception as e:
            raise _PartialRead(b"".join(parts), e) from e
        if not part:
            break
        parts.append(part)
        total += len(part)
    return b"".join(parts)


class _PartialRead(Exception):
    def __init__(self, data: bytes, error: BaseException):
        super().__init__(str(error))
        self.data, self.error = data, error


def _blocks(stream: BinaryIO, block_bytes: int) -> Iterator[tuple[bytes, BaseException | None]]:
    """Blocks of whole lines (the last line of the file may lack its newline); a fault is
    yielded with the whole lines read before it, after which the stream is abandoned."""
    pending: list[bytes] = []  # the start of a line longer than what was read so far
    first = True
    while True:
        fault = None
        try:  # the first read holds a whole byte order mark, if there is one
            chunk = _read_some(stream, max(block_bytes, len(BOM)) if first else block_bytes)
        except _PartialRead as partial:
            chunk, fault = partial.data, partial.error
        except Exception as e:  # noqa: BLE001 - the file's fault, reported with its line
            chunk, fault = b"", e
        if first:
            chunk, first = chunk.removeprefix(BOM), False  # some editors write one; not JSON
        cut = chunk.rfind(b"\n") + 1
        if fault is not None:  # the partial line at the cut is not read
            yield (b"".join([*pending, chunk[:cut]]) if cut else b""), fault
            return
        if not chunk:
            if pending:
                yield b"".join(pending), None
            return
        if cut:
            yield b"".join([*pending, chunk[:cut]]), None
            pending = [chunk[cut:]] if cut < len(chunk) else []
        else:
            pending.append(chunk)


def _parse(data: bytes, schema: pa.Schema) -> pa.Table:
    options = pj.ReadOptions(use_threads=False, block_size=max(len(data), 1) + 1)
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    table = pj.read_json(io.BytesIO(data), read_options=options, parse_options=parse)
    table.validate(full=True)  # pyarrow copies string bytes unchecked: UTF-8 is checked here
    return table


class _Lines:
    """The lines of one block: where each starts and ends, and which are blank."""

    def __init__(self, block: bytes):
        codes = np.frombuffer(block, dtype=np.uint8)
        newlines = np.flatnonzero(codes == ord("\n"))
        ends = newlines if block.endswith(b"\n") else np.append(newlines, len(block))
        self.starts = np.concatenate(([0], newlines + 1))[: len(ends)]
        self.ends = ends
        self.count = len(ends)
        self.block = block
        # Lines that cannot be one object ({...}) never reach pyarrow: a top-level null
        # reads as a row of nulls, and pyarrow 25 crashes on a block whose first row is
        # null. Checked with numpy; only lines with whitespace at either end in Python.
        length = self.ends - self.starts
        full = length > 0
        self.object = np.zeros(len(ends), dtype=bool)
        last = codes[self.ends[full] - 1]
        before = codes[np.maximum(self.ends[full] - 2, 0)]
        self.object[full] = (codes[self.starts[full]] == ord("{")) & (
            (last == ord("}")) | ((last == ord("\r")) & (before == ord("}")))  # CRLF files
        )
        blank = np.zeros(len(ends), dtype=bool)
        blank[~full] = True
        for index in np.flatnonzero(full & ~self.object).tolist():
            line = block[self.starts[index] : self.ends[index]].strip(b" \t\r\n")
            blank[index] = not line
            self.object[index] = line[:1] == b"{" and line[-1:] == b"}"
        self.rows = np.flatnonzero(~blank)

    def text(self, first: int, last: int) -> bytes:
        """Lines ``first..last`` (indexes into the block), newlines included."""
        return self.block[self.starts[first] : self.ends[last] + 1]


def _parse_rows(
    lines: _Lines, rows: np.ndarray, schema: pa.Schema, key: str | None
) -> tuple[list[tuple[np.ndarray, pa.Table]], list[tuple[int, str, Any, str | None]]]:
    """``rows`` (non-blank line indexes) parsed: good runs as tables, bad lines described."""
    error: Exception | None = None
    if lines.object[rows].all():
        try:
            table = _parse(lines.text(rows[0], rows[-1]), schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            error = e
        else:
            if table.num_rows == len(rows):
                return [(rows, table)], []
    if len(rows) == 1:
        raw = lines.block[lines.starts[rows[0]] : lines.ends[rows[0]]]
        return [], [(int(rows[0]), *_describe(raw, schema, key, error))]
    half = len(rows) // 2
    good, bad = _parse_rows(lines, rows[:half], schema, key)
    more_good, more_bad = _parse_rows(lines, rows[half:], schema, key)
    return good + more_good, bad + more_bad


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


_CHANGED = re.compile(r"Column\(/([^)]*)\) changed from (\w+) to (\w+)(?: in row \d+)?")
_IN_ROW = re.compile(r" in row \d+")  # pyarrow's row in the one line parsed: always 0


def _cause(error: Exception | None, schema: pa.Schema) -> tuple[str, str | None]:
    """pyarrow's reason a line's fields do not fit, in the columns' words, and the column."""
    if error is None:
        return "it does not read as exactly one row", None
    text = str(error).removeprefix("JSON parse error: ")
    changed = _CHANGED.search(text)
    if changed and schema.get_field_index(changed[1]) >= 0:
        name, got = changed[1], changed[3]
        want = schema.field(name).type
        return f"its field {name!r} holds {article(got)} {got} where the column is {want}", name
    return _IN_ROW.sub("", text), None


def _describe(
    raw: bytes, schema: pa.Schema, key: str | None, error: Exception | None
) -> tuple[str, Any, str | None]:
    """Why the line ``raw`` is not a row (the message), its key field if readable, and the
    column whose type one of its fields does not fit, if that is why."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        value = _loads(raw.decode("utf-8", errors="replace"))
        bad = raw[max(0, e.start - 20) : e.end + 20]
        return (
            f"the line is not valid UTF-8 ({e.reason} at byte {e.start}, near {bad!r}); "
            "re-encode the file as UTF-8",
            value.get(key) if key and isinstance(value, dict) else None,
            None,
        )
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"the line is not valid JSON ({e}): {_short(text)}", None, None
    if not isinstance(value, dict):
        return f"the line holds a JSON {type(value).__name__}, not an object", None, None
    found = value.get(key) if key else None
    found = found if found is None or isinstance(found, bool | int | float | str) else repr(found)
    for name, field in value.items():
        lone = _lone_surrogate(field) if isinstance(field, str) else None
        if lone is not None:
            return (
                f"the field {name!r} holds a lone surrogate ({field[lone]!r} at index {lone}), "
                "which UTF-8 cannot hold; fix the program that wrote the file",
                found,
                None,
            )
    cause, column = _cause(error, schema)
    columns = ", ".join(f"{f.name}: {f.type}" for f in schema)
    return (
        f"the line's fields do not fit the columns ({columns}): {cause}; fix the line",
        found,
        column,
    )


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (valid JSON, invalid Unicode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _runs(lines: np.ndarray, max_rows: int | None) -> Iterator[tuple[int, int]]:
    """``(offset, length)`` of runs of consecutive line numbers, at most ``max_rows`` long."""
    if not len(lines):
        return
    breaks = np.flatnonzero(np.diff(lines) != 1) + 1
    bounds = [0, *breaks.tolist(), len(lines)]
    for start, stop in zip(bounds, bounds[1:], strict=False):
        step = max_rows or stop - start
        for offset in range(start, stop, step):
            yield offset, min(step, stop - offset)


def read_json_lines(
    stream: BinaryIO,
    schema: pa.Schema,
    *,
    max_rows: int | None = None,
    key: str | None = None,
    block_bytes: int = BLOCK_BYTES,
    gaps: bool = False,
) -> Iterator[LineBatch | BadLine]:
    """The rows of a JSON-lines stream as record batches, and each bad line apart, in order.

    Args:
        stream: A binary stream (decompressed).
        schema: The columns read and their types; other fields are ignored, a missing
            field is null.
        max_rows: The most rows in one batch (default: a block's run of lines).
        key: A field whose value names a bad line in its ``BadLine.key``, when readable.
        block_bytes: About how many bytes are parsed at once.
        gaps: A batch's rows may skip bad and blank lines (``LineBatch.lines`` then says
            each row's line); each bad line is yielded before the batch that follows it.

    Raises:
        FileCut: The stream failed part-way (a truncated gzip, a read error); raised after
            every whole line before the fault was yielded.
    """
    line = 0
    for block, fault in _blocks(stream, block_bytes):
        if block:
            lines = _Lines(block)
            good, bad = _parse_rows(lines, lines.rows, schema, key) if len(lines.rows) else ([], [])
            yield from _in_order(good, bad, line, lines, max_rows, gaps)
            line += lines.count
        if fault is not None:
            raise FileCut(line, fault)


def _in_order(good, bad, line: int, lines: _Lines, max_rows: int | None, gaps: bool = False):
    """The block's batches and bad lines, merged in line order: a batch where its last row
    is, so a bad line among its rows (``gaps``) comes before it."""
    items: list[tuple[int, LineBatch | BadLine]] = []
    for index, message, found, column in bad:
        raw = lines.block[lines.starts[index] : lines.ends[index]]
        items.append((index, BadLine(line + index, raw, message, found, column)))
    if good:
        tables = [t for _, t in good]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        if any(column.num_chunks > 1 for column in table.columns):
            table = table.combine_chunks()
        numbers = np.concatenate([r for r, _ in good])
        step = max_rows or len(numbers)
        runs = _runs(numbers, max_rows) if not gaps else (
            (offset, min(step, len(numbers) - offset)) for offset in range(0, len(numbers), step)
        )  # fmt: skip
        for offset, length in runs:
            for batch in table.slice(offset, length).to_batches():
                rows = numbers[offset : offset + batch.num_rows]
                first, last = int(rows[0]), int(rows[-1])
                spread = None if last - first == len(rows) - 1 else line + rows
                items.append((last, LineBatch(line + first, batch, spread)))
                offset += batch.num_rows
    items.sort(key=lambda item: item[0])
    for _, item in items:
        yield item


def infer_schema(
    paths: Sequence[str], columns: Sequence[str] | None = None, lines: int = SAMPLE_LINES
) -> pa.Schema:
    """Column types from the first ``lines`` JSON-object lines of ``paths`` (in order).

    pyarrow infers each field's type; a column of ``columns`` none of them holds (or only
    as null) is read as string. Files that cannot be opened, and lines that are not JSON
    objects, are skipped here (reading dead-letters them).

    Raises:
        SpecError: The sampled lines give a field two types (e.g. a number and a string);
            pass the types yourself.
    """
    sample: list[bytes] = []
    for path in paths:
        if len(sample) >= lines:
            break
        try:
            with contextlib.ExitStack() as stack:
                stream = open_stream(path, stack)
                for number, raw in enumerate(iter(stream.readline, b"")):
                    raw = raw.removeprefix(BOM) if number == 0 else raw
                    if isinstance(_loads(raw.decode("utf-8", errors="replace")), dict):
                        sample.append(raw.rstrip(b"\r\n") + b"\n")
                        if len(sample) >= lines:
                            break
        except Exception:  # noqa: BLE001, S112 - its reading will dead-letter it
            continue
    inferred = pa.schema([])
    if sample:
        data = b"".join(sample)
        try:
            inferred = pj.read_json(
                io.BytesIO(data), read_options=pj.ReadOptions(block_size=len(data) + 1)
            ).schema
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise SpecError(
                f"the first {len(sample)} JSON lines of {list(paths)[:3]} give a field "
                f"two types ({e}); pass the columns' types, e.g. "
                "schema=pa.schema([('id', pa.string()), ('text', pa.string())])"
            ) from e
    names = list(columns) if columns is not None else inferred.names
    fields = []
    for name in names:
        index = inferred.get_field_index(name)
        kind = inferred.field(index).type if index >= 0 else pa.null()
        fields.append(pa.field(name, pa.string() if pa.types.is_null(kind) else kind))
    return pa.schema(fields)
