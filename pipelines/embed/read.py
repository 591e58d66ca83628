"""Every input as keyed Arrow record batches of ``key``, ``id`` and ``text``, one per part.

Parquet and JSON lines are read by ``beam_jax.ReadArrowBatches`` (a bad JSON line is a dead
letter, stage ``read``); the built-in corpus is made here. ``key`` is ``file_index << 40 |
row`` (:mod:`pipelines.embed.parts`); a part already written by an earlier run is dropped.

Example:
    >>> read = ReadParts(inputs, 8192, done, pa.int64(), spread=True)  # doctest: +SKIP
    >>> batches, unreadable = pipeline | read  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa

import beam_jax as bj
from beam_jax.internal import ROW_COLUMN, bad_lines_of, row_origin, with_origin
from beam_jax.text import builtin_corpus
from pipelines.embed.parts import BUILTIN_NAME, CARRIED, KEY, PART_FILE, ROW_BITS, Inputs


class KeyBatches(beam.DoFn):
    """A record batch ``ReadArrowBatches`` read in; its rows with their keys out, the columns
    renamed ``id`` and ``text`` (bad lines kept in its metadata); nothing for a part done."""

    def __init__(self, inputs: Inputs, done: frozenset[tuple[int, int]]):
        self._index = {f.path: i for i, f in enumerate(inputs.files)}
        self._carried = inputs.carried.names
        self._columns = [*inputs.columns, *self._carried]
        self._done = done

    def process(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        path, at = row_origin(batch)  # the rows' lines: consecutive, or a column of them
        if path not in self._index or at is None:
            raise RuntimeError(
                f"a record batch from {path!r} (rows at {at}) is not one of the job's files "
                f"as matched at launch: {sorted(self._index)[:3]}..."
            )
        file_index, dead = self._index[path], bad_lines_of(batch)
        rows = np.arange(at, at + batch.num_rows) if isinstance(at, int) else at
        start = min([*rows[:1].tolist(), *(d.row for d in dead)], default=None)
        if start is None or (file_index, start) in self._done:
            return
        lines = [ROW_COLUMN] if ROW_COLUMN in batch.schema.names else []  # rows skip lines
        keys = pa.array(rows.astype(np.int64) | (file_index << ROW_BITS), pa.int64())
        columns = [keys, *(batch.column(c) for c in [*self._columns, *lines])]
        names = [KEY, "id", "text", *(CARRIED + c for c in self._carried), *lines]
        meta = {**batch.schema.metadata, PART_FILE: str(file_index).encode()}
        yield pa.RecordBatch.from_arrays(columns, names=names).replace_schema_metadata(meta)


def _builtin_part(start: int, texts: int | None, part_rows: int) -> pa.RecordBatch:
    """Rows ``start .. start + part_rows`` of the built-in corpus, keyed (file 0)."""
    rows = builtin_corpus(texts)[start : start + part_rows]
    ids = pa.array([i for i, _ in rows], pa.int64())
    batch = pa.RecordBatch.from_arrays(
        [ids, ids, pa.array([t for _, t in rows])], [KEY, "id", "text"]
    )
    return with_origin(batch, BUILTIN_NAME, start)


class ReadParts(beam.PTransform):
    """The run's inputs as keyed record batches (one per part), spread over the workers, and
    the dead letters of what could not be read.

    Args:
        inputs: The run's inputs.
        part_rows: The most rows in a part.
        done: ``(file_index, first row)`` of the parts already written; skipped.
        id_type: The ids' Arrow type (JSON lines are read with it).
        spread: Spread the parts over the workers after reading; without it (one worker)
            reading runs fused with the steps after it, and the text crosses no shuffle.
    """

    def __init__(
        self, inputs: Inputs, part_rows: int, done: frozenset, id_type: pa.DataType, spread: bool
    ):
        super().__init__()
        self._inputs, self._part_rows, self._done, self._id_type = inputs, part_rows, done, id_type
        self._spread = spread

    def expand(self, pbegin):
        inputs, spread = self._inputs, self._spread
        if inputs.format == "builtin":
            starts = range(0, len(builtin_corpus(inputs.builtin_texts)), self._part_rows)
            batches = (
                pbegin
                | "Parts"
                >> beam.Create([s for s in starts if (0, s) not in self._done], reshuffle=spread)
                | "Corpus" >> beam.Map(_builtin_part, inputs.builtin_texts, self._part_rows)
            )
            dead = pbegin | "NoDeadLetters" >> beam.Create([])
        else:
            id_column, text_column = inputs.columns
            json_lines = inputs.format == "jsonl"
            # Each column read once: the text column may also be carried.
            fields = {id_column: self._id_type, text_column: pa.string()}
            fields |= {f.name: f.type for f in inputs.carried if f.name not in fields}
            read = bj.ReadArrowBatches(
                inputs.pattern,
                columns=list(fields),
                max_rows=self._part_rows,
                format=inputs.format,
                schema=pa.schema(list(fields.items())) if json_lines else None,
                key=id_column if json_lines else None,
                spread=spread,
                type_fix={
                    id_column: "pass --id_type string if the ids are strings"
                    if pa.types.is_integer(self._id_type)
                    else "pass --id_type int if the ids are integers",
                    text_column: "name the field of the texts with --text_column",
                },
                bad_lines="in_batches",  # a bad line in its part, with the rows around it
            ).with_exception_handling()
            batches, dead = pbegin | "Read" >> read
            batches = batches | "Keys" >> beam.ParDo(KeyBatches(inputs, self._done))
        if spread:
            # One file's parts spread over all workers, as a splittable source's would.
            batches = batches | "SpreadParts" >> beam.Reshuffle()
        return batches, dead
