"""Rows of ``(id, text)`` for the flagship: checks, ids of the input's type, the model.

A row that cannot be embedded is a dead letter at stage ``validation`` or ``tokenize``; an
empty text is embedded as sentence-transformers embeds it (docs/embed_text.md).

Example:
    >>> parse_json_line('{"id": 7, "text": "hi"}'), parse_json_line("[1, 2]")[2]
    ((7, 'hi', None), 'the line holds a JSON list, not an object')
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

import beam_jax as bj
from beam_jax import text

__all__ = [
    "DEAD_LETTERS",
    "METRICS_NAMESPACE",
    "MAX_TOKENIZED_CHARS",
    "TOKENIZE",
    "VALIDATION",
    "EmptyTextError",
    "IdType",
    "TextTooLongError",
    "embeddings_table",
    "load_params",
    "sentence_encoder",
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
# its first 256 tokens. See tokenizer_prefix for why the cut never changes an embedding.
MAX_TOKENIZED_CHARS = 1 << 16
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
    :func:`row_problem`'s.
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
    """``text``, or its first ``MAX_TOKENIZED_CHARS`` characters cut back to a whitespace.

    BERT's tokenizer splits at whitespace and normalizes character by character, so the
    tokens of that prefix are the whole text's first tokens; when they reach the model's
    window, the truncated result is exactly the whole text's. When they do not, the row is a
    :class:`TextTooLongError` dead letter (:func:`too_long_error`).
    """
    if len(text) <= MAX_TOKENIZED_CHARS:
        return text
    head = text[:MAX_TOKENIZED_CHARS]
    space = _LAST_SPACE.search(head)
    return head[: space.start()] if space else head


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
def sentence_encoder(model_dir: str | None = None, manifest: str | None = None):
    """``--model_dir``'s encoder: any sentence-transformers BERT directory, local or on any
    Beam file system (default: the packaged all-MiniLM-L6-v2, always checked against its
    manifest); a directory is checked against ``--model_manifest`` when given. Once per
    process."""
    return text.SentenceEncoder.from_dir(model_dir, manifest=manifest)


def load_params(model_dir: str | None = None, manifest: str | None = None):
    """The weights of :func:`sentence_encoder`; run once per worker process."""
    return sentence_encoder(model_dir, manifest).load_params()
