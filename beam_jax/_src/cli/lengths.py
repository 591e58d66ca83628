"""A column's lengths from Parquet or JSON lines, read with pyarrow, as one numpy array.

List columns give their lengths, string columns their characters (or UTF-8 bytes), and
with a tokenizer their token counts. Lengths are computed by Arrow compute kernels on the
column's buffers; only token counts need the texts as Python strings, which the Rust
tokenizer takes a few thousand at a time.

Example:
    >>> column = read_column("data/*.parquet", "text")  # doctest: +SKIP
    >>> lengths = column_lengths(column, "chars")  # doctest: +SKIP
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.json as pj

from beam_jax._src.cli import registry

__all__ = ["MEASURES", "column_lengths", "read_column", "tokenizer_counts"]

MEASURES = ("auto", "list", "chars", "bytes", "tokens")
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz")
_TOKENIZE_ROWS = 4096  # texts handed to the tokenizer at once


def _paths(pattern: str) -> list[str]:
    if os.path.isdir(pattern):
        return [pattern]
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    if not paths or not all(os.path.exists(p) for p in paths):
        raise FileNotFoundError(f"--input {pattern!r} matches no file; give a path or a glob")
    return paths


def read_column(pattern: str, column: str) -> pa.ChunkedArray:
    """One column of every file ``pattern`` matches (a path, a glob or a Parquet directory).

    Raises:
        FileNotFoundError: If nothing matches.
        KeyError: If a file has no such column; the message lists the columns it has.
    """
    paths = _paths(pattern)
    if all(p.endswith(_JSON_SUFFIXES) for p in paths):
        chunks = []
        for path in paths:
            table = pj.read_json(path)
            if column not in table.column_names:
                raise KeyError(
                    f"{path} has no column {column!r}; it has {table.column_names}. "
                    "Pass one of them as --column"
                )
            chunks += table.column(column).chunks
        return pa.chunked_array(chunks) if chunks else pa.chunked_array([], pa.null())
    dataset = ds.dataset(paths if len(paths) > 1 else paths[0], format="parquet")
    if column not in dataset.schema.names:
        raise KeyError(
            f"{pattern} has no column {column!r}; it has {dataset.schema.names}. Pass one of "
            "them as --column"
        )
    return dataset.to_table(columns=[column]).column(column)


def tokenizer_counts(name: str) -> Callable[[list[str]], list[int]]:
    """Token counts per text: ``minilm`` or a sentence-transformers model directory (its
    tokenizer as ``beam_jax.text`` embeds texts: truncated at the model's max_seq_length,
    256 for MiniLM, with [CLS] and [SEP]), a ``tokenizer.json`` file (no truncation), a
    registered name (entry-point group ``beam_jax.tokenizers``) or ``module:attr``, a
    zero-argument callable returning ``texts -> counts``."""
    if name == "minilm" or os.path.isdir(name):
        from beam_jax._src.text.sentence_encoder import SentenceEncoder

        tokenizer = SentenceEncoder.from_dir(None if name == "minilm" else name).tokenizer()
        return lambda texts: tokenizer.encode_flat(texts)[1].tolist()
    if not os.path.isfile(name):
        builtins = "'minilm', a model directory, a tokenizer.json file"
        return registry.load(registry.TOKENIZERS, name, "--tokenizer", builtins)()
    import tokenizers

    rust = tokenizers.Tokenizer.from_file(name)
    rust.no_padding()
    rust.no_truncation()
    return lambda texts: [len(e.ids) for e in rust.encode_batch(texts)]


def column_lengths(
    column: pa.ChunkedArray, measure: str = "auto", tokenizer: str | None = None
) -> np.ndarray:
    """Each non-null value's length, as int64.

    Args:
        column: The column.
        measure: ``list`` (list columns), ``chars`` or ``bytes`` (strings), ``tokens``
            (strings, with ``tokenizer``), or ``auto``: list lengths for lists, token counts
            for strings if a tokenizer is given, characters otherwise.
        tokenizer: See :func:`tokenizer_counts`.

    Raises:
        ValueError: If the measure does not fit the column's type.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    kind = column.type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    is_list = is_list or pa.types.is_fixed_size_list(kind)
    is_text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if measure == "auto":
        measure = "list" if is_list else ("tokens" if tokenizer else "chars")
    if measure == "tokens" and tokenizer is None:
        raise ValueError(
            "--measure tokens needs --tokenizer (minilm, a model directory or a tokenizer.json)"
        )
    if (measure == "list" and not is_list) or (measure != "list" and not is_text):
        raise ValueError(
            f"the column is {kind}; --measure {measure} needs "
            f"{'a list' if measure == 'list' else 'a string'} column. Use --measure "
            f"{'list' if is_list else 'chars, bytes or tokens'}"
        )
    values = column.drop_null()
    if measure == "list":
        return pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    if measure == "chars":
        return pc.utf8_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    if measure == "bytes":
        return pc.binary_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    count = tokenizer_counts(tokenizer)
    out = np.empty(len(values), np.int64)
    for start in range(0, len(values), _TOKENIZE_ROWS):
        texts = values.slice(start, _TOKENIZE_ROWS).to_pylist()
        out[start : start + len(texts)] = count(texts)
    return out
