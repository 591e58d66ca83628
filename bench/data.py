"""The benchmark's data: long-tailed (L, 64) float32 records, as a raw file and as Parquet.

Records are written once by the driver and read inside each pipeline (never pickled into
the pipeline graph): ``values.f32`` holds every record's rows back to back, ``offsets.npy``
where each record starts, and ``data.parquet`` the same records as ``id: int64`` plus
``x: list<float32>`` (the (L, 64) values row-major, a flat list per row).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DIM = 64
MAX_LEN = 512
ROW_GROUP_ROWS = 1024
_CHUNK = 32768  # records generated at a time (~160 MB of values): memory stays flat


def sample_lengths(n: int, seed: int) -> np.ndarray:
    """Lengths in 1..512, log-normal (median 48, sigma 1.0): most short, a long tail."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(48), 1.0, n)), 1, MAX_LEN).astype(np.int64)


FILES = ("values.f32", "data.parquet", "data_binary.parquet")


def generate(workdir: Path, n: int, seed: int, files: tuple[str, ...] = FILES) -> dict:
    """Write ``n`` records to ``workdir`` (each file reused if already there); returns the
    layout.

    ``values.f32`` holds the raw rows; ``data.parquet`` holds ``x`` as ``list<float32>``;
    ``data_binary.parquet`` the same values as ``binary`` (raw float32 bytes per row), the
    layout Parquet decodes at memory speed. Only ``files`` are written (200,000 records
    are ~3.9 GB per file: a run writes the ones its variants read). The values are drawn in
    large vectorised chunks from one seeded generator, so every file holds the same ones.
    """
    unknown = set(files) - set(FILES)
    if unknown:
        raise ValueError(f"unknown data files {sorted(unknown)}; expected some of {FILES}")
    workdir.mkdir(parents=True, exist_ok=True)
    lengths = sample_lengths(n, seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    meta = {"n": n, "seed": seed, "tokens": int(offsets[-1]), "format": 4}
    todo = [f for f in files if not _done(workdir, f, meta)]
    if not todo:
        return meta
    np.save(workdir / "lengths.npy", lengths)
    np.save(workdir / "offsets.npy", offsets)
    for f in todo:
        (workdir / f"{f}.done").unlink(missing_ok=True)
    schema = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32()))])
    binary_schema = pa.schema([("id", pa.int64()), ("x", pa.binary())])
    # Random floats never dictionary-encode, and trying costs 2x at read time.
    options = dict(compression="none", use_dictionary=False, write_statistics=False)
    rng = np.random.default_rng(seed + 1)
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(open(workdir / "values.f32", "wb")) if FILES[0] in todo else None
        writer = bwriter = None
        if FILES[1] in todo:
            writer = stack.enter_context(pq.ParquetWriter(workdir / FILES[1], schema, **options))
        if FILES[2] in todo:
            bwriter = stack.enter_context(
                pq.ParquetWriter(workdir / FILES[2], binary_schema, **options)
            )
        for lo in range(0, n, _CHUNK):
            hi = min(lo + _CHUNK, n)
            count = int(offsets[hi] - offsets[lo])
            values = rng.standard_normal(count * DIM, dtype=np.float32)
            if raw is not None:
                values.tofile(raw)
            rel = ((offsets[lo : hi + 1] - offsets[lo]) * DIM).astype(np.int32)
            ids = pa.array(np.arange(lo, hi, dtype=np.int64))
            if writer is not None:
                column = pa.ListArray.from_arrays(pa.array(rel), pa.array(values))
                writer.write_table(pa.table({"id": ids, "x": column}), ROW_GROUP_ROWS)
            if bwriter is not None:
                column = pa.Array.from_buffers(
                    pa.binary(), hi - lo, [None, pa.py_buffer(rel * 4), pa.py_buffer(values)]
                )
                bwriter.write_table(pa.table({"id": ids, "x": column}), ROW_GROUP_ROWS)
    for f in todo:
        (workdir / f"{f}.done").write_text(repr(meta))
    return meta


def _done(workdir: Path, file: str, meta: dict) -> bool:
    """Whether ``file`` was completed with this layout (its stamp is written last)."""
    stamp = workdir / f"{file}.done"
    return stamp.exists() and stamp.read_text() == repr(meta)


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


def warm(path: str) -> None:
    """Read ``path`` once so every variant starts with it in the page cache.

    The variants that read records inside the clock would otherwise depend on what earlier
    runs (``limit`` holds ~25 KB per record) evicted; disk speed is not what is measured.
    """
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 23):
            pass
