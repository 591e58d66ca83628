"""The curation job's records: rows checked and tokenized, stored, and read back as kernel inputs.

Rows of ``id``, ``text`` and ``label`` (the built-in labelled corpus, Parquet, or JSON lines)
become records of ``id``, ``label`` and ``tokens`` (word-piece ids of the MiniLM tokenizer,
without ``[CLS]`` and ``[SEP]``), stored once as Parquet so that every training pass reads
tokens rather than text. Each row that cannot become a record is one dead letter, with stage
``"validation"`` (no id, an id of the wrong type, no text, no label, a line that is not a
JSON object) or ``"tokenize"`` (no tokens), as in :mod:`pipelines.text_rows`.

Labels are flipped on the way into the kernels, not in storage: :class:`LabelNoise` decides
per record from a seeded hash of its id, so every pass sees the same labels.

Example:
    >>> noise = LabelNoise(("a", "b"), fraction=0.0, seed=0)
    >>> noise.observe(7, "b")
    (1, 1)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.parquetio import ReadFromParquet

import beam_jax as bj
from beam_jax.text import SentenceEncoder
from pipelines import input_files, labelled_corpus
from pipelines import text_rows as tr

__all__ = [
    "LabelNoise",
    "RecordStats",
    "ToRecords",
    "examples",
    "read_json",
    "read_rows",
    "records_schema",
    "records_table",
    "write_json",
]

VALIDATION, TOKENIZE = tr.VALIDATION, tr.TOKENIZE
METRICS_NAMESPACE = "curate"


@dataclasses.dataclass(frozen=True)
class LabelNoise:
    """Which records get a wrong label, decided per record from a seeded hash of its id.

    Each record's label is replaced with probability ``fraction`` by one of the other
    classes, chosen uniformly. The choice depends only on the seed, the id and the true
    label, so every pass, worker and runner sees the same labels.

    Example:
        >>> noise = LabelNoise(("a", "b", "c"), fraction=0.5, seed=0)
        >>> noise.observe(17, "a") == noise.observe(17, "a")
        True

    Args:
        classes: The class names; a label's index is its position here.
        fraction: The probability of a flip, within [0, 1).
        seed: Seeds the hash.
    """

    classes: tuple[str, ...]
    fraction: float
    seed: int

    def __post_init__(self):
        if len(self.classes) < 2:
            raise ValueError(f"need at least 2 classes to flip between, got {self.classes}.")
        if not 0 <= self.fraction < 1:
            raise ValueError(f"fraction must be within [0, 1), got {self.fraction}.")

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes)}

    def observe(self, key: Any, label: str) -> tuple[int, int]:
        """``(true, observed)`` class indices of the record with id ``key`` and ``label``."""
        true = self._index[label]
        digest = hashlib.blake2b(repr((self.seed, key)).encode(), digest_size=16).digest()
        if int.from_bytes(digest[:8], "little") / 2**64 >= self.fraction:
            return true, true
        shift = 1 + int.from_bytes(digest[8:], "little") % (len(self.classes) - 1)
        return true, (true + shift) % len(self.classes)


class ToRecords(beam.DoFn):
    """Checks one row (a dict, or a JSON line) and tokenizes its text.

    Emits ``{"id", "label", "tokens"}`` (word-piece ids without ``[CLS]``/``[SEP]``, at
    most 254) per good row, and one ``FailedElement`` per bad row on ``dead_letters``.

    Args:
        id_type: The type every id must have.
    """

    def __init__(self, id_type: tr.IdType):
        self._id_type = id_type

    def setup(self):
        self._tokenizer = SentenceEncoder.from_dir().tokenizer()  # the packaged MiniLM's
        counter = functools.partial(beam.metrics.Metrics.counter, METRICS_NAMESPACE)
        self._rows = counter("rows")
        self._rejected = {s: counter(f"dead_letters_{s}") for s in (VALIDATION, TOKENIZE)}

    def process(self, row: Any) -> Iterator[Any]:
        if not (isinstance(row, bytes | str) and not row.strip()):  # blank lines are not rows
            self._rows.inc()
            yield self._record(row)

    def _record(self, row: Any) -> Any:
        """The record of one row, or its dead letter."""
        if isinstance(row, bytes | str):
            try:
                row = json.loads(row)
            except ValueError as e:
                return self._dead(f"the line is not valid JSON ({e})", VALIDATION, None, row)
        if not isinstance(row, dict):
            problem = f"the line holds a JSON {type(row).__name__}, not an object"
            return self._dead(problem, VALIDATION, None, row)
        key, text, label = row.get("id"), row.get("text"), row.get("label")
        problem = None
        if key is None:
            problem = "the row has no id (null or missing); every row needs one"
        elif not self._id_type.accepts(key):
            problem = f"the id {key!r} is a {type(key).__name__}, but the ids are " + (
                self._id_type.describe()
            )
        elif not isinstance(text, str):
            problem = f"expected a string 'text', got {type(text).__name__}"
        elif not isinstance(label, str) or not label:
            problem = f"expected a non-empty string 'label', got {label!r}"
        if problem is not None:
            return self._dead(problem, VALIDATION, key, row)
        tokens = self._tokenizer.encode(text)[1:-1]
        if not len(tokens):
            error = tr.EmptyTextError(
                "the text has no tokens besides [CLS] and [SEP] (it is empty, whitespace, or "
                "only characters the tokenizer drops)"
            )
            return self._dead(error, TOKENIZE, key, row)
        return {"id": key, "label": label, "tokens": tokens}

    def _dead(self, error: str | Exception, stage: str, key: Any, row: Any):
        self._rejected[stage].inc()
        if isinstance(error, str):
            error = bj.InvalidElementError(error)
        record = bj.FailedElement.from_exception(error, stage=stage, element=row, key=key)
        return beam.pvalue.TaggedOutput(tr.DEAD_LETTERS, record)


class RecordStats(beam.CombineFn):
    """How many records of each label and of each token length: picks classes and buckets."""

    def create_accumulator(self):
        return Counter(), Counter()

    def add_input(self, acc, record):
        acc[0][record["label"]] += 1
        acc[1][len(record["tokens"])] += 1
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


def records_schema(id_type: tr.IdType) -> pa.Schema:
    """``id`` (the input's type), ``label`` (the true one) and ``tokens`` (``list<int32>``)."""
    return pa.schema(
        [("id", id_type.arrow_type), ("label", pa.string()), ("tokens", pa.list_(pa.int32()))]
    )


def records_table(records: Sequence[dict], schema: pa.Schema) -> pa.Table:
    """Records from :class:`ToRecords` as one Arrow table, tokens without per-value Python."""
    lengths = np.array([len(r["tokens"]) for r in records], np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = np.concatenate([np.asarray(r["tokens"], np.int32) for r in records])
    return pa.Table.from_arrays(
        [
            pa.array([r["id"] for r in records], schema.field("id").type),
            pa.array([r["label"] for r in records], pa.string()),
            pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
        ],
        schema=schema,
    )


def write_json(value: Any, path: str) -> None:
    """Write ``value`` as JSON to ``path`` on any Beam file system."""
    with FileSystems.create(path) as f:
        f.write(json.dumps(value, indent=1).encode())


def read_json(path: str) -> Any:
    """Read the JSON at ``path`` on any Beam file system."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return json.loads(f.read())


def builtin_rows(num_classes: int) -> Iterator[dict]:
    """The rows of :func:`labelled_corpus.labelled_passages`, as dicts."""
    _, rows = labelled_corpus.labelled_passages(num_classes)
    for key, text, label in rows:
        yield {"id": key, "text": text, "label": label}


def _first_file(pattern: str) -> str:
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise FileNotFoundError(f"--input {pattern!r} matches no file")
    return min(m.path for m in matches)


def read_rows(
    pipeline: beam.Pipeline, input_pattern: str | None, num_classes: int
) -> tuple[Any, tr.IdType]:
    """The input rows (dicts, or JSON lines for :class:`ToRecords` to parse) and the id type.

    Args:
        pipeline: Where to add the read.
        input_pattern: Parquet or JSON lines with ``id``, ``text`` and ``label``; ``None``
            for the built-in labelled corpus.
        num_classes: Built-in corpus only: how many of its modules to keep.

    Raises:
        ValueError: If a Parquet input lacks the ``id``, ``text`` or ``label`` column.
        FileNotFoundError: If ``input_pattern`` matches no file.
    """
    if input_pattern is None:
        rows = (
            pipeline
            | "Seed" >> beam.Create([num_classes])
            | "BuiltinCorpus" >> beam.FlatMap(builtin_rows)
        )
        return rows, tr.IdType.from_name("int")
    inputs = input_files.match_inputs(input_pattern)
    id_type = input_files.id_type_of(inputs)
    if inputs.format == "parquet":
        path = _first_file(input_pattern)
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            names = pq.read_schema(f).names
        if "label" not in names:
            raise ValueError(f"{path} has no column 'label'; it has {names}")
        read = ReadFromParquet(input_pattern, columns=["id", "text", "label"])
        return pipeline | "ReadParquet" >> read, id_type
    return pipeline | "ReadLines" >> beam.io.ReadFromText(input_pattern), id_type


def examples(table: pa.Table, noise: LabelNoise) -> Iterator[tuple[tuple, dict]]:
    """Keyed kernel inputs: ``((id, true, observed), {"tokens", "label": observed})``."""
    tokens = table.column("tokens").combine_chunks()
    values = tokens.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    offsets = tokens.offsets.to_numpy()
    for i, (key, label) in enumerate(
        zip(table.column("id").to_pylist(), table.column("label").to_pylist(), strict=True)
    ):
        true, observed = noise.observe(key, label)
        element = {"tokens": values[offsets[i] : offsets[i + 1]], "label": np.int32(observed)}
        yield (key, true, observed), element
