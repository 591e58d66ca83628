"""Writing the flagship's output in parts, each named by its input file and row range.

Once every row of a part has an embedding or a dead letter, :class:`PartWriter` writes its
dead letters to ``_failed/failed-SOURCE-START-END.jsonl`` (if any), then its embeddings to
``embeddings-SOURCE-START-END.parquet``, which marks the part done (``SOURCE``: the file's
stem and a hash of its path). Each file is written whole under a temporary name and
renamed, and writing a part twice rewrites the same file: no id is written twice. What
could not be read is written by :class:`WriteUnreadable`. A run that reads no row has no
part: :func:`write_no_rows` writes it one embeddings file of no rows, so ``OUTPUT`` still
reads as a dataset of the job's columns.

Example:
    >>> embeddings_name("in-1a2b3c4d", 0, 1024)
    'embeddings-in-1a2b3c4d-000000000000-000000001024.parquet'
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

import beam_jax as bj
from beam_jax import jobs
from pipelines.embed.parts import KEY, METRICS_NAMESPACE, Inputs, Part, split_keys

EMBEDDINGS = re.compile(r"^embeddings-(?P<source>.+)-(?P<start>\d{12})-(?P<end>\d{12})\.parquet$")
# Dead letters sit in "_failed/": dataset readers (pyarrow, pandas, DuckDB globs of
# "*.parquet") skip names that start with "_", so OUTPUT reads as one Parquet dataset.
DEAD_LETTER_DIR = "_failed"
FAILED = re.compile(rf"^{DEAD_LETTER_DIR}/failed-.+\.jsonl$")
RECORD = "_embed_text.json"  # the published run's record, written last
# The flagship's files in OUTPUT; failed/...: where dead letters were published before
# they moved to _failed/. A rerun of the same job resumes from the staged embeddings.
_PUBLISHED = rf"{EMBEDDINGS.pattern[1:-1]}|{FAILED.pattern[1:-1]}"
LAYOUT = jobs.OutputLayout(
    published=re.compile(rf"^({_PUBLISHED})$"),
    ours=re.compile(rf"^({_PUBLISHED}|failed/failed-.+\.jsonl|{RECORD}|_metrics\.json)$"),
    record=RECORD,
    resumable=True,
    parts=EMBEDDINGS,
    dead_letters=FAILED,
)


def embeddings_name(source: str, start: int, end: int) -> str:
    return f"embeddings-{source}-{start:012d}-{end:012d}.parquet"


def write_no_rows(directory: str, inputs: Inputs, id_type: pa.DataType) -> str:
    """Writes the embeddings file of rows 0 to 0 of the first input file, with no rows and
    the job's columns (for a run that read no row); returns its name."""
    name = embeddings_name(inputs.source(0), 0, 0)
    table = jobs.embeddings_schema(id_type, inputs.carried).empty_table()
    jobs.write_embeddings(table, f"{directory}/{name}")
    return name


def failed_name(source: str, start: int, end: int) -> str:
    return f"{DEAD_LETTER_DIR}/failed-{source}-{start:012d}-{end:012d}.jsonl"


def unreadable_name(source: str, after_row: int) -> str:
    return f"{DEAD_LETTER_DIR}/failed-{source}-unreadable-{after_row:012d}.jsonl"


OUTPUT = "output"  # RunKernelOnArrow's column for a kernel returning one array


class _Open:
    """A part being collected, with the results and dead letters seen so far."""

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
        return self.done >= self.part.size


class PartWriter:
    """The parts one DoFn instance has open in its bundle; each written, in the background
    (a ``beam_jax.WorkAhead``), as soon as every row of it has an embedding or a dead letter.

    A DoFn calls :meth:`setup`, :meth:`start_bundle`, :meth:`finish_bundle` and
    :meth:`teardown` from its own, :meth:`open` for each part before any of its results, and
    yields what :meth:`add_results` and :meth:`add_dead` yield: the names of parts written.

    Args:
        directory: Where the parts go (the run's staging directory).
        inputs: The run's inputs, for file names.
        schema: The embeddings' Arrow schema.
    """

    def __init__(self, directory: str, inputs: Inputs, schema: pa.Schema):
        self._directory = directory
        self._inputs = inputs
        self._schema = schema
        self._index = {inputs.file_name(i): i for i in range(len(inputs.files))}
        # Two threads: a bundle's last batches complete several parts at once.
        self._ahead = bj.WorkAhead("beam_jax-write", depth=2, workers=2)

    def setup(self):
        self._parts = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "parts_written")
        self._ahead.setup()

    def teardown(self):
        self._ahead.teardown()

    def start_bundle(self):
        self._open: dict[int, list[_Open]] = {}  # by file, in any order
        self._ahead.start_bundle()

    def open(self, part: Part) -> None:
        self._open.setdefault(part.file_index, []).append(_Open(part))

    def _find(self, file_index: int, row: int) -> _Open:
        for part in self._open.get(file_index, ()):
            if part.part.start <= row < part.part.end:
                return part
        raise RuntimeError(
            f"row {row} of {self._inputs.file_name(file_index)} has a result or a dead letter "
            "but no open part; every part is opened before its rows are tokenized"
        )

    def add_dead(self, record: bj.FailedElement, where: tuple) -> Iterator[Any]:
        """A row's dead letter from the tokenize step: its ``source`` and ``row`` say where."""
        if record.source not in self._index or record.row is None:
            raise RuntimeError(
                f"a dead letter from {record.source!r} (row {record.row}) is not of the "
                f"job's input files: {sorted(self._index)[:3]}..."
            )
        file_index = self._index[record.source]
        self._find(file_index, record.row).add_dead(record.row, record)
        yield from self._flush(file_index, where)

    def add_kernel_dead(self, record: bj.FailedElement, where: tuple) -> Iterator[Any]:
        """A row's dead letter from the kernel, keyed by its key: written with its id, file, row."""
        (file_index,), (row,) = split_keys(np.array([record.key]))
        file_index, row = int(file_index), int(row)
        part = self._find(file_index, row)
        key = part.part.ids[int(np.searchsorted(part.part.positions, row))].as_py()
        source = self._inputs.file_name(file_index)
        part.add_dead(row, dataclasses.replace(record, key=key, source=source, row=row))
        yield from self._flush(file_index, where)

    def add_results(self, item: pa.RecordBatch, where: tuple) -> Iterator[Any]:
        """A kernel batch's results (``key`` and ``output``), cut by part."""
        files, rows = split_keys(item.column(KEY).to_numpy())
        for file_index in np.unique(files).tolist():
            # Packed batches mix the rows of several parts: cut by part.
            parts = sorted(self._open.get(file_index, []), key=lambda p: p.part.start)
            mine = np.flatnonzero(files == file_index)
            starts = np.array([p.part.start for p in parts], np.int64)
            ends = np.array([p.part.end for p in parts], np.int64)
            at = np.searchsorted(starts, rows[mine], side="right") - 1
            found = (at >= 0) & (rows[mine] < ends[np.maximum(at, 0)] if parts else False)
            if not found.all():
                self._find(file_index, int(rows[mine][~found][0]))  # raises
            for index in np.unique(at).tolist():
                rows_of = mine[at == index]
                parts[index].add_results(item, None if len(rows_of) == item.num_rows else rows_of)
            yield from self._flush(file_index, where)

    def _flush(self, file_index: int, where: tuple) -> Iterator[Any]:
        parts = self._open.get(file_index, [])
        for part in [p for p in parts if p.whole]:
            parts.remove(part)
            work = functools.partial(self._write, part)
            yield from self._ahead.submit(work, self._part_written, *where)

    def _part_written(self, written: tuple[str, int, int]) -> Iterator[tuple[str, int, int]]:
        self._parts.inc()
        yield written

    def finish_bundle(self) -> Iterator[Any]:
        yield from self._ahead.finish_bundle()
        left = [p.part for parts in self._open.values() for p in parts]
        if left:
            # Every row of a part ends as one embedding or one dead letter by the end of
            # the bundle that opened it; anything else is a bug, not a part to write.
            raise RuntimeError(
                f"{len(left)} parts were still incomplete when the bundle finished (e.g. rows "
                f"{left[0].start}-{left[0].end} of {self._inputs.file_name(left[0].file_index)})"
            )

    def _write(self, collected: _Open) -> tuple[str, int, int]:
        """Writes a whole part's dead letters (if any), then its embeddings, in row order;
        returns its name and counts."""
        part = collected.part
        table = self._schema.empty_table()
        done, vectors = _in_row_order(collected.results)
        if len(done):
            rows = pa.array(np.searchsorted(part.positions, done))
            kept = None if part.carried is None else part.carried.take(rows)  # the columns carried
            table = jobs.embeddings_table(part.ids.take(rows), vectors, self._schema, kept)
        dead = sorted(collected.dead, key=lambda d: d[0])
        if table.num_rows + len(dead) != part.size:
            raise RuntimeError(
                f"part {part.start} of {self._inputs.file_name(part.file_index)}: "
                f"{part.size} rows but {table.num_rows} embeddings and {len(dead)} dead letters"
            )
        source = self._inputs.source(part.file_index)
        if dead:
            lines = "".join(f"{jobs.dead_letter_json(r)}\n" for _, r in dead)
            name = failed_name(source, part.start, part.end)
            jobs.write_atomically(f"{self._directory}/{name}", lines.encode("utf-8"))
        name = embeddings_name(source, part.start, part.end)
        jobs.write_embeddings(table, f"{self._directory}/{name}")
        return name, table.num_rows, len(dead)


def _in_row_order(results) -> tuple[np.ndarray, np.ndarray]:
    """A part's results (record batches of ``key`` and ``output``, each with the rows of it
    that are the part's, or None for all) as their rows and vectors, sorted by row."""
    pieces = []
    for batch, rows in results:
        done = split_keys(batch.column(KEY).to_numpy())[1]
        vectors = jobs.vectors_of(batch.column(OUTPUT))
        pieces.append((done if rows is None else done[rows], vectors, rows))
    return jobs.gather_in_row_order(pieces)


class WriteUnreadable(beam.DoFn):
    """A read step's dead letter in (a file or row group that cannot be read, counted as
    ``files_unreadable``), written to its own file under ``_failed/``; the file's name out."""

    def __init__(self, directory: str, inputs: Inputs):
        self._directory = directory
        self._inputs = inputs

    def setup(self):
        self._files = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "files_unreadable")

    def process(self, record: bj.FailedElement) -> Iterator[str]:
        paths = [self._inputs.file_name(i) for i in range(len(self._inputs.files))]
        if record.source not in paths:
            raise RuntimeError(
                f"a read step's dead letter names {record.source!r}, which is not one of the "
                f"job's input files as matched at launch ({len(paths)}: {paths[:3]}...)"
            )
        self._files.inc()
        name = unreadable_name(self._inputs.source(paths.index(record.source)), record.row or 0)
        line = f"{jobs.dead_letter_json(record)}\n"
        jobs.write_atomically(f"{self._directory}/{name}", line.encode())
        yield name


def reused_parts(
    directory: str, names: Iterable[str], inputs: Inputs
) -> tuple[frozenset[tuple[int, int]], int, int]:
    """The parts already written (``names``, their embeddings files): their ``(file_index,
    start)``, and the embeddings and dead letters they hold."""
    index = {inputs.source(i): i for i in range(len(inputs.files))}
    done, results, dead = set(), 0, 0
    for name in names:
        match = EMBEDDINGS.match(name)
        if match["source"] in index:
            done.add((index[match["source"]], int(match["start"])))
        with FileSystems.open(f"{directory}/{name}", compression_type="uncompressed") as f:
            results += pq.ParquetFile(f).metadata.num_rows
        part = failed_name(match["source"], int(match["start"]), int(match["end"]))
        failed = f"{directory}/{part}"
        if FileSystems.exists(failed):
            with FileSystems.open(failed, compression_type="uncompressed") as f:
                dead += sum(1 for line in f if line.strip())
    return frozenset(done), results, dead
