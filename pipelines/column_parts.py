"""The columnar path's rows by part: keys that say where a row came from, and writing parts.

Inside the columnar job (:mod:`pipelines.embed_columnar`) a row is known by its key,
``file_index << 40 | row``, an ``int64`` column that ``RunKernelOnArrow`` carries as the
rows' id; the input's ids travel beside the batches (:class:`PartIds`). Results and dead
letters are keyed by their part (:func:`results_by_part`, :func:`dead_by_part`) and meet
their part's ids in :class:`WritePartColumns`, which writes the same files as
``text_parts.WriteParts``.

Example:
    >>> split_keys(np.array([row_key(3, 17)]))
    (array([3]), array([17]))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

import beam_jax as bj
from pipelines import text_input as ti
from pipelines import text_parts as tp

__all__ = [
    "KEY",
    "OUTPUT",
    "PartIds",
    "WritePartColumns",
    "dead_by_part",
    "results_by_part",
    "row_key",
    "split_keys",
]

KEY = "key"
OUTPUT = "output"  # RunKernelOnArrow's column for a kernel returning one array
ROW_BITS = 40  # rows per file < 2**40; files < 2**23
ROW_MASK = (1 << ROW_BITS) - 1


def row_key(file_index: int, position: int) -> int:
    """A row's key in the job: which file, which row, in one ``int64``."""
    return file_index << ROW_BITS | position


def split_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(file_index, row)`` arrays of an array of keys."""
    keys = np.asarray(keys, np.int64)
    return keys >> ROW_BITS, keys & ROW_MASK


@dataclasses.dataclass(frozen=True)
class PartIds:
    """Rows of one part that one record batch holds: their positions and their ids as read."""

    positions: np.ndarray
    ids: pa.Array


def results_by_part(batch: pa.RecordBatch, part_rows: int) -> Iterator[Any]:
    """A result batch cut into ``((file_index, part_start), batch)``, one per part it holds."""
    files, rows = split_keys(batch.column(KEY).to_numpy())
    parts = rows // part_rows * part_rows
    if (files == files[0]).all() and (parts == parts[0]).all():
        yield (int(files[0]), int(parts[0])), batch
        return
    pairs, inverse = np.unique(np.stack([files, parts], 1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    for group, (file_index, start) in enumerate(pairs.tolist()):
        yield (file_index, start), batch.take(pa.array(np.flatnonzero(inverse == group)))


def dead_by_part(record: bj.FailedElement, part_rows: int) -> Any:
    """A dead letter keyed by its part, with its row: ``((file, start), (row, record))``."""
    file_index, position = record.key >> ROW_BITS, record.key & ROW_MASK
    return (file_index, position // part_rows * part_rows), (position, record)


class WritePartColumns(tp.WriteParts):
    """``((file_index, start), {"rows", "results", "dead"})`` in; the part's files written.

    As ``text_parts.WriteParts``, from record batches: the embeddings of a part are sorted
    by row and joined to their ids with numpy, and written with ``text_parts.write_part``.

    Args:
        directory: Where the parts go (the run's staging directory).
        inputs: The run's inputs, for file names.
        schema: The embeddings' Arrow schema.
    """

    def process(self, element: Any) -> Iterator[str]:
        (file_index, start), groups = element
        pieces: list[PartIds] = list(groups["rows"])
        positions = np.concatenate([p.positions for p in pieces])
        ids = pa.concat_arrays([p.ids for p in pieces])
        order = np.argsort(positions, kind="stable")
        positions, ids = positions[order], ids.take(pa.array(order))
        batches = [b for b in groups["results"] if b.num_rows]
        results = pa.Table.from_batches(batches).combine_chunks() if batches else None
        done = np.zeros(0, np.int64) if results is None else split_keys(results[KEY].to_numpy())[1]
        dead = sorted(groups["dead"], key=lambda r: r[0])
        covered = np.sort(np.concatenate([done, np.array([p for p, _ in dead], np.int64)]))
        if not np.array_equal(covered, positions):
            # Every row ends as one embedding or one dead letter; anything else is a bug,
            # and an incomplete part must not be written as if it were whole.
            raise RuntimeError(
                f"part {start} of file {file_index}: {len(positions)} rows but {len(done)} "
                f"embeddings and {len(dead)} dead letters"
            )
        table = self._schema.empty_table()
        if results is not None:
            by_row = np.argsort(done, kind="stable")
            index = np.searchsorted(positions, done[by_row])
            vectors = results[OUTPUT].chunk(0).take(pa.array(by_row))
            width = vectors.type.list_size
            offsets = pa.array(np.arange(0, (len(by_row) + 1) * width, width, dtype=np.int32))
            embedding = pa.ListArray.from_arrays(offsets, vectors.flatten())
            out_ids = ids.take(pa.array(index)).cast(self._schema.field("id").type)
            table = pa.Table.from_arrays([out_ids, embedding], schema=self._schema)
        dead_rows = []
        if dead:
            index = np.searchsorted(positions, [p for p, _ in dead])
            dead_ids, _ = ti.python_values(ids.take(pa.array(index)), "id")
            dead_rows = [(i, p, r) for i, (p, r) in zip(dead_ids, dead, strict=True)]
        end = int(positions[-1]) + 1
        name = tp.write_part(
            self._directory, self._inputs, (file_index, start, end), dead_rows, table
        )
        self._parts.inc()
        yield name
