"""The I/O bounds of bench/run.py's variants: each input file read and decoded as its
variants read it, with no Beam, no kernel and no output."""

from __future__ import annotations

import os

import numpy as np
from data import RecordReader, warm
from harness import Clock


def run_read_only(kernel: str, cfg: dict, file: str = "data.parquet") -> dict:
    """The I/O bound of the Arrow variants: the Parquet file read and decoded by pyarrow.

    Row group by row group, as ``ReadArrowBatches`` reads it (the file memory-mapped for
    each read, its footer parsed once), the ``x`` column becomes its flat values and int
    offsets (``list<float32>``: the float values; ``binary``: the raw bytes), and ``id`` an
    int array: what any reader must do before a kernel sees the data. No Beam, no kernel,
    no output.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(cfg["workdir"], file)
    warm(path)
    start = Clock()
    metadata = pq.ParquetFile(path).metadata
    rows = 0
    for i in range(metadata.num_row_groups):
        with pa.memory_map(path) as mapped:
            f = pq.ParquetFile(mapped, metadata=metadata)
            table = f.read_row_group(i, columns=["id", "x"])
        for chunk in table.column("x").chunks:
            if hasattr(chunk, "values"):  # list<float32>
                values = chunk.values.to_numpy(zero_copy_only=False)
                offsets, size = np.asarray(chunk.offsets), len(values)
            else:  # binary: the buffers, viewed as int32 offsets and float32 values
                _, offs, data = chunk.buffers()
                lo = chunk.offset
                offsets = np.frombuffer(offs, np.int32)[lo : lo + len(chunk) + 1]
                values = np.frombuffer(data, np.float32)
                size = len(values) * 4
            assert size >= offsets[-1] - offsets[0]
        rows += len(table.column("id").to_numpy())
    times = start.stop()
    if rows != cfg["n"]:
        raise RuntimeError(f"read {rows} rows, expected {cfg['n']}")
    return {**times, "compiles": 0, "padding_ratio": 1.0}  # nothing padded


def run_read_only_binary(kernel: str, cfg: dict) -> dict:
    """The I/O bound of ``beam_jax_arrow_binary``: ``data_binary.parquet`` (``x: binary``)."""
    return run_read_only(kernel, cfg, "data_binary.parquet")


def run_read_only_raw(kernel: str, cfg: dict) -> dict:
    """The I/O bound of the variants that ``pread`` each record from ``values.f32``.

    The same ``RecordReader.read`` call per record as their ``ReadRecord`` DoFn, in a plain
    loop: no Beam, no kernel, no output.
    """
    warm(os.path.join(cfg["workdir"], "values.f32"))
    reader = RecordReader(cfg["workdir"])
    reader.open()
    start = Clock()
    rows = sum(len(reader.read(i)) > 0 for i in range(cfg["n"]))
    times = start.stop()
    reader.close()
    if rows != cfg["n"]:
        raise RuntimeError(f"read {rows} records, expected {cfg['n']}")
    return {**times, "compiles": 0, "padding_ratio": 1.0}
