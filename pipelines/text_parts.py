"""Writing the flagship's output in parts, each named by its input file and row range.

A part is rows ``[start, end)`` of one input file (lines, for JSON lines). Once every row
of a part has an embedding or a dead letter, :class:`WriteParts` writes its dead letters
to ``_failed/failed-SOURCE-START-END.jsonl`` (if it has any), then its embeddings to
``embeddings-SOURCE-START-END.parquet``: that file, written last, marks the part done.
``SOURCE`` is the file's stem and a hash of its path, ``START`` and ``END`` 12-digit row
numbers. Each file is written under a temporary name and renamed, so a part is whole or
absent, and writing a part twice (a retried bundle, a resumed run) rewrites the same file:
no id is ever written twice.

Example:
    >>> embeddings_name("in-1a2b3c4d", 0, 1024)
    'embeddings-in-1a2b3c4d-000000000000-000000001024.parquet'
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

import beam_jax as bj
from beam_jax.jobs import OutputLayout, write_atomically
from pipelines import text_rows as tr
from pipelines.input_files import BUILTIN, Inputs
from pipelines.text_input import PartRows, UnreadableFile, split_row_key

__all__ = [
    "DEAD_LETTER_DIR",
    "EMBEDDINGS",
    "FAILED",
    "LAYOUT",
    "RECORD",
    "READ",
    "WriteParts",
    "WriteUnreadable",
    "by_part",
    "dead_letter_json",
    "done_parts",
    "embeddings_name",
    "part_counts",
    "write_part",
]

READ = bj.Stage.READ  # the stage of a file that could not be read
EMBEDDINGS = re.compile(r"^embeddings-(?P<source>.+)-(?P<start>\d{12})-(?P<end>\d{12})\.parquet$")
# Dead letters sit in "_failed/": dataset readers (pyarrow, pandas, DuckDB globs of
# "*.parquet") skip names that start with "_", so OUTPUT reads as one Parquet dataset.
DEAD_LETTER_DIR = "_failed"
FAILED = re.compile(rf"^{DEAD_LETTER_DIR}/failed-.+\.jsonl$")
RECORD = "_embed_text.json"  # the published run's record, written last
# The flagship's files in OUTPUT; failed/...: where dead letters were published before
# they moved to _failed/. A rerun of the same job resumes from the staged embeddings.
LAYOUT = OutputLayout(
    published=re.compile(rf"^({EMBEDDINGS.pattern[1:-1]}|{FAILED.pattern[1:-1]})$"),
    ours=re.compile(
        rf"^({EMBEDDINGS.pattern[1:-1]}|{FAILED.pattern[1:-1]}|failed/failed-.+\.jsonl"
        rf"|{RECORD}|_metrics\.json)$"
    ),
    record=RECORD,
    resumable=True,
    parts=EMBEDDINGS,
    dead_letters=FAILED,
)


def embeddings_name(source: str, start: int, end: int) -> str:
    return f"embeddings-{source}-{start:012d}-{end:012d}.parquet"


def failed_name(source: str, start: int, end: int) -> str:
    return f"{DEAD_LETTER_DIR}/failed-{source}-{start:012d}-{end:012d}.jsonl"


def unreadable_name(source: str, after_row: int) -> str:
    return f"{DEAD_LETTER_DIR}/failed-{source}-unreadable-{after_row:012d}.jsonl"


def done_parts(names: Iterable[str], inputs: Inputs) -> frozenset[tuple[int, int]]:
    """``(file_index, start)`` of the parts whose embeddings file is among ``names``."""
    index = {f.source: i for i, f in enumerate(inputs.files)}
    done = set()
    for name in names:
        match = EMBEDDINGS.match(name)
        if match and match["source"] in index:
            done.add((index[match["source"]], int(match["start"])))
    return frozenset(done)


def by_part(element: Any, part_rows: int) -> tuple[tuple[int, int], tuple[int, Any]]:
    """A keyed result ``(row_key, value)`` or a ``FailedElement`` keyed by its part."""
    key = element.key if isinstance(element, bj.FailedElement) else element[0]
    file_index, position = split_row_key(key)
    value = element if isinstance(element, bj.FailedElement) else element[1]
    return (file_index, position // part_rows * part_rows), (position, value)


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    text = repr(value)  # a float, a list...: JSON could hold some, Parquet ids could not
    return text if len(text) <= 1000 else f"{text[:997]}..."


def dead_letter_json(record: bj.FailedElement, **where: Any) -> str:
    """One dead-letter JSON line: ``id``, where the row was, ``stage``, ``error``, details.

    ``id`` is ``where["id"]`` if given, else the record's key; other ``where`` fields
    (``file``, ``row``) come after it. ``error`` is ``"<type>: <message>"``; ``element`` is
    a bounded ``repr`` of the text (or of the token ids, for a kernel failure).
    """
    fields = {"id": record.key, **where}
    fields["id"] = _json_value(fields["id"])
    fields.update(
        stage=record.stage,
        error=f"{record.error_type}: {record.message}",
        error_type=record.error_type,
        message=record.message,
        element=record.element,
        traceback=record.traceback,
    )
    line = json.dumps(fields, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON can escape it, UTF-8 cannot hold it
        line = json.dumps(fields)
    return line


def _file_name(inputs: Inputs, file_index: int) -> str:
    path = inputs.files[file_index].path
    return "<built-in corpus>" if path == BUILTIN else path


class WriteParts(beam.DoFn):
    """``((file_index, start), {"rows", "results", "dead"})`` in; the part's files written.

    Args:
        directory: Where the parts go (the run's staging directory).
        inputs: The run's inputs, for file names.
        schema: The embeddings' Arrow schema.
    """

    def __init__(self, directory: str, inputs: Inputs, schema: pa.Schema):
        self._directory = directory
        self._inputs = inputs
        self._schema = schema

    def setup(self):
        self._parts = beam.metrics.Metrics.counter(tr.METRICS_NAMESPACE, "parts_written")

    def process(self, element: Any) -> Iterator[str]:
        (file_index, start), groups = element
        ids: dict[int, Any] = {}
        for piece in groups["rows"]:
            piece: PartRows
            ids.update(zip(piece.positions, piece.ids, strict=True))
        results = sorted(groups["results"], key=lambda r: r[0])
        dead = sorted(groups["dead"], key=lambda r: r[0])
        covered = [p for p, _ in results] + [p for p, _ in dead]
        if sorted(covered) != sorted(ids):
            # Every row ends as one embedding or one dead letter; anything else is a bug,
            # and an incomplete part must not be written as if it were whole.
            raise RuntimeError(
                f"part {start} of {_file_name(self._inputs, file_index)}: {len(ids)} rows but "
                f"{len(results)} embeddings and {len(dead)} dead letters"
            )
        table = tr.embeddings_table([(ids[p], v) for p, v in results], self._schema)
        dead_rows = [(ids[p], p, r) for p, r in dead]
        end = max(ids) + 1
        name = write_part(self._directory, self._inputs, (file_index, start, end), dead_rows, table)
        self._parts.inc()
        yield name


def write_part(
    directory: str,
    inputs: Inputs,
    part: tuple[int, int, int],
    dead: Iterable[tuple[Any, int, bj.FailedElement]],
    table: pa.Table,
) -> str:
    """Writes one whole part: its dead letters (if any), then its embeddings; returns the
    embeddings file's name.

    Args:
        directory: The run's staging directory.
        inputs: The run's inputs, for file names.
        part: ``(file_index, start, end)``: the part's file and row range.
        dead: ``(id, row, record)`` of each dead letter, in row order.
        table: The part's embeddings, in row order.
    """
    file_index, start, end = part
    source = inputs.files[file_index].source
    file = _file_name(inputs, file_index)
    lines = [dead_letter_json(r, id=i, file=file, row=p) for i, p, r in dead]
    if lines:
        data = "".join(f"{line}\n" for line in lines).encode("utf-8")
        write_atomically(f"{directory}/{failed_name(source, start, end)}", data)
    buffer = io.BytesIO()
    # Embeddings do not compress (snappy saved ~5%) and have no repeats to look up: without
    # either, writing took 0.6x the time (8,192 rows x 384 floats).
    pq.write_table(table, buffer, use_dictionary=["id"], compression="none")
    name = embeddings_name(source, start, end)
    write_atomically(f"{directory}/{name}", buffer.getvalue())
    return name


class WriteUnreadable(beam.DoFn):
    """An ``UnreadableFile`` in; its one dead letter written to its own file under ``_failed/``."""

    def __init__(self, directory: str, inputs: Inputs):
        self._directory = directory
        self._inputs = inputs

    def process(self, fault: UnreadableFile) -> Iterator[str]:
        file = _file_name(self._inputs, fault.file_index)
        where = f"after row {fault.after_row}" if fault.after_row else "at all"
        record = bj.FailedElement.from_error(
            fault.error_type,
            f"{file} cannot be read {where}: {fault.message}. No row past row "
            f"{fault.after_row} of it has an embedding or a dead letter; fix or replace "
            "the file and rerun",
            stage=READ,
            element=file,
            source=file,
            row=fault.after_row,
        )
        line = dead_letter_json(record, id=None, file=file, row=fault.after_row)
        name = unreadable_name(self._inputs.files[fault.file_index].source, fault.after_row)
        write_atomically(f"{self._directory}/{name}", f"{line}\n".encode())
        yield name


def part_counts(directory: str, names: Iterable[str]) -> tuple[int, int]:
    """Embeddings and dead letters in the parts ``names`` (embeddings files) already written."""
    results = dead = 0
    for name in names:
        match = EMBEDDINGS.match(name)
        with FileSystems.open(f"{directory}/{name}", compression_type="uncompressed") as f:
            results += pq.ParquetFile(f).metadata.num_rows
        part = failed_name(match["source"], int(match["start"]), int(match["end"]))
        failed = f"{directory}/{part}"
        if FileSystems.exists(failed):
            with FileSystems.open(failed, compression_type="uncompressed") as f:
                dead += sum(1 for line in f if line.strip())
    return results, dead
