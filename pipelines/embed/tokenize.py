"""One tokenize step per part: a record batch of ``key``, ``id``, ``text`` in, token ids out,
with one tokenizer call per batch (``Tokenizer.encode_arrow``); a bad row is a dead
letter at stage ``validation`` or ``tokenize`` (docs/embed_text.md).

Example:
    >>> tokens = batches | beam.ParDo(TokenizeParts(id_type)).with_outputs(  # doctest: +SKIP
    ...     PARTS, bj.DEAD_LETTERS, main="tokens")
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

import beam_jax as bj
from beam_jax.text import TextTooLongError
from pipelines import text_rows as tr
from pipelines.embed.parts import KEY, Part, python_values, split_keys

__all__ = [
    "INPUT_IDS",
    "METRICS_NAMESPACE",
    "PARTS",
    "THREADS",
    "TOKENIZE",
    "TokenizeParts",
]

INPUT_IDS = "input_ids"
PARTS = "parts"
TOKENIZE = "tokenize"
METRICS_NAMESPACE = "embed_text"
THREADS = "beam_jax-tokenize"  # the names of the tokenizer's threads start so
_WINDOW, _TIMESTAMP = beam.DoFn.WindowParam, beam.DoFn.TimestampParam


def _valid_strings(column: pa.Array) -> bool:
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return False
    try:
        column.validate(full=True)  # checks the UTF-8 of every value (SIMD, ~GB/s)
    except pa.ArrowInvalid:
        return False
    return True


class TokenizeParts(beam.DoFn):
    """Checks and tokenizes a record batch of ``key``, ``id``, ``text`` (one part).

    Outputs: the part's :class:`Part` (``"parts"``, first); a record batch of ``key`` and
    ``input_ids`` (``list<int32>``) for the good rows (main); one ``FailedElement`` per bad
    row (``"dead_letters"``), keyed by the row's key, its ``source`` and ``row`` where it
    was read. A batch's tokens (and its tokenizer's dead letters) come out while a later
    batch is processed, or when the bundle finishes: the tokenizer works up to two batches
    ahead in a background thread (``beam_jax.WorkAhead``). Where the batch's columns have the run's
    types and valid UTF-8 (the usual case), only nulls are looked for; otherwise the batch
    is checked value by value.

    Args:
        id_type: The Arrow type every id must have.
        encoder: The model (a ``beam_jax.text.SentenceEncoder``): its tokenizer.
        files: Each input file's name, for dead letters' ``source``.
        text_column: The input's name of the text, for messages.
    """

    def __init__(self, id_type: pa.DataType, encoder, files=(), text_column: str = "text"):
        # Two ahead: the tokenizer keeps working while the kernel or the writer holds up a
        # batch (measured 1.04x the host-only throughput of one ahead; three: no faster).
        self._ahead = bj.WorkAhead(THREADS, depth=2)
        self._id_type = tr.IdType(id_type)
        self._encoder = encoder
        self._files = tuple(files)
        self._text = text_column

    def setup(self):
        self._tokenizer = self._encoder.tokenizer()
        counter = functools.partial(beam.metrics.Metrics.counter, METRICS_NAMESPACE)
        self._rows = counter("rows")
        self._rejected = {s: counter(f"dead_letters_{s}") for s in (bj.Stage.VALIDATION, TOKENIZE)}
        self._ahead.setup()

    def start_bundle(self):
        self._ahead.start_bundle()

    def finish_bundle(self):
        yield from self._ahead.finish_bundle()

    def teardown(self):
        self._ahead.teardown()

    def process(self, batch: pa.RecordBatch, window=_WINDOW, timestamp=_TIMESTAMP) -> Iterator[Any]:
        self._rows.inc(batch.num_rows)
        keys, ids, text = batch.column(KEY), batch.column("id"), batch.column("text")
        files, positions = split_keys(keys.to_numpy())
        yield beam.pvalue.TaggedOutput(PARTS, Part(int(files[0]), positions, ids))
        typed = ids.type == self._id_type.arrow_type and _valid_strings(text)
        if typed and (pa.types.is_integer(ids.type) or _valid_strings(ids)):
            problems = self._null_problems(ids, text)
        else:
            problems, values = self._row_problems(ids, text)
            text = pa.array(
                [None if r in problems else v for r, v in enumerate(values)], pa.string()
            )
        for row, (problem, value) in problems.items():
            error = bj.InvalidElementError(problem)
            yield self._dead(error, bj.Stage.VALIDATION, keys[row].as_py(), value)
        rows = np.flatnonzero(~np.isin(np.arange(batch.num_rows), list(problems)))
        if not len(rows):
            return
        whole = len(rows) == batch.num_rows
        texts = text if whole else text.take(pa.array(rows))
        keys = keys if whole else keys.take(pa.array(rows))
        # The tokenizer's numpy and Rust work release the GIL: later batches tokenize in
        # the background while this one's tokens go on to the kernel and the writer.
        work = functools.partial(self._tokenizer.encode_arrow, texts)
        then = functools.partial(self._tokens, keys, texts)
        yield from self._ahead.submit(work, then, window, timestamp)

    def _tokens(self, keys: pa.Array, texts: pa.Array, tokenized) -> Iterator[Any]:
        """The good rows' token ids (a record batch of ``key`` and ``input_ids``), and a dead
        letter for each text the tokenizer failed."""
        input_ids, failures = tokenized
        for j, error in failures.items():
            # A text that is not Unicode is the data's fault; one the tokenizer cannot cut
            # or rejects is the tokenizer's.
            bad_text = isinstance(error, bj.InvalidElementError)
            too_long = isinstance(error, TextTooLongError)
            stage = TOKENIZE if too_long or not bad_text else bj.Stage.VALIDATION
            yield self._dead(error, stage, keys[j].as_py(), texts[j].as_py())
        out = pa.RecordBatch.from_arrays([keys, input_ids], names=[KEY, INPUT_IDS])
        if failures:
            out = out.filter(input_ids.is_valid())
        if out.num_rows:
            yield out

    def _null_problems(self, ids: pa.Array, text: pa.Array) -> dict[int, tuple[str, Any]]:
        """The rows with a null id or text (the only problems a typed, valid batch can have)."""
        if not ids.null_count and not text.null_count:
            return {}
        null = ids.is_null().to_numpy(zero_copy_only=False)
        null |= text.is_null().to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(null).tolist()
        return {r: (self._problem(ids[r].as_py(), text[r].as_py()), text[r].as_py()) for r in rows}

    def _row_problems(self, ids: pa.Array, text: pa.Array):
        """Every row checked value by value; returns the texts too."""
        id_values, id_problems = python_values(ids, "id")
        texts, text_problems = python_values(text, "text")
        problems = {}
        for row, (key, value, a, b) in enumerate(
            zip(id_values, texts, id_problems, text_problems, strict=True)
        ):
            problem = self._problem(key, value, a or b)
            if problem is not None:
                problems[row] = (problem, value)
        return problems, texts

    def _problem(self, key: Any, text: Any, problem: str | None = None) -> str | None:
        """Why a row read as ``(key, text)`` cannot be tokenized, or None if it can."""
        problem = problem or self._id_type.problem(key)
        if problem is None and text is None:
            return (
                f"the row has a null text (or no {self._text!r} field); every row needs a "
                f"string {self._text!r}"
            )
        if problem is None and not isinstance(text, str):
            return f"expected a string {self._text!r}, got text of type {type(text).__name__}"
        return problem

    def _dead(self, error: Exception, stage: str, key: Any, text: Any):
        self._rejected[stage].inc()
        (file_index,), (row,) = split_keys(np.array([key]))
        source = self._files[int(file_index)] if self._files else None
        record = bj.FailedElement.from_exception(
            error, stage=stage, element=text, key=key, source=source, row=int(row)
        )
        return beam.pvalue.TaggedOutput(bj.DEAD_LETTERS, record)
