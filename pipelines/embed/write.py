"""Writing the flagship's output in parts, each named by its input file and row range.

Once every row of a part has an embedding or a dead letter, :class:`WriteParts` writes its
dead letters to ``_failed/failed-SOURCE-START-END.jsonl`` (if it has any), then its
embeddings to ``embeddings-SOURCE-START-END.parquet``: that file, written last, marks the
part done. ``SOURCE`` is the file's stem and a hash of its path, ``START`` and ``END``
12-digit row numbers. Each file is written under a temporary name and renamed, so a part is
whole or absent, and writing a part twice (a retried bundle, a resumed run) rewrites the
same file: no id is ever written twice. What could not be read (a file, a row group, a
JSON line) is written by :class:`WriteUnreadable`.

Example:
    >>> embeddings_name("in-1a2b3c4d", 0, 1024)
    'embeddings-in-1a2b3c4d-000000000000-000000001024.parquet'
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

import beam_jax as bj
from beam_jax.jobs import OutputLayout, dead_letter_json, open_atomically, write_atomically
from pipelines.embed.parts import KEY, Inputs, Part, split_keys
from pipelines.embed.tokenize import METRICS_NAMESPACE

__all__ = [
    "DEAD_LETTER_DIR",
    "EMBEDDINGS",
    "FAILED",
    "LAYOUT",
    "RECORD",
    "WriteParts",
    "WriteUnreadable",
    "done_parts",
    "embeddings_name",
    "embeddings_schema",
    "embeddings_table",
    "part_counts",
    "write_embeddings",
]

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
    index = {inputs.source(i): i for i in range(len(inputs.files))}
    done = set()
    for name in names:
        match = EMBEDDINGS.match(name)
        if match and match["source"] in index:
            done.add((index[match["source"]], int(match["start"])))
    return frozenset(done)


OUTPUT = "output"  # RunKernelOnArrow's column for a kernel returning one array


class _Open:
    """A part being collected: its rows, and the results and dead letters seen so far."""

    def __init__(self, part: Part):
        self.part = part
        self.results: list[tuple[pa.RecordBatch, np.ndarray | None]] = []
        self.dead: list[tuple[int, bj.FailedElement]] = []
        self.done = 0

    def add_results(self, batch: pa.RecordBatch, rows: np.ndarray | None = None) -> None:
        """Adds ``batch``'s results, or only those at ``rows`` (taken when written)."""
        self.results.append((batch, rows))
        self.done += batch.num_rows if rows is None else len(rows)

    def add_dead(self, row: int, record: bj.FailedElement) -> None:
        self.dead.append((row, record))
        self.done += 1

    @property
    def whole(self) -> bool:
        return self.done >= len(self.part.positions)


class _Bundle(threading.local):
    """The parts of the bundle this thread runs: shared by the ``WriteParts`` steps of one
    fused stage (each reads one of the streams: parts, results, dead letters)."""

    def __init__(self):
        self.open: dict[int, list[_Open]] | None = None  # by file, in any order
        self.early: list[Any] = []  # results or dead letters whose part is not open yet


_BUNDLE = _Bundle()
_WINDOW, _TIMESTAMP = beam.DoFn.WindowParam, beam.DoFn.TimestampParam


def embeddings_schema(id_type: pa.DataType) -> pa.Schema:
    """``id`` (the input's type) and ``embedding``: a ``list<float32>`` never null, nor its
    values. So declared, Parquet stores no definition level per value (written in ~0.7x the
    time of a nullable list)."""
    values = pa.field("item", pa.float32(), nullable=False)
    return pa.schema([("id", id_type), pa.field("embedding", pa.list_(values), nullable=False)])


def embeddings_table(ids: pa.Array, vectors: np.ndarray, schema: pa.Schema) -> pa.Table:
    """``ids`` and their ``float32[n, D]`` vectors as a table of ``schema`` (of
    :func:`embeddings_schema`), the vectors not copied."""
    n, width = vectors.shape
    offsets = pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int32))
    embedding = pa.ListArray.from_arrays(
        offsets, pa.array(vectors.reshape(-1)), type=schema.field("embedding").type
    )
    return pa.Table.from_arrays([ids.cast(schema.field("id").type), embedding], schema=schema)


def write_embeddings(table: pa.Table, path: str) -> None:
    """Writes a part's table of :func:`embeddings_schema` to ``path``, whole or not at all."""
    # Streamed into the staged file: no copy of the part in memory. Embeddings do not
    # compress (snappy saved ~5%) and have no repeats to look up: without either, writing
    # took 0.6x the time (8,192 rows x 384 floats); nor do a reader's filters use their
    # minimum and maximum (0.75x the time without them).
    with open_atomically(path) as f:
        pq.write_table(table, f, use_dictionary=["id"], compression="none", write_statistics=["id"])


class WriteParts(beam.DoFn):
    """Parts, results or dead letters in; each part's files written as soon as every row of
    it has an embedding or a dead letter; its name out.

    A pipeline applies it to each stream that makes up its parts (the tokenize step's parts
    and dead letters, the kernel's results and dead letters): Beam runners fuse a chain of
    single-input steps into one stage, whose bundles run each on one thread, so these steps
    share the parts of the bundle through a thread-local (a Flatten of the streams would
    not do: the FnApiRunner runs a Flatten of several inputs between stages). A part is one
    record batch, which one bundle tokenizes and embeds whole; the kernel flushes its
    batches when the bundle finishes, and Beam finishes a stage's steps producers first, so
    when the first ``WriteParts`` finishes, no part may be open. One that is means the
    steps were not fused, and is an error rather than a part written incomplete.

    A whole part is written in a background thread (``beam_jax.WorkAhead``), one part
    behind, while the bundle goes on; its name comes out once it is written, and a bundle
    finishes only when all of its parts are.

    Args:
        directory: Where the parts go (the run's staging directory).
        inputs: The run's inputs, for file names.
        schema: The embeddings' Arrow schema.
    """

    def __init__(self, directory: str, inputs: Inputs, schema: pa.Schema):
        self._directory = directory
        self._inputs = inputs
        self._schema = schema
        # Two threads: a bundle's last batches complete several parts at once.
        self._ahead = bj.WorkAhead("beam_jax-write", depth=2, workers=2)

    def setup(self):
        self._parts = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "parts_written")
        self._ahead.setup()

    def teardown(self):
        self._ahead.teardown()

    def start_bundle(self):
        # Every step starts before any element of the bundle is processed: each may reset.
        _BUNDLE.open, _BUNDLE.early = {}, []
        self._ahead.start_bundle()

    def process(self, element: Any, window=_WINDOW, timestamp=_TIMESTAMP) -> Iterator[str]:
        where = (window, timestamp)  # the element's, for the names of the parts it completes
        if isinstance(element, Part):
            _BUNDLE.open.setdefault(element.file_index, []).append(_Open(element))
            early, _BUNDLE.early = _BUNDLE.early, []
            for item in early:
                yield from self._add(item, where)
            yield from self._flush(element.file_index, where)
        else:
            yield from self._add(element, where)

    def _find(self, file_index: int, row: int) -> _Open | None:
        for part in _BUNDLE.open.get(file_index, ()):
            if part.part.start <= row < part.part.end:
                return part
        return None

    def _add(self, item: Any, where: tuple) -> Iterator[str]:
        if isinstance(item, bj.FailedElement):
            (file_index,), (row,) = split_keys(np.array([item.key]))
            part = self._find(int(file_index), int(row))
            if part is None:
                _BUNDLE.early.append(item)
                return
            part.add_dead(int(row), item)
            yield from self._flush(int(file_index), where)
            return
        files, rows = split_keys(item.column(KEY).to_numpy())
        for file_index in np.unique(files).tolist():
            # Packed batches mix the rows of several parts: cut by part.
            parts = sorted(_BUNDLE.open.get(file_index, []), key=lambda p: p.part.start)
            mine = np.flatnonzero(files == file_index) if len(files) else files
            starts = np.array([p.part.start for p in parts], np.int64)
            ends = np.array([p.part.end for p in parts], np.int64)
            at = np.searchsorted(starts, rows[mine], side="right") - 1
            found = (at >= 0) & (rows[mine] < ends[np.maximum(at, 0)] if parts else False)
            for index in np.unique(at[found]).tolist():
                rows_of = mine[found & (at == index)]
                parts[index].add_results(item, None if len(rows_of) == item.num_rows else rows_of)
            if not found.all():
                _BUNDLE.early.append(item.take(pa.array(mine[~found])))
            yield from self._flush(file_index, where)

    def _flush(self, file_index: int, where: tuple) -> Iterator[str]:
        parts = _BUNDLE.open.get(file_index, [])
        for part in [p for p in parts if p.whole]:
            parts.remove(part)
            # Encoding and writing release the GIL: they run in the background while the
            # bundle goes on; the bundle ends only once every part is written.
            work = functools.partial(self._write, part)
            yield from self._ahead.submit(work, self._part_written, *where)

    def _part_written(self, name: str) -> Iterator[str]:
        self._parts.inc()
        yield name

    def finish_bundle(self):
        yield from self._ahead.finish_bundle()
        if _BUNDLE.open is None:
            return  # another WriteParts of the stage checked the bundle
        left = [p for parts in _BUNDLE.open.values() for p in parts]
        early = len(_BUNDLE.early)
        _BUNDLE.open, _BUNDLE.early = None, []
        if left or early:
            part = left[0].part if left else None
            raise RuntimeError(
                f"{len(left)} parts were still incomplete and {early} results or "
                "dead letters had no part when the bundle finished"
                + (f" (e.g. rows {part.start}-{part.end} of "
                   f"{self._inputs.file_name(part.file_index)})" if part else "")
                + ": the tokenize step, the kernel and WriteParts must run fused in one "
                "stage, with nothing (a Reshuffle, a GroupByKey) between them"
            )  # fmt: skip

    def _write(self, collected: _Open) -> str:
        """Writes a whole part: its dead letters (if any), then its embeddings, in row order."""
        part = collected.part
        positions = part.positions
        table = self._schema.empty_table()
        done, vectors = _in_row_order(collected.results)
        if len(done):
            ids = part.ids.take(pa.array(np.searchsorted(positions, done)))
            table = embeddings_table(ids, vectors, self._schema)
        dead = sorted(collected.dead, key=lambda d: d[0])
        if table.num_rows + len(dead) != len(positions):
            # Every row ends as one embedding or one dead letter; anything else is a bug,
            # and an incomplete part must not be written as if it were whole.
            raise RuntimeError(
                f"part {part.start} of {self._inputs.file_name(part.file_index)}: "
                f"{len(positions)} rows but {table.num_rows} embeddings and {len(dead)} "
                "dead letters"
            )
        source, file = self._inputs.source(part.file_index), self._inputs.file_name(part.file_index)
        if dead:
            ids = part.id_of(np.searchsorted(positions, [p for p, _ in dead]))
            lines = [
                f"{dead_letter_json(r, id=i, file=file, row=p)}\n"
                for i, (p, r) in zip(ids, dead, strict=True)
            ]
            name = failed_name(source, part.start, part.end)
            write_atomically(f"{self._directory}/{name}", "".join(lines).encode("utf-8"))
        name = embeddings_name(source, part.start, part.end)
        write_embeddings(table, f"{self._directory}/{name}")
        return name


def _in_row_order(results) -> tuple[np.ndarray, np.ndarray]:
    """A part's results (record batches of ``key`` and ``output``, each with the rows of it
    that are the part's, or None for all) as their rows and vectors, sorted by row, with
    one copy of the vectors (gathered from each batch straight to their place)."""
    pieces = []
    for batch, rows in results:
        done = split_keys(batch.column(KEY).to_numpy())[1]
        column = batch.column(OUTPUT)
        size = column.type.list_size  # the batch's vectors, in place (no copy)
        vectors = column.values.slice(column.offset * size, len(column) * size).to_numpy()
        vectors = vectors.reshape(len(column), size)
        pieces.append((done if rows is None else done[rows], vectors, rows))
    if not pieces:
        return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
    done = np.concatenate([d for d, _, _ in pieces])
    order = np.argsort(done, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    first = pieces[0][1]
    out = np.empty((len(done), first.shape[1]), first.dtype)
    at = 0
    for rows_done, vectors, rows in pieces:
        out[rank[at : at + len(rows_done)]] = vectors if rows is None else vectors[rows]
        at += len(rows_done)
    return done[order], out


class WriteUnreadable(beam.DoFn):
    """A read step's dead letter in, written to its own file under ``_failed/``: a file or
    row group that cannot be read (counted as ``files_unreadable``), or a JSON line that is
    no row (``lines_unreadable``; its row's dead letter at stage ``read``, filed as if it
    were a part of one row)."""

    def __init__(self, directory: str, inputs: Inputs):
        self._directory = directory
        self._inputs = inputs

    def setup(self):
        counter = functools.partial(beam.metrics.Metrics.counter, METRICS_NAMESPACE)
        self._files, self._lines = counter("files_unreadable"), counter("lines_unreadable")

    def process(self, record: bj.FailedElement) -> Iterator[str]:
        paths = [self._inputs.file_name(i) for i in range(len(self._inputs.files))]
        index = paths.index(record.source) if record.source in paths else 0
        row, source = record.row or 0, self._inputs.source(index)
        if record.message.startswith(f"line {row} of "):  # how ReadArrowBatches names a line
            self._lines.inc()
            name, key = failed_name(source, row, row + 1), record.key
        else:
            self._files.inc()
            name, key = unreadable_name(source, row), None
        line = dead_letter_json(record, id=key, file=paths[index], row=row)
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
