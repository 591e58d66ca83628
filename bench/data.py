"""The benchmark's data: long-tailed (L, 64) float32 records, as a raw file and as Parquet.

Records are written once by the driver and read inside each pipeline (never pickled into
the pipeline graph): ``values.f32`` holds every record's rows back to back, ``offsets.npy``
where each record starts, and ``data.parquet`` the same records as ``id: int64`` plus
``x: list<float32>`` (the (L, 64) values row-major, a flat list per row).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DIM = 64
MAX_LEN = 512
ROW_GROUP_ROWS = 1024
_CHUNK = 4096  # records generated at a time, so generation memory stays flat


def sample_lengths(n: int, seed: int) -> np.ndarray:
    """Lengths in 1..512, log-normal (median 48, sigma 1.0): most short, a long tail."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(48), 1.0, n)), 1, MAX_LEN).astype(np.int64)


def generate(workdir: Path, n: int, seed: int) -> dict:
    """Write ``n`` records to ``workdir`` (reused if already there); returns the layout.

    ``data.parquet`` holds ``x`` as ``list<float32>``; ``data_binary.parquet`` holds the
    same values as ``binary`` (raw float32 bytes per row), the layout Parquet decodes at
    memory speed.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    done = workdir / "done.json"
    lengths = sample_lengths(n, seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    meta = {"n": n, "seed": seed, "tokens": int(offsets[-1]), "format": 3}
    if done.exists() and done.read_text() == repr(meta):
        return meta
    np.save(workdir / "lengths.npy", lengths)
    np.save(workdir / "offsets.npy", offsets)
    schema = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32()))])
    binary_schema = pa.schema([("id", pa.int64()), ("x", pa.binary())])
    # Random floats never dictionary-encode, and trying costs 2x at read time.
    options = dict(compression="none", use_dictionary=False, write_statistics=False)
    rng = np.random.default_rng(seed + 1)
    with (
        open(workdir / "values.f32", "wb") as raw,
        pq.ParquetWriter(workdir / "data.parquet", schema, **options) as writer,
        pq.ParquetWriter(workdir / "data_binary.parquet", binary_schema, **options) as bwriter,
    ):
        for lo in range(0, n, _CHUNK):
            hi = min(lo + _CHUNK, n)
            count = int(offsets[hi] - offsets[lo])
            values = rng.standard_normal(count * DIM, dtype=np.float32)
            raw.write(values.tobytes())
            rel = (offsets[lo : hi + 1] - offsets[lo]) * DIM
            column = pa.ListArray.from_arrays(pa.array(rel.astype(np.int32)), pa.array(values))
            table = pa.table({"id": pa.array(np.arange(lo, hi, dtype=np.int64)), "x": column})
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            column = pa.Array.from_buffers(
                pa.binary(),
                hi - lo,
                [None, pa.py_buffer((rel * 4).astype(np.int32)), pa.py_buffer(values)],
            )
            table = pa.table({"id": table.column("id"), "x": column})
            bwriter.write_table(table, row_group_size=ROW_GROUP_ROWS)
    done.write_text(repr(meta))
    return meta


class RecordReader:
    """Reads record ``i`` as a float32 ``(L, 64)`` array with one ``pread`` (no mmap, so
    the file's pages never count towards the process's resident memory)."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self._fd = None

    def open(self):
        self._offsets = np.load(os.path.join(self.workdir, "offsets.npy"))
        self._fd = os.open(os.path.join(self.workdir, "values.f32"), os.O_RDONLY)

    def read(self, i: int) -> np.ndarray:
        if self._fd is None:
            self.open()
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        buf = os.pread(self._fd, (hi - lo) * DIM * 4, lo * DIM * 4)
        return np.frombuffer(buf, np.float32).reshape(hi - lo, DIM)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
