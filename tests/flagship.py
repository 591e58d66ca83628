"""Helpers for the tests of the flagship (pipelines/embed): run it on files, read what it wrote."""

from __future__ import annotations

import glob
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.embed import job as embed_text


def texts(n: int, start: int = 0) -> list[str]:
    """Short distinct English texts, all in the smallest bucket (few compiles)."""
    return [f"Row {i} is a short sentence about the pipeline." for i in range(start, start + n)]


def run(source, out: pathlib.Path, *flags: str):
    """``embed_text.run`` on the FnApiRunner; returns its summary."""
    argv = ["--input", str(source), "--output", str(out), "--runner=FnApiRunner", *flags]
    return embed_text.run(argv)


def read_outputs(out: pathlib.Path) -> tuple[pa.Table, list[dict]]:
    """The embeddings (all parts, concatenated) and the dead letters under ``out``, each
    with ``id``, ``file``, ``row`` and ``error`` (``TYPE: MESSAGE``) whichever way the
    lines name them (``key``, ``source``: the ``FailedElement`` fields)."""
    files = sorted(glob.glob(str(out / "embeddings-*.parquet")))
    table = pa.concat_tables(pq.read_table(f) for f in files) if files else None
    failed = []
    for path in sorted(glob.glob(str(out / "_failed" / "*.jsonl"))):
        failed += [_where(json.loads(line)) for line in pathlib.Path(path).read_text().splitlines()]
    return table, failed


def _where(line: dict) -> dict:
    names = {"id": line.get("key"), "file": line.get("source")}
    error = f"{line['error_type']}: {line['message']}"
    return {**names, "error": error, **line}


def dead_letter_lines(out: pathlib.Path) -> list[str]:
    """Every line of every dead-letter file under ``out``."""
    paths = sorted(glob.glob(str(out / "_failed" / "*.jsonl")))
    return [line for p in paths for line in pathlib.Path(p).read_text().splitlines()]


def ids(table: pa.Table | None) -> list:
    return [] if table is None else table.column("id").to_pylist()


def write_json_lines(path: pathlib.Path, rows: list) -> pathlib.Path:
    """Each row as a JSON line (``bytes`` rows are written as they are)."""
    lines = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def reference_embeddings(pairs: dict) -> dict:
    """``{id: float32[384]}``: each text embedded alone by the packaged encoder's kernel,
    unpadded, outside Beam (the reference the Beam front ends must reproduce)."""
    import numpy as np

    from beam_jax.text import SentenceEncoder

    encoder = SentenceEncoder.from_dir()
    params = encoder.load_params()
    ids, failures = encoder.tokenizer().encode_arrow(pa.array(list(pairs.values())))
    assert not failures, failures
    out = {}
    for key, tokens in zip(pairs, ids.to_pylist(), strict=True):
        element = {"input_ids": np.asarray(tokens, np.int32)}
        out[key] = np.asarray(encoder.element_fn(params, element, {"L": np.int32(len(tokens))}))
    return out
