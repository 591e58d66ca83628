"""``bench/run.py``'s data and kernels: long-tailed ``(L, 64)`` float32 records, as a raw
file and as Parquet, and two kernels per record, masked so padding never changes the answer.

Records are written once by the driver and read inside each pipeline (never pickled into
the pipeline graph): ``values.f32`` holds every record's rows back to back, ``offsets.npy``
where each record starts, ``data.parquet`` the same records as ``id: int64`` plus
``x: list<float32>`` (the values row-major, a flat list per row) and ``data_binary.parquet``
as ``x: binary`` (raw float32 bytes per row, the layout Parquet decodes at memory speed).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import beam_jax as bj

DIM = 64
HIDDEN = 256
MAX_LEN = 512
ROW_GROUP_ROWS = 1024
_CHUNK = 32768  # records generated at a time (~160 MB of values): memory stays flat
FILES = ("values.f32", "data.parquet", "data_binary.parquet")


def sample_lengths(n: int, seed: int) -> np.ndarray:
    """Lengths in 1..512, log-normal (median 48, sigma 1.0): most short, a long tail."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(48), 1.0, n)), 1, MAX_LEN).astype(np.int64)


def generate(workdir: Path, n: int, seed: int, files: tuple[str, ...] = FILES) -> dict:
    """Writes ``n`` records to ``workdir`` (each of ``files`` reused if already there, with
    the same layout: 200,000 records are ~3.9 GB per file); returns the layout. The values
    come in vectorised chunks from one seeded generator, so every file holds the same ones."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    unknown = sorted(set(files) - set(FILES))
    if unknown:
        raise ValueError(f"unknown data files {unknown}; expected some of {FILES}")
    workdir.mkdir(parents=True, exist_ok=True)
    lengths = sample_lengths(n, seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    meta = {"n": n, "seed": seed, "tokens": int(offsets[-1]), "format": 4}
    todo = [f for f in files if _stamp(workdir, f) != repr(meta)]
    if not todo:
        return meta
    np.save(workdir / "lengths.npy", lengths)
    np.save(workdir / "offsets.npy", offsets)
    for f in todo:
        (workdir / f"{f}.done").unlink(missing_ok=True)
    # Random floats never dictionary-encode, and trying costs 2x at read time.
    options = dict(compression="none", use_dictionary=False, write_statistics=False)
    types = {FILES[1]: pa.list_(pa.float32()), FILES[2]: pa.binary()}
    rng = np.random.default_rng(seed + 1)
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(open(workdir / FILES[0], "wb")) if FILES[0] in todo else None
        writers = {
            f: stack.enter_context(
                pq.ParquetWriter(workdir / f, pa.schema([("id", pa.int64()), ("x", t)]), **options)
            )
            for f, t in types.items()
            if f in todo
        }
        for lo in range(0, n, _CHUNK):
            hi = min(lo + _CHUNK, n)
            values = rng.standard_normal(int(offsets[hi] - offsets[lo]) * DIM, dtype=np.float32)
            if raw is not None:
                values.tofile(raw)
            rel = ((offsets[lo : hi + 1] - offsets[lo]) * DIM).astype(np.int32)
            ids = pa.array(np.arange(lo, hi, dtype=np.int64))
            for f, writer in writers.items():
                if f == FILES[1]:
                    x = pa.ListArray.from_arrays(pa.array(rel), pa.array(values))
                else:
                    buffers = [None, pa.py_buffer(rel * 4), pa.py_buffer(values)]
                    x = pa.Array.from_buffers(pa.binary(), hi - lo, buffers)
                writer.write_table(pa.table({"id": ids, "x": x}), ROW_GROUP_ROWS)
    for f in todo:
        (workdir / f"{f}.done").write_text(repr(meta))  # the stamp is written last
    return meta


def _stamp(workdir: Path, file: str) -> str | None:
    stamp = workdir / f"{file}.done"
    return stamp.read_text() if stamp.exists() else None


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
    """Reads ``path`` once so every variant starts with it in the page cache: disk speed
    (and what earlier runs evicted) is not what is measured."""
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 23):
            pass


# --- the kernels ----------------------------------------------------------------------------


def load_params(seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    shapes = {"wq": (DIM, DIM), "wk": (DIM, DIM), "wv": (DIM, DIM), "wo": (DIM, DIM),
              "w1": (DIM, HIDDEN), "w2": (HIDDEN, DIM), "proj": (DIM, DIM)}  # fmt: skip
    return {name: w(*shape) for name, shape in shapes.items()}


def _masked_mean(h, mask, length):
    total = jnp.sum(jnp.where(mask[:, None], h, 0.0), axis=0)
    return total / jnp.maximum(length, 1).astype(jnp.float32)


def heavy(params, element, lengths):
    """Masked single-head self-attention + MLP (64 -> 256 -> 64) + masked mean-pool."""
    x = element["x"]
    mask = bj.length_mask(lengths["L"], x.shape[0])
    q, k, v = x @ params["wq"], x @ params["wk"], x @ params["wv"]
    scores = jnp.where(mask[None, :], (q @ k.T) / jnp.float32(np.sqrt(DIM)), jnp.float32(-1e9))
    h = x + jax.nn.softmax(scores, axis=-1) @ v @ params["wo"]
    h = h + jax.nn.gelu(h @ params["w1"]) @ params["w2"]
    return _masked_mean(h, mask, lengths["L"])


def light(params, element, lengths):
    """Masked mean-pool + one (64, 64) matmul."""
    x = element["x"]
    mask = bj.length_mask(lengths["L"], x.shape[0])
    return _masked_mean(x, mask, lengths["L"]) @ params["proj"]


KERNELS = {"heavy": heavy, "light": light}


def model_flops(kernel: str, lengths: np.ndarray) -> float:
    """Useful floating-point operations over records of these lengths (padding excluded):
    matmuls count ``2 m n k``; the element-wise work (softmax, gelu, pooling) is left out
    for ``heavy``, where it is under 2% of the total."""
    n = np.asarray(lengths, np.float64)
    if kernel == "heavy":
        # q, k, v, wo: 4 x (2 L 64 64); scores and attention: 2 x (2 L L 64); MLP: 2 x (2 L 64 256)
        return float(np.sum(8 * DIM * DIM * n + 4 * DIM * n * n + 4 * DIM * HIDDEN * n))
    if kernel == "light":
        return float(np.sum(DIM * n + 2 * DIM * DIM))  # the pooling adds and one matvec
    raise ValueError(f"unknown kernel {kernel!r}; expected one of {sorted(KERNELS)}")
