"""One tokenize step per part: a record batch of ``key``, ``id``, ``text`` in, token ids out,
with one Rust tokenizer call per batch; a bad row is a dead letter at stage ``validation``
or ``tokenize`` (docs/embed_text.md).

Example:
    >>> tokens = batches | beam.ParDo(TokenizeParts(id_type)).with_outputs(  # doctest: +SKIP
    ...     PARTS, tr.DEAD_LETTERS, main="tokens")
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

import beam_jax as bj
from pipelines import text_rows as tr
from pipelines.embed.parts import KEY, PROBLEM, RAW_ID, Part, python_values, split_keys

__all__ = ["INPUT_IDS", "PARTS", "TokenizeParts"]

INPUT_IDS = "input_ids"
PARTS = "parts"


def _valid_utf8(column: pa.Array) -> bool:
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return False
    try:
        column.validate(full=True)  # checks the UTF-8 of every value (SIMD, ~GB/s)
    except pa.ArrowInvalid:
        return False
    return True


def _ids_utf8(ids: pa.Array) -> bool:
    return pa.types.is_integer(ids.type) or _valid_utf8(ids)


def _char_lengths(texts: list[str]) -> np.ndarray:
    return np.fromiter(map(len, texts), np.int64, len(texts))


class TokenizeParts(beam.DoFn):
    """Checks and tokenizes a record batch of ``key``, ``id``, ``text`` (one part).

    Outputs: the part's :class:`Part` (``"parts"``, first); a record batch of ``key`` and
    ``input_ids`` (``list<int32>``) for the good rows (main); one ``FailedElement`` per bad
    row (``"dead_letters"``), keyed by the row's key, its ``source`` and ``row`` where it
    was read. Where the batch's columns have the run's types and valid UTF-8 (the usual
    case), the checks are vectorised; otherwise the batch is checked value by value.

    Args:
        id_type: The type every id must have.
        model_dir: The model directory, as for ``text_rows.sentence_encoder``.
        files: Each input file's name, for dead letters' ``source``.
    """

    def __init__(self, id_type: tr.IdType, model_dir: str | None = None, files=()):
        self._id_type = id_type
        self._model_dir = model_dir
        self._files = tuple(files)

    def setup(self):
        self._tokenizer = tr.sentence_encoder(self._model_dir).tokenizer()
        counter = functools.partial(beam.metrics.Metrics.counter, tr.METRICS_NAMESPACE)
        self._rows = counter("rows")
        self._rejected = {s: counter(f"dead_letters_{s}") for s in (tr.VALIDATION, tr.TOKENIZE)}

    def process(self, batch: pa.RecordBatch) -> Iterator[Any]:
        self._rows.inc(batch.num_rows)
        keys = batch.column(KEY)
        files, positions = split_keys(keys.to_numpy())
        raw = batch.column(RAW_ID) if RAW_ID in batch.schema.names else None
        ids, text = batch.column("id"), batch.column("text")
        yield beam.pvalue.TaggedOutput(PARTS, Part(int(files[0]), positions, ids, raw))
        if PROBLEM in batch.schema.names:  # JSON lines: checked as read
            problems = self._read_problems(batch.column(PROBLEM), raw)
            texts = None
        elif ids.type == self._id_type.arrow_type and _valid_utf8(text) and _ids_utf8(ids):
            problems = self._null_problems(ids, text)
            texts = None
        else:
            problems, texts = self._row_problems(ids, text)
        for row, (problem, value) in problems.items():
            error = bj.InvalidElementError(problem)
            yield self._dead(error, tr.VALIDATION, keys[row].as_py(), value)
        good = np.ones(batch.num_rows, bool)
        good[list(problems)] = False
        rows = np.flatnonzero(good)
        if not len(rows):
            return
        if texts is None:
            texts = (text if len(rows) == batch.num_rows else text.take(rows)).to_pylist()
        else:
            texts = [texts[r] for r in rows]
        cut = [j for j in np.flatnonzero(_char_lengths(texts) > tr.MAX_TOKENIZED_CHARS)]
        whole = {j: texts[j] for j in cut}
        for j in cut:
            texts[j] = tr.tokenizer_prefix(texts[j])
        flat, lengths, errors = self._encode(texts)
        for j in cut:
            if j not in errors and lengths[j] < self._tokenizer.max_length:
                errors[j] = tr.too_long_error(
                    len(whole[j]), len(texts[j]), int(lengths[j]), self._tokenizer.max_length
                )
        for j, error in sorted(errors.items()):
            if isinstance(error, bj.InvalidElementError) and not isinstance(
                error, tr.TextTooLongError
            ):
                stage = tr.VALIDATION
            else:
                stage = tr.TOKENIZE
            yield self._dead(error, stage, keys[int(rows[j])].as_py(), whole.get(j, texts[j]))
        offsets = np.zeros(len(lengths) + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        input_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
        out = pa.RecordBatch.from_arrays(
            [keys if len(rows) == batch.num_rows else keys.take(rows), input_ids],
            names=[KEY, INPUT_IDS],
        )
        if errors:
            keep = np.ones(len(rows), bool)
            keep[list(errors)] = False
            out = out.filter(pa.array(keep))
        if out.num_rows:
            yield out

    def _read_problems(self, problems: pa.Array, raw: pa.Array) -> dict[int, tuple[str, Any]]:
        """The rows whose reading found a problem (JSON lines), with their text as read."""
        bad = np.flatnonzero(~problems.is_null().to_numpy(zero_copy_only=False)).tolist()
        return {r: (problems[r].as_py(), json.loads(raw[r].as_py())[1]) for r in bad}

    def _null_problems(self, ids: pa.Array, text: pa.Array) -> dict[int, tuple[str, Any]]:
        """The rows with a null id or text (the only problems a typed, valid batch can have)."""
        if not ids.null_count and not text.null_count:
            return {}
        null = ids.is_null().to_numpy(zero_copy_only=False)
        null |= text.is_null().to_numpy(zero_copy_only=False)
        problems = {}
        for row in np.flatnonzero(null).tolist():
            value = text[row].as_py()
            problems[row] = (tr.row_problem(self._id_type, ids[row].as_py(), value), value)
        return problems

    def _row_problems(self, ids: pa.Array, text: pa.Array):
        """Every row checked value by value; returns the texts too."""
        id_values, id_problems = python_values(ids, "id")
        texts, text_problems = python_values(text, "text")
        problems = {}
        for row, (key, value, a, b) in enumerate(
            zip(id_values, texts, id_problems, text_problems, strict=True)
        ):
            problem = tr.row_problem(self._id_type, key, value, a or b)
            if problem is not None:
                problems[row] = (problem, value)
        return problems, texts

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, dict[int, Exception]]:
        """Token ids of ``texts`` (flat, and counts); a text the tokenizer rejects gets
        count 0 and its exception in the third value."""
        try:
            flat, lengths = self._tokenizer.encode_flat(texts)
            return flat, lengths, {}
        except Exception:  # noqa: BLE001 - one bad text: find it, keep the others
            pass
        pieces, lengths, errors = [], np.zeros(len(texts), np.int64), {}
        for j, text in enumerate(texts):
            problem = tr.unicode_problem(text, "text")
            if problem is not None:
                errors[j] = bj.InvalidElementError(problem)
                continue
            try:
                ids, _ = self._tokenizer.encode_flat([text])
            except Exception as e:  # noqa: BLE001 - the tokenizer's message, as a dead letter
                errors[j] = e
                continue
            pieces.append(ids)
            lengths[j] = len(ids)
        flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
        return flat, lengths, errors

    def _dead(self, error: Exception, stage: str, key: Any, text: Any):
        self._rejected[stage].inc()
        (file_index,), (row,) = split_keys(np.array([key]))
        source = self._files[int(file_index)] if self._files else None
        record = bj.FailedElement.from_exception(
            error, stage=stage, element=text, key=key, source=source, row=int(row)
        )
        return beam.pvalue.TaggedOutput(tr.DEAD_LETTERS, record)
