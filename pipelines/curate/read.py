"""The curation job's records: rows of ``id``, ``text`` and ``label`` read, checked and
tokenized once, so every pass reads tokens rather than text (docs/curate.md, "The data").

Rows come from ``beam_jax.ReadArrowBatches`` or ``beam_jax.text.labelled_corpus``; each
record batch is tokenized in one call. A row without an id, text or label is a
``validation`` dead letter, a text without tokens a ``tokenize`` one.

Example:
    >>> [f.name for f in input_schema(None, None)]
    ['id', 'text', 'label']
"""

from __future__ import annotations

from collections import Counter

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

import beam_jax as bj
from beam_jax import jobs
from beam_jax.internal import origin_of
from beam_jax.text import SentenceEncoder, labelled_corpus

COLUMNS = ("id", "text", "label")
VALIDATION, TOKENIZE = "validation", "tokenize"
METRICS_NAMESPACE = "curate"
_ROWS_PER_BATCH = 256  # the records' row groups, which the passes spread over the workers


class EmptyTextError(bj.InvalidElementError):
    """A text has no tokens besides ``[CLS]`` and ``[SEP]``: empty, whitespace, or only
    characters the tokenizer drops (such as zero-width spaces); nothing to train on."""


def _builtin_batches(num_classes: int) -> list[pa.RecordBatch]:
    ids, texts, labels = zip(*labelled_corpus(num_classes)[1], strict=True)
    rows = pa.table({"id": pa.array(ids, pa.int64()), "text": texts, "label": labels})
    return rows.to_batches(max_chunksize=_ROWS_PER_BATCH)


def input_schema(
    pattern: str | None,
    format: str | None,  # noqa: A002
    columns: tuple[str, str, str] = COLUMNS,
) -> pa.Schema:
    """The rows' id, text and label columns, checked at launch: the id integers or strings
    (the first Parquet file's type, or the first JSON lines'), text and label strings.

    Raises:
        ValueError: A Parquet file lacks a column, or a column has another type.
        beam_jax.InputFileError: Nothing matches ``pattern``.
    """
    if pattern is None:
        return pa.schema([("id", pa.int64()), ("text", pa.string()), ("label", pa.string())])
    id_column, text_column, _ = columns
    first = bj.ReadArrowBatches(pattern, columns=[id_column], format=format).files()[0]
    flags = ("--id_column", "--text_column", "--label_column")
    if format == "jsonl":
        types = {id_column: jobs.id_type_of([first], id_column, text_column)}  # the first id's
    else:
        with FileSystems.open(first) as f:
            schema = pq.read_schema(f)
        for name, flag in zip(columns, flags, strict=True):
            if name not in schema.names:
                raise ValueError(
                    f"{first} has no column {name!r}; it has {schema.names}. Name the "
                    f"input's own with {flag}"
                )
        types = {name: jobs.values_type(schema.field(name).type) for name in columns}
    for name, t in types.items():
        text = pa.types.is_string(t) or pa.types.is_large_string(t)
        if not text and not (name == id_column and pa.types.is_integer(t)):
            kind = "integers or strings" if name == id_column else "strings"
            flag = flags[columns.index(name)]
            raise ValueError(
                f"the {name!r} of {first} is {t}; expected {kind}. Write the column as "
                f"{kind}, or name the input's column that holds them with {flag}"
            )
    return pa.schema([(id_column, types[id_column]), *((c, pa.string()) for c in columns[1:])])


def read_rows(pipeline: beam.Pipeline, args, schema: pa.Schema):
    """``(record batches of the rows, dead letters of what could not be read)``."""
    pattern = args.input
    if pattern is None:
        rows = (
            pipeline
            | "Seed" >> beam.Create([args.classes])
            | "BuiltinCorpus" >> beam.FlatMap(_builtin_batches)
            | "Spread" >> beam.Reshuffle()
        )
        return rows, pipeline | "NoDeadLetters" >> beam.Create([])
    id_column, text_column, label_column = schema.names
    id_kind = "an integer" if pa.types.is_integer(schema.field(0).type) else "a string"
    type_fix = {  # what a JSON line whose field has another type is told
        id_column: f"write every id as {id_kind}, as the input's first ids are",
        text_column: "name the field of the texts with --text_column",
        label_column: 'write each label as a JSON string ("3", not 3), or name the field of '
        "the labels with --label_column",
    }
    typed = {"format": args.format, "schema": schema, "key": id_column, "type_fix": type_fix}
    read = bj.ReadArrowBatches(pattern, columns=schema.names, max_rows=_ROWS_PER_BATCH, **typed)
    return pipeline | "Read" >> read.with_exception_handling()


def records_schema(id_type: pa.DataType) -> pa.Schema:
    """``id``, ``label``, ``tokens`` (``list<int32>``), and where the row was read from
    (``source``, ``row``), so a pass's dead letter names the input row."""
    record = [("id", id_type), ("label", pa.string()), ("tokens", pa.list_(pa.int32()))]
    return pa.schema([*record, ("source", pa.string()), ("row", pa.int64())])


class ToRecords(beam.DoFn):
    """A record batch of rows -> a table of records (``id``, ``label``, and ``tokens``, the
    word-piece ids without ``[CLS]`` and ``[SEP]``), and one dead letter per bad row."""

    def __init__(self, schema: pa.Schema):
        self._schema = schema

    def setup(self):
        self._tokenizer = SentenceEncoder.from_dir().tokenizer()  # the packaged MiniLM's
        self._rows = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows")

    def process(self, batch: pa.RecordBatch):
        n = batch.num_rows
        self._rows.inc(n)
        ids, text, label = (batch.column(c) for c in self._schema.names)
        _, text_name, label_name = self._schema.names
        problems: dict[int, tuple[str, Exception]] = {}

        def refuse(mask, message: str, stage: str = VALIDATION):
            for row in np.flatnonzero(np.asarray(mask, bool)).tolist():
                problems.setdefault(row, (stage, bj.InvalidElementError(message)))

        want = self._schema.field(0).type
        try:
            ids = ids.cast(want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # another file's type
            refuse(np.ones(n), f"the ids are {ids.type} here, but {want} in the first file")
            ids = pa.nulls(n, want)
        refuse(ids.is_null(), "the row has no id (null or missing); every row needs one")
        refuse(text.is_null(), f"expected a string {text_name!r}, got null")
        label = label.cast(pa.string())
        empty = pc.fill_null(pc.equal(label, ""), True)
        refuse(empty, f"expected a non-empty string {label_name!r}")
        tokens, failures = self._tokenizer.encode_arrow(text)
        for row, error in failures.items():
            problems.setdefault(row, (TOKENIZE, error))
        lengths = pc.fill_null(pc.list_value_length(tokens), 0).to_numpy()
        message = "the text has no tokens besides [CLS] and [SEP] (empty, whitespace, or "
        for row in np.flatnonzero(lengths <= 2).tolist():
            error = EmptyTextError(message + "only characters the tokenizer drops)")
            problems.setdefault(row, (TOKENIZE, error))
        source, first = origin_of(batch)  # (None, None) for the built-in corpus
        for row, (stage, error) in sorted(problems.items()):
            element = batch.slice(row, 1).to_pylist()[0]
            key = ids[row].as_py() if ids[row].is_valid else element.get(self._schema.names[0])
            record = bj.FailedElement.from_exception(
                error,
                stage=stage,
                element=element,
                key=key,
                source=source,
                row=None if first is None else first + row,
            )
            yield beam.pvalue.TaggedOutput(bj.DEAD_LETTERS, record)
        keep = np.ones(n, bool)
        keep[list(problems)] = False
        if keep.any():
            kept = tokens.filter(pa.array(keep))
            offsets = kept.offsets.to_numpy()
            values = kept.values.to_numpy()[offsets[0] : offsets[-1]]
            offsets = offsets - offsets[0]
            inner = np.ones(len(values), bool)  # drop each row's [CLS] and [SEP]
            inner[offsets[:-1]] = inner[offsets[1:] - 1] = False
            inner_offsets = offsets - 2 * np.arange(len(offsets), dtype=offsets.dtype)
            stripped = pa.ListArray.from_arrays(pa.array(inner_offsets), pa.array(values[inner]))
            kept_rows = np.flatnonzero(keep)
            rows = pa.nulls(len(kept_rows), pa.int64())
            if first is not None:
                rows = pa.array(first + kept_rows, pa.int64())
            origin = [pa.array([source] * len(kept_rows), pa.string()), rows]
            columns = [ids.filter(pa.array(keep)), label.filter(pa.array(keep)), stripped, *origin]
            yield pa.Table.from_arrays(columns, schema=records_schema(want))


class RecordStats(beam.CombineFn):
    """How many records of each label and of each token length: picks classes and buckets."""

    def create_accumulator(self):
        return Counter(), Counter()

    def add_input(self, acc, table: pa.Table):
        acc[0].update(table.column("label").to_pylist())
        acc[1].update(pc.list_value_length(table.column("tokens")).to_pylist())
        return acc

    def merge_accumulators(self, accs):
        labels, lengths = Counter(), Counter()
        for a, b in accs:
            labels.update(a)
            lengths.update(b)
        return labels, lengths

    def extract_output(self, acc):
        return {
            "labels": dict(sorted(acc[0].items())),
            "lengths": {str(k): v for k, v in sorted(acc[1].items())},
        }
