"""The flagship's packed batches without Beam: what ``bench/encoder.py --flagship`` runs.

:func:`flagship_packing` asks the flagship's launch plan which packing it would choose for
some texts on this machine; :func:`flagship_batches` packs token ids with it as the
flagship's parts pack them, into the batches its kernel would see; :func:`host_busy`
keeps threads doing the job's tokenizing or writing beside them.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import threading

import numpy as np


def flagship_packing(texts: list[str]) -> dict:
    """The packing the flagship plans for ``texts`` on this machine (its launch plan:
    ``pipelines.embed.plan.plan_for`` with the flagship's default flags, the texts as its
    Parquet input), as JSON."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_jax.jobs import local_platform
    from beam_jax.text import SentenceEncoder
    from pipelines.embed import plan
    from pipelines.embed.flags import parse_args
    from pipelines.embed.parts import Inputs

    work = tempfile.mkdtemp(prefix="bench_encoder_plan_")
    table = pa.table({"id": pa.array(range(len(texts)), pa.int64()), "text": texts})
    pq.write_table(table, f"{work}/texts.parquet")
    args, _ = parse_args(["--input", f"{work}/texts.parquet", "--output", f"{work}/out"])
    model = SentenceEncoder.from_dir(matmuls=args.matmuls)
    launch = plan.plan_for(args, Inputs.from_args(args), local_platform().device_count, model)
    if launch.packing is None:
        raise SystemExit(f"--flagship: the flagship chose {launch.batching} here, not packing")
    packing = launch.packing.packing
    return {
        "row_lengths": list(packing.row_lengths),
        "rows_per_batch": {str(k): list(v) for k, v in packing.rows_per_batch.items()},
        "max_segments": int(packing.max_segments),
        "algorithm": packing.algorithm,
        "pack_lengths": list(packing.pack_lengths),
        "buffer_size": launch.packing.buffer_size,
        "matmuls": model.resolved_matmuls(),
    }


def flagship_batches(ids: list, plan: dict) -> list:
    """The flagship's packed batches for ``ids``: ``packed_batches``' tuples, packed with
    the plan's ``Packing`` ``buffer_size`` texts at a time (as its parts are), per row length
    full batches of the largest size and the rest in the smallest size that holds it."""
    from beam_jax import Packing
    from beam_jax._src.bucketing.packing import assign_rows

    packing = Packing(
        row_lengths=tuple(plan["row_lengths"]),
        rows_per_batch={int(k): tuple(v) for k, v in plan["rows_per_batch"].items()},
        max_segments=plan["max_segments"],
        algorithm=plan["algorithm"],
        pack_lengths=tuple(plan["pack_lengths"]),
    )
    lengths = np.array([len(x) for x in ids])
    step = plan["buffer_size"] or len(ids)
    rows: list[tuple[int, list]] = []
    for first in range(0, len(ids), step):
        a = assign_rows(lengths[first : first + step], packing)
        if len(a.refused):
            raise ValueError(f"{len(a.refused)} texts longer than the longest row")
        rows += rows_of(a, first)
    out = []
    for width in packing.row_lengths:
        members = [m for w, m in rows if w == width]
        sizes = packing.sizes_for(width)
        for start in range(0, len(members), sizes[-1]):
            chunk = members[start : start + sizes[-1]]
            n = next(size for size in sizes if size >= len(chunk))
            out.append(packed_arrays(ids, chunk, n, width, packing.max_segments))
    return out


def rows_of(assignment, first: int = 0) -> list[tuple[int, list]]:
    """``[(row length, [text indices])]`` per row of an ``assign_rows`` result, each row's
    texts in segment order, their indices offset by ``first``."""
    rows: list[tuple[int, list]] = [(int(w), []) for w in assignment.row_lengths]
    for i in np.lexsort((assignment.segment, assignment.row)):
        rows[int(assignment.row[i])][1].append(first + int(i))
    return rows


def packed_arrays(ids: list, chunk: list, n: int, width: int, segments: int) -> tuple:
    """One batch of ``n`` rows of ``width`` slots holding ``chunk``'s rows of texts:
    ``(ids[n, width], seg[n, width], pos[n, width], counts[n], seg_lengths[n, segments],
    chunk)``; rows past the chunk are empty."""
    tok = np.zeros((n, width), np.int32)
    seg, pos = np.zeros_like(tok), np.zeros_like(tok)
    counts = np.zeros(n, np.int32)
    seg_lengths = np.zeros((n, segments), np.int32)
    for r, texts in enumerate(chunk):
        at = 0
        for k, i in enumerate(texts):
            m = len(ids[i])
            tok[r, at : at + m], seg[r, at : at + m] = ids[i], k + 1
            pos[r, at : at + m], seg_lengths[r, k] = np.arange(m), m
            at += m
        counts[r] = len(texts)
    return tok, seg, pos, counts, seg_lengths, chunk


@contextlib.contextmanager
def host_busy(kind: str | None, tokenizer, texts: list[str] | None, threads: int):
    """``threads`` threads doing the job's host work over and over while the block runs:
    ``"tokenize"`` one part (8,192) of ``texts`` (``Tokenizer.encode_arrow``), or
    ``"write"`` a Parquet file of that many 384-float embeddings (the job's own writer,
    ``pipelines.embed.write.write_embeddings``)."""
    import pyarrow as pa

    from pipelines.embed import write as job_write

    stop = threading.Event()
    work = tempfile.TemporaryDirectory(prefix="bench_host_busy_")

    def tokenize() -> None:
        part = pa.array(texts[:8192], pa.large_string())
        while True:  # once at least, however soon the block ends
            tokenizer.encode_arrow(part)
            if stop.is_set():
                return

    def write(i: int) -> None:
        vectors = np.random.default_rng(i).standard_normal((8192, 384), dtype=np.float32)
        schema = job_write.embeddings_schema(pa.int64())
        table = job_write.embeddings_table(pa.array(np.arange(8192)), vectors, schema)
        while True:
            job_write.write_embeddings(table, f"{work.name}/{i}.parquet")
            if stop.is_set():
                return

    targets = [
        tokenize if kind == "tokenize" else functools.partial(write, i) for i in range(threads)
    ]
    workers = [threading.Thread(target=t, daemon=True) for t in targets]
    for w in workers:
        w.start()
    try:
        yield
    finally:
        stop.set()
        for w in workers:
            w.join()
        work.cleanup()
