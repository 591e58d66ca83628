"""Every input as Arrow record batches of ``key``, ``id`` and ``text``, one batch per part
(docs/embed_text.md, "The route"): Parquet through ``beam_jax.ReadArrowBatches``, JSON
lines and the built-in corpus through :class:`ReadLines`. ``key`` is
``file_index << 40 | row`` (:mod:`pipelines.embed.parts`); a row unusable as read carries
its reason in ``problem`` (and its id, as JSON, in ``raw_id``) for the tokenize step.

Example:
    >>> read = ReadParts(inputs, "in/*.parquet", 8192, done, id_type)  # doctest: +SKIP
    >>> batches, unreadable = pipeline | read  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

import beam_jax as bj
from beam_jax.internal import origin_of
from pipelines import corpus
from pipelines import text_rows as tr
from pipelines.embed.parts import KEY, PROBLEM, RAW_ID, ROW_BITS
from pipelines.input_files import BOM, Inputs, open_lines

UNREADABLE = "unreadable"

__all__ = ["KeyBatches", "ReadLines", "ReadParts", "unreadable"]


def unreadable(inputs: Inputs, file_index: int, after_row: int, error: BaseException):
    """The dead letter of a file whose reading failed after ``after_row`` rows."""
    file = inputs.file_name(file_index)
    where = f"after row {after_row}" if after_row else "at all"
    return bj.FailedElement.from_error(
        type(error).__name__,
        f"{file} cannot be read {where}: {error}. No row past row {after_row} of it has an "
        "embedding or a dead letter; fix or replace the file and rerun",
        stage=bj.Stage.READ,
        element=file,
        source=file,
        row=after_row,
    )


class KeyBatches(beam.DoFn):
    """A record batch that ``ReadArrowBatches`` read in; the same rows with their keys out,
    the id and text columns renamed ``id`` and ``text``; nothing for a part already done."""

    def __init__(self, inputs: Inputs, done: frozenset[tuple[int, int]]):
        self._index = {f.path: i for i, f in enumerate(inputs.files)}
        self._columns = inputs.columns
        self._done = done

    def process(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        path, first = origin_of(batch)
        if path not in self._index or first is None:
            raise RuntimeError(
                f"a record batch from {path!r} (first row {first}) is not one of the job's "
                f"files as matched at launch: {sorted(self._index)[:3]}..."
            )
        file_index = self._index[path]
        if (file_index, first) in self._done or not batch.num_rows:
            return
        keys = np.arange(first, first + batch.num_rows, dtype=np.int64) | (file_index << ROW_BITS)
        columns = [pa.array(keys), *(batch.column(c) for c in self._columns)]
        yield pa.RecordBatch.from_arrays(columns, names=[KEY, "id", "text"])


class ReadLines(beam.DoFn):
    """A file's index in; its parts as keyed record batches out, for JSON lines and the
    built-in corpus; a file that cannot be read ends with its dead letter (``unreadable``),
    after the parts read before the fault.

    Args:
        inputs: The run's inputs.
        part_rows: Rows (lines) per part.
        done: ``(file_index, part_start)`` of parts already written; skipped.
        id_type: The run's id type.
    """

    def __init__(self, inputs: Inputs, part_rows: int, done: frozenset, id_type: tr.IdType):
        self._inputs = inputs
        self._id_type = id_type
        self._part_rows = part_rows
        self._done = done

    def process(self, file_index: int) -> Iterator[Any]:
        part_rows = self._part_rows

        def wanted(position: int) -> bool:
            return (file_index, position // part_rows * part_rows) not in self._done

        if self._inputs.format == "jsonl":
            rows = _json_lines(self._inputs.files[file_index].path, wanted, self._inputs.columns)
        else:
            rows = _builtin(self._inputs.builtin_texts, wanted)
        slab: list[tuple] = []
        try:
            for row in rows:
                if slab and row[0] // part_rows != slab[0][0] // part_rows:
                    yield self._batch(file_index, slab)
                    slab = []
                slab.append(row)
        except _FileFault as fault:
            if slab:
                yield self._batch(file_index, slab)
            yield beam.pvalue.TaggedOutput(
                UNREADABLE, unreadable(self._inputs, file_index, fault.position, fault.error)
            )
            return
        if slab:
            yield self._batch(file_index, slab)

    def _batch(self, file_index: int, slab: list[tuple]) -> pa.RecordBatch:
        """Rows ``(position, id, text, problem)`` of one part as a keyed record batch (blank
        JSON lines are no rows: keys run over line numbers, with gaps). A row that cannot be
        used has a ``problem``, null ``id`` and ``text``, and ``[id, text]`` as read in
        ``raw_id`` (JSON: a lone surrogate fits no Arrow string)."""
        ids, texts, problems, raw = [], [], [], []
        for _, key, text, problem in slab:
            problem = tr.row_problem(self._id_type, key, text, problem)
            if problem is None:
                problem = tr.unicode_problem(text, "text")
            good = problem is None
            ids.append(key if good else None)
            texts.append(text if good else None)
            problems.append(problem)
            raw.append(None if good else json.dumps([key, text]))
        positions = np.array([r[0] for r in slab], np.int64)
        return pa.RecordBatch.from_pydict({
            KEY: pa.array(positions | (file_index << ROW_BITS)),
            "id": pa.array(ids, self._id_type.arrow_type),
            "text": pa.array(texts, pa.string()),
            PROBLEM: pa.array(problems, pa.string()),
            RAW_ID: pa.array(raw, pa.string()),
        })  # fmt: skip


class _FileFault(Exception):
    """A fault that ends a file's reading after ``position`` rows; ``error`` is the cause."""

    def __init__(self, position: int, error: BaseException):
        super().__init__(str(error))
        self.position, self.error = position, error


def _json_lines(
    path: str, wanted: Callable[[int], bool], columns: tuple[str, str] = ("id", "text")
) -> Iterator[tuple]:
    position = 0
    try:
        with open_lines(path) as f:
            for line in iter(f.readline, b""):
                if position == 0:
                    line = line.removeprefix(BOM)  # some editors write one; it is not JSON
                if line.strip() and wanted(position):
                    yield (position, *tr.parse_json_line(line, *columns))
                position += 1  # lines read: where a fault in the next one is reported
    except Exception as e:  # noqa: BLE001 - a file's fault ends that file, named
        raise _FileFault(position, e) from e


def _builtin(n: int | None, wanted: Callable[[int], bool]) -> Iterator[tuple]:
    for position, text in corpus.builtin_corpus(n):
        if wanted(position):
            yield position, position, text, None


class ReadParts(beam.PTransform):
    """The run's inputs as keyed record batches (one per part), spread over the workers,
    and the dead letters of files that cannot be read.

    Args:
        inputs: The run's inputs.
        pattern: ``--input`` (Parquet: what ``ReadArrowBatches`` matches).
        part_rows: Rows per part.
        done: Parts already written, skipped.
        id_type: The run's id type.
    """

    def __init__(self, inputs: Inputs, pattern, part_rows: int, done: frozenset, id_type):
        super().__init__()
        self._inputs, self._pattern = inputs, pattern
        self._part_rows, self._done, self._id_type = part_rows, done, id_type

    def expand(self, pbegin):
        inputs = self._inputs
        if inputs.format == "parquet":
            read = bj.ReadArrowBatches(
                self._pattern, columns=list(inputs.columns), max_rows=self._part_rows
            ).with_exception_handling()
            batches, dead = pbegin | "ReadParquet" >> read
            batches = batches | "Keys" >> beam.ParDo(KeyBatches(inputs, self._done))
            # Beam's matching skips a link to nothing; the launch listed it, so name it here.
            links = [i for i, f in enumerate(inputs.files) if f.size is None]
            gone = pbegin | "BrokenLinks" >> beam.Create(links) | "LinkDead" >> beam.Map(
                lambda i: unreadable(inputs, i, 0, FileNotFoundError(
                    f"No such file: {inputs.files[i].path} is a link to nothing")))  # fmt: skip
            dead = (dead, gone) | "Unreadable" >> beam.Flatten()
        else:
            reads = (
                pbegin
                | "Files" >> beam.Create(range(len(inputs.files)))
                | "SpreadFiles" >> beam.Reshuffle()
                | "ReadLines"
                >> beam.ParDo(ReadLines(inputs, self._part_rows, self._done, self._id_type))
                .with_output_types(pa.RecordBatch)
                .with_outputs(UNREADABLE, main="batches")
            )
            batches, dead = reads.batches, reads[UNREADABLE]
        # One file's parts spread over all workers, as a splittable source's would.
        spread = batches | "SpreadParts" >> beam.Reshuffle()
        return spread, dead
