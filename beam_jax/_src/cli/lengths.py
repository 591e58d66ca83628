"""A column's lengths from Parquet or JSON lines, read with pyarrow, as one numpy array.

List columns give their lengths, text columns (strings, or bytes holding UTF-8, read
alike) their characters (or UTF-8 bytes), and with a tokenizer their token counts. JSON
lines are read as the jobs read them: a line that is not a row is skipped and counted.
Lengths are computed by Arrow compute kernels on the column's buffers; only token counts
need the texts as Python strings, which the Rust tokenizer takes a few thousand at a time.

Example:
    >>> column, skipped = read_column("data/*.parquet", "text")  # doctest: +SKIP
    >>> lengths = column_lengths(column, "chars")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from beam_jax._src.arrow.json_lines import (
    BOM,
    SAMPLE_LINES,
    BadLine,
    FileCut,
    infer_schema,
    open_stream,
    read_json_lines,
)
from beam_jax._src.arrow.texts import is_text_type, utf8_texts
from beam_jax._src.cli import registry
from beam_jax._src.core.wording import counted
from beam_jax._src.errors import SpecError

__all__ = ["MEASURES", "Skipped", "column_lengths", "read_column", "tokenizer_counts"]

MEASURES = ("auto", "list", "chars", "bytes", "tokens")
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz")
_TOKENIZE_ROWS = 4096  # texts handed to the tokenizer at once


def _paths(pattern: str) -> list[str]:
    if os.path.isdir(pattern):
        return [pattern]
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    paths = paths or glob.glob(glob.escape(pattern))  # a name such as 'a [v1].jsonl'
    if not paths or not all(os.path.exists(p) for p in paths):
        raise FileNotFoundError(f"--input {pattern!r} matches no file; give a path or a glob")
    return paths


@dataclasses.dataclass(frozen=True)
class Skipped:
    """JSON lines that are not rows of the column, skipped as the jobs dead-letter them.

    Attributes:
        lines: How many.
        first: The first one: ``LINE of PATH: why`` (``LINE`` from 1, as editors count).
        files_cut: Files whose reading stopped part-way: ``PATH: why``.
    """

    lines: int = 0
    first: str | None = None
    files_cut: tuple[str, ...] = ()

    def __str__(self) -> str:
        said = []
        if self.lines:
            lines = counted(self.lines, "line")
            verb = "is" if self.lines == 1 else "are"
            said.append(f"skipped {lines} that {verb} no row (the first: line {self.first})")
        if self.files_cut:
            said.append(f"stopped reading {'; '.join(self.files_cut)}")
        return "; ".join(said)


def _json_lines_column(paths: Sequence[str], column: str) -> tuple[pa.ChunkedArray, Skipped]:
    """One column of JSON-lines files, read as the jobs read them (``read_json_lines``):
    a line that is not an object with the column's type is skipped and counted."""
    try:
        schema = infer_schema(paths, [column])
    except SpecError:  # the sampled lines disagree: the first line's type, others skipped
        schema = infer_schema(paths, [column], lines=1)
    chunks: list[pa.Array] = []
    bad, first, cut, fields = 0, None, [], {}
    for path in paths:
        with contextlib.ExitStack() as stack:
            try:
                for item in read_json_lines(open_stream(path, stack), schema):
                    if isinstance(item, BadLine):
                        bad += 1
                        first = first or f"{item.line + 1} of {path}: {item.message}"
                    elif item.batch.num_rows:
                        chunks.append(item.batch.column(0))
            except FileCut as e:
                cut.append(f"{path} at line {e.line + 1} ({e})")
            except OSError as e:
                raise FileNotFoundError(f"{path} cannot be read: {e}") from e
        fields.update(dict.fromkeys(_fields(path)))
    if column not in fields:
        where = paths[0] if len(paths) == 1 else f"each of the {len(paths)} files"
        raise KeyError(
            f"{where} has no column {column!r}; it has {list(fields)}. Pass one of them as --column"
        )
    kind = schema.field(0).type
    return pa.chunked_array(chunks, kind), Skipped(bad, first, tuple(cut))


def _fields(path: str) -> list[str]:
    """The fields of the first JSON objects of ``path`` (its first lines), in order."""
    names: dict[str, None] = {}
    with contextlib.ExitStack() as stack:
        stream = open_stream(path, stack)
        for number, raw in enumerate(iter(stream.readline, b"")):
            if number >= SAMPLE_LINES:
                break
            try:
                value = json.loads(raw.removeprefix(BOM))
            except ValueError:
                continue
            names.update(dict.fromkeys(value) if isinstance(value, dict) else {})
    return list(names)


def read_column(pattern: str, column: str) -> tuple[pa.ChunkedArray, Skipped]:
    """One column of every file ``pattern`` matches (a path, a glob or a Parquet directory),
    and the JSON lines skipped for not being rows of it.

    Raises:
        FileNotFoundError: If nothing matches.
        KeyError: If a file has no such column; the message lists the columns it has.
    """
    paths = _paths(pattern)
    if all(p.endswith(_JSON_SUFFIXES) for p in paths):
        return _json_lines_column(paths, column)
    dataset = ds.dataset(paths if len(paths) > 1 else paths[0], format="parquet")
    if column not in dataset.schema.names:
        raise KeyError(
            f"{pattern} has no column {column!r}; it has {dataset.schema.names}. Pass one of "
            "them as --column"
        )
    return dataset.to_table(columns=[column]).column(column), Skipped()


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
        ValueError: If the column is neither a list nor a string column, or the measure
            does not fit its type.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    kind = column.type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    is_list = is_list or pa.types.is_fixed_size_list(kind)
    is_text = is_text_type(kind)  # strings, or bytes holding UTF-8
    if not is_list and not is_text:
        raise ValueError(
            f"the column is {kind}, which has no lengths to measure: plan measures a list "
            "column (--measure list: its lists' lengths) or a string column (--measure "
            "chars, bytes or tokens: its texts'); pass such a column with --column"
        )
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
    if measure == "bytes":
        return pc.binary_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    values, _ = utf8_texts(values)  # a binary column's texts as strings (the jobs' rows)
    if measure == "chars":
        return pc.utf8_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    count = tokenizer_counts(tokenizer)
    out = np.empty(len(values), np.int64)
    for start in range(0, len(values), _TOKENIZE_ROWS):
        texts = values.slice(start, _TOKENIZE_ROWS).to_pylist()
        out[start : start + len(texts)] = count(texts)
    return out
