"""TokenizeBatches: the one tokenize step: record batches of ids and texts in, token ids out.

Every text front end tokenizes here: one tokenizer call per record batch
(``Tokenizer.encode_arrow``, no Python object per row), and one ``FailedElement`` per row
that cannot be tokenized, keyed by its id, with its file and row where the batch says.

Example:
    >>> tokens = batches | beam.ParDo(TokenizeBatches(encoder)).with_outputs(  # doctest: +SKIP
    ...     DEAD_LETTERS, main="tokens")
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beam_jax._src.arrow.ahead import WorkAhead
from beam_jax._src.arrow.origin import carry_origin, file_rows, row_origin
from beam_jax._src.core.dead_letter import DEAD_LETTERS, VALIDATION, FailedElement
from beam_jax._src.cores import usable_cores
from beam_jax._src.errors import InvalidElementError, SpecError
from beam_jax._src.text.rows import IdType, python_values
from beam_jax._src.text.tokenizer import TextTooLongError

__all__ = [
    "INPUT_IDS",
    "TOKENIZE",
    "TOKENIZE_THREADS",
    "TokenizeBatches",
    "default_tokenize_threads",
]

TOKENIZE = "tokenize"  # the stage of a text the tokenizer cannot cut or rejects
INPUT_IDS = "input_ids"
TOKENIZE_THREADS = "beam_jax-tokenize"  # the names of the tokenizer's threads start so
_WINDOW, _TIMESTAMP = beam.DoFn.WindowParam, beam.DoFn.TimestampParam


def _valid_strings(column: pa.Array) -> bool:
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return False
    try:
        column.validate(full=True)  # checks the UTF-8 of every value (SIMD, ~GB/s)
    except pa.ArrowInvalid:
        return False
    return True


def default_tokenize_threads() -> int:
    """Batches a ``TokenizeBatches`` instance tokenizes at once by default: two where this
    process may use four cores or more (more do not help: bench/RESULTS.md), else one (on
    two cores a second thread only competes with the bundle's)."""
    return 2 if usable_cores() >= 4 else 1


def _work_ahead(threads: int) -> WorkAhead:
    # Ahead by one batch more than the threads (two at least): the tokenizer keeps working
    # while the kernel or the writer holds up a batch (bench/RESULTS.md).
    return WorkAhead(TOKENIZE_THREADS, depth=max(2, threads + 1), workers=threads)


class TokenizeBatches(beam.DoFn):
    """Checks and tokenizes record batches of ids and texts.

    Outputs: a record batch of ``carry`` and ``input_ids`` (``list<int32>``) for the rows
    that tokenize (main), carrying where they were read (so the kernel's dead letters name
    each row's file and row); one ``FailedElement`` per row that does not
    (``DEAD_LETTERS``): stage ``validation`` for a null, non-string or non-UTF-8 text or an
    id not of ``id_type``; stage ``tokenize`` for a text the tokenizer cannot cut or rejects.

    The tokenizer works ahead in background threads (``WorkAhead``), so a batch's outputs
    come out while a later batch is processed, or when the bundle finishes, in order.

    Example:
        >>> from beam_jax.text import SentenceEncoder, TokenizeBatches
        >>> step = TokenizeBatches(SentenceEncoder.from_dir(), text_column="body")

    Args:
        encoder: The model (a ``beam_jax.text.SentenceEncoder``): its ``tokenizer()``.
        text_column: The column of texts.
        id_column: The column that names each row (the dead letters' ``key``).
        id_type: If given (a ``beam_jax.text.IdType``), the type every id must have; a null
            id is then a dead letter too.
        carry: The column copied to the output beside ``input_ids`` (default
            ``id_column``), e.g. a job's own row key.
        metrics_namespace: Where ``rows`` and ``dead_letters_<stage>`` are counted.
        text_name: How messages name the text (default ``text_column``), e.g. the input's
            field where the batches renamed it.
        threads: Batches tokenized at once, each in a background thread; default
            ``default_tokenize_threads()`` on the worker.

    Raises:
        ValueError: ``threads`` is not a positive int (or None).
        SpecError: (when run) if a batch lacks one of the columns.
    """

    def __init__(
        self,
        encoder: Any,
        *,
        text_column: str = "text",
        id_column: str = "id",
        id_type: IdType | None = None,
        carry: str | None = None,
        metrics_namespace: str = "beam_jax.text",
        text_name: str | None = None,
        threads: int | None = None,
    ):
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ValueError(
                f"threads must be a positive int (batches tokenized at once) or None for "
                f"the worker's default, got {threads!r}"
            )
        self._threads = threads
        self._ahead = _work_ahead(threads or 1)  # sized again on the worker, in setup
        self._encoder = encoder
        self._text, self._id, self._carry = text_column, id_column, carry or id_column
        self._id_type = id_type
        self._namespace = metrics_namespace
        self._text_name = text_name or text_column

    def setup(self):
        self._tokenizer = self._encoder.tokenizer()
        counter = functools.partial(beam.metrics.Metrics.counter, self._namespace)
        self._rows = counter("rows")
        self._rejected = {s: counter(f"dead_letters_{s}") for s in (VALIDATION, TOKENIZE)}
        self._ahead = _work_ahead(self._threads or default_tokenize_threads())
        self._ahead.setup()

    def start_bundle(self):
        self._ahead.start_bundle()

    def finish_bundle(self):
        yield from self._ahead.finish_bundle()

    def teardown(self):
        self._ahead.teardown()

    def process(self, batch: pa.RecordBatch, window=_WINDOW, timestamp=_TIMESTAMP) -> Iterator[Any]:
        names = batch.schema.names
        missing = [c for c in dict.fromkeys((self._id, self._text, self._carry)) if c not in names]
        if missing:
            raise SpecError(
                f"the tokenize step needs the columns {missing}; the record batch has {names}. "
                "Name the columns with text_column= and id_column="
            )
        self._rows.inc(batch.num_rows)
        ids, text = batch.column(self._id), batch.column(self._text)
        origin = row_origin(batch)
        want = self._id_type
        typed = _valid_strings(text) and (want is None or ids.type == want.arrow_type)
        if typed and (not pa.types.is_string(ids.type) or _valid_strings(ids)):
            problems = self._null_problems(ids, text)
        else:
            problems, values = self._row_problems(ids, text)
            text = pa.array(
                [None if r in problems else v for r, v in enumerate(values)], pa.string()
            )
        for row, (problem, key, value) in problems.items():
            error = InvalidElementError(problem)
            yield self._dead(error, VALIDATION, key, value, origin, row)
        rows = np.flatnonzero(~np.isin(np.arange(batch.num_rows), list(problems)))
        if not len(rows):
            return
        carried = batch.column(self._carry)
        whole = len(rows) == batch.num_rows
        texts = text if whole else text.take(pa.array(rows))
        carried = carried if whole else carried.take(pa.array(rows))
        # The tokenizer's numpy and Rust work release the GIL: later batches tokenize in
        # the background while this one's tokens go on to the kernel.
        work = functools.partial(self._tokenizer.encode_arrow, texts)
        then = functools.partial(self._tokens, batch, rows, carried, texts, origin)
        yield from self._ahead.submit(work, then, window, timestamp)

    def _tokens(self, batch, rows, carried, texts, origin, tokenized) -> Iterator[Any]:
        """The good rows' token ids (a record batch of ``carry`` and ``input_ids``), and a
        dead letter for each text the tokenizer failed."""
        input_ids, failures = tokenized
        for j, error in failures.items():
            # A text that is not Unicode is the data's fault; one the tokenizer cannot cut
            # or rejects is the tokenizer's.
            bad_text = isinstance(error, InvalidElementError)
            too_long = isinstance(error, TextTooLongError)
            stage = TOKENIZE if too_long or not bad_text else VALIDATION
            row = int(rows[j])
            key = python_values(batch.column(self._id).slice(row, 1), "id")[0][0]
            yield self._dead(error, stage, key, texts[j].as_py(), origin, row)
        out = pa.RecordBatch.from_arrays([carried, input_ids], names=[self._carry, INPUT_IDS])
        # The rows say where they were read, for the kernel's dead letters: by the batch's
        # metadata while they are all its rows, else by a column of their file rows.
        whole = len(rows) == batch.num_rows and not failures
        out = carry_origin(out, batch, None if whole else rows)
        if failures:
            out = out.filter(input_ids.is_valid())
        if out.num_rows:
            yield out

    def _null_problems(self, ids: pa.Array, text: pa.Array) -> dict[int, tuple[str, Any, Any]]:
        """The rows with a null text (or id, where ids are typed): the only problems a
        typed, valid batch can have."""
        check_ids = self._id_type is not None and ids.null_count
        if not check_ids and not text.null_count:
            return {}
        null = text.is_null().to_numpy(zero_copy_only=False)
        if check_ids:
            null |= ids.is_null().to_numpy(zero_copy_only=False)
        problems = {}
        for r in np.flatnonzero(null).tolist():
            key, value = ids[r].as_py(), text[r].as_py()
            problems[r] = (self._problem(key, value), key, value)
        return problems

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
                problems[row] = (problem, key, value)
        return problems, texts

    def _problem(self, key: Any, text: Any, problem: str | None = None) -> str | None:
        """Why a row read as ``(key, text)`` cannot be tokenized, or None if it can."""
        if problem is None and self._id_type is not None:
            problem = self._id_type.problem(key)
        if problem is None and text is None:
            name = self._text_name
            return (
                f"the row has a null text (or no {name!r} field); every row needs a string {name!r}"
            )
        if problem is None and not isinstance(text, str):
            got = type(text).__name__
            return f"expected a string {self._text_name!r}, got text of type {got}"
        return problem

    def _dead(self, error: Exception, stage: str, key: Any, text: Any, origin, row: int):
        self._rejected[stage].inc()
        path, at = origin
        record = FailedElement.from_exception(
            error, stage=stage, element=text, key=key, source=path, row=file_rows(at, row)
        )
        return beam.pvalue.TaggedOutput(DEAD_LETTERS, record)
