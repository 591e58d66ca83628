"""BERT's WordPiece tokenizer on whole Arrow columns of ASCII text, with numpy.

The Rust ``tokenizers`` library spends most of its time per token on bookkeeping a model
never reads (character offsets and alignments, token strings, type ids, masks). For the
texts that are printable ASCII (nearly all
of most English corpora) BERT's pipeline reduces to byte arithmetic: lower-case, split at
whitespace, isolate each punctuation mark, and look each distinct word up once. This
module does that on a column's bytes at once and gives the Rust tokenizer the rest.

Exactly the ids ``tokenizers`` gives, for the pipelines it accepts (:meth:`WordPiece.of`);
every other text is left to the Rust tokenizer (:meth:`WordPiece.encode`'s ``handled``).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["WordPiece"]

# Each byte's kind, as bits of one table: a text's bytes are looked up once, and each kind
# is then a bitwise test (vectorised), not a table lookup of its own.
_OTHER, _SPACE, _PUNCT, _UPPER, _ADDED = 1, 2, 4, 8, 16  # _ADDED: set per tokenizer
_KINDS = np.full(256, _OTHER, np.uint8)  # _OTHER: sends a text to the Rust tokenizer
_KINDS[32:127] = 0
_KINDS[[9, 10, 13, 32]] = _SPACE
for _lo, _hi in ((33, 47), (58, 64), (91, 96), (123, 126)):  # Rust's is_ascii_punctuation
    _KINDS[_lo : _hi + 1] = _PUNCT
_KINDS[65:91] = _UPPER
_MAX_CACHED_WORDS = 1 << 20


@dataclasses.dataclass(frozen=True)
class _Pipeline:
    """The settings of a supported ``tokenizer.json`` this module reads."""

    vocab: dict[str, int]
    unk_id: int
    prefix: str
    max_word_chars: int
    lowercase: bool
    first: tuple[int, ...]
    last: tuple[int, ...]
    added: tuple[str, ...]


class WordPiece:
    """A BERT ``tokenizer.json``'s WordPiece over Arrow string columns, on whole columns.

    Make one with :meth:`of`, which says ``None`` for a pipeline it does not reproduce
    exactly. A column's printable-ASCII texts (tab, newline and carriage return allowed)
    that hold no added token (``[CLS]``, ``[MASK]``, ... in any case) are tokenized here;
    the others are marked for the Rust tokenizer. Thread-safe: distinct words are cached
    across calls (up to about a million, then the cache starts again).

    Example:
        >>> import pyarrow as pa
        >>> from beam_jax.text import SentenceEncoder
        >>> tokenizer = SentenceEncoder.from_dir().tokenizer()
        >>> wordpiece = WordPiece.of(tokenizer.path, max_length=8)
        >>> handled, lengths, ids = wordpiece.encode(pa.array(["Hello, world!", "ça"]))
        >>> handled.tolist(), lengths.tolist(), ids.tolist()
        ([True, False], [6], [101, 7592, 1010, 2088, 999, 102])
    """

    def __init__(self, pipeline: _Pipeline, max_length: int):
        self._pipeline = pipeline
        self._budget = max_length - len(pipeline.first) - len(pipeline.last)
        if self._budget < 0:
            raise ValueError(
                f"max_length {max_length} leaves no room for the {len(pipeline.first)} + "
                f"{len(pipeline.last)} special tokens; raise it"
            )
        # The added tokens a printable-ASCII text can hold, lower-cased (matched in any
        # case); their first bytes, in either case, are _ADDED (an empty token: every byte).
        self._added = tuple(t.lower() for t in pipeline.added if t.isascii())
        self._kinds = _KINDS.copy()
        for token in self._added:
            first = token[:1]
            at = [ord(first), ord(first.upper())] if first else slice(None)
            self._kinds[at] |= _ADDED
        self._lock = threading.Lock()
        self._reset()

    @classmethod
    def of(cls, path: Any, *, max_length: int, lowercase: bool = False) -> WordPiece | None:
        """The WordPiece of the ``tokenizer.json`` at ``path``, or None if its pipeline is
        not BERT's (``BertNormalizer`` or none, ``BertPreTokenizer``, ``WordPiece``, and a
        post-processor that adds fixed special tokens around one text).

        Args:
            path: The ``tokenizer.json`` file.
            max_length: Most tokens per text, special tokens included (as the Rust
                tokenizer's truncation counts them).
            lowercase: Lower-case texts even if the normalizer does not.
        """
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        pipeline = _pipeline(spec, lowercase)
        return None if pipeline is None else cls(pipeline, max_length)

    def _reset(self) -> None:
        self._words = pa.array([], pa.large_string())  # word j is the cache's j-th
        self._starts = np.zeros(1, np.int64)  # word j's ids: _ids[_starts[j]:_starts[j+1]]
        self._ids = np.zeros(0, np.int32)

    def encode(
        self, texts: pa.Array, skip: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token ids of a string column's texts that this tokenizer takes.

        Args:
            texts: A ``string`` or ``large_string`` array (nulls are left to the caller).
            skip: ``bool[n]``, rows to leave to the caller whatever they hold.

        Returns:
            ``(handled, lengths, ids)``: ``bool[n]``, True for the rows tokenized here;
            each handled row's count of ids (special tokens included), in row order; and
            their ids concatenated (int32), truncated as the Rust tokenizer truncates.
        """
        n = len(texts)
        offsets = np.frombuffer(texts.buffers()[1], _offset_type(texts.type))
        offsets = offsets[texts.offset : texts.offset + n + 1]
        data = texts.buffers()[2]
        data = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8)
        data = data[offsets[0] : offsets[-1]]
        offsets = offsets - offsets[0]
        kinds = self._kinds[data]
        handled = ~_rows_with(kinds & _OTHER, offsets)
        if skip is not None:
            handled &= ~skip
        if texts.null_count:
            handled &= texts.is_valid().to_numpy(zero_copy_only=False)
        data, kinds, offsets = _rows(data, kinds, offsets, handled)
        # An added token ("[CLS]", "[MASK]", ...) is matched in the raw text, before the
        # normalizer, by the Rust tokenizer: such texts (in any case, to be safe) go there.
        lowered = data | ((kinds & _UPPER) << 2)  # A-Z: bit 5 (32) set is a-z
        added = self._with_added_token(lowered, kinds, offsets)
        if self._pipeline.lowercase:
            data = lowered
        if added.any():
            handled[np.flatnonzero(handled)[added]] = False
            data, kinds, offsets = _rows(data, kinds, offsets, ~added)
        lengths, ids = self._tokenize(data, kinds, offsets)
        return handled, lengths, ids

    def _with_added_token(
        self, lowered: np.ndarray, kinds: np.ndarray, offsets: np.ndarray
    ) -> np.ndarray:
        """``bool[rows]``: the texts (lower-cased bytes laid out by ``offsets``) that hold an
        added token. Only those holding a token's first byte (for BERT's, ``[``) can: the
        others are not searched."""
        rows = len(offsets) - 1
        added = np.zeros(rows, bool)
        if not self._added or not rows:
            return added
        maybe = np.flatnonzero(_rows_with(kinds & _ADDED, offsets))
        if not len(maybe):
            return added
        column = pa.LargeStringArray.from_buffers(
            rows, pa.py_buffer(offsets.astype(np.int64)), pa.py_buffer(lowered)
        ).take(pa.array(maybe))
        found = np.zeros(len(maybe), bool)
        for token in self._added:
            found |= pc.match_substring(column, token).to_numpy(zero_copy_only=False)
        added[maybe[found]] = True
        return added

    def _tokenize(
        self, data: np.ndarray, kinds: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids of texts laid out as ``data[offsets[i]:offsets[i+1]]``, printable ASCII
        (lower-cased already where the pipeline lower-cases), each byte's ``kinds`` given."""
        pipeline = self._pipeline
        space, punct = (kinds & _SPACE) != 0, (kinds & _PUNCT) != 0
        # A word starts at each punctuation mark, and at a letter after a space, a mark or
        # a text's start; it ends where the next non-letter or text starts.
        word = ~(space | punct)
        starts_here = punct.copy()
        starts_here[1:] |= word[1:] & ~word[:-1]
        starts_here[:1] |= word[:1]
        row_start = np.zeros(len(data), bool)
        row_start[offsets[:-1][offsets[:-1] < len(data)]] = True
        starts_here |= word & row_start
        starts = np.flatnonzero(starts_here)
        # A word ends at a mark, or at a letter that the next byte does not continue.
        goes_on = np.zeros(len(data), bool)
        goes_on[:-1] = word[1:] & ~row_start[1:]
        ends = np.flatnonzero(punct | (word & ~goes_on))
        # Words are their bytes laid end to end (spaces dropped), in one buffer.
        word_offsets = np.concatenate([[0], np.cumsum(ends - starts + 1)])
        words = pa.LargeStringArray.from_buffers(
            len(starts), pa.py_buffer(word_offsets), pa.py_buffer(data[~space])
        )
        encoded = words.dictionary_encode()
        distinct, starts_of, ids_of = self._word_numbers(encoded.dictionary)
        number = distinct[encoded.indices.to_numpy()]
        # Each word's ids in order (one Arrow take of the cache's lists, which runs without
        # the GIL: np.repeat over every word held it for ~1 ms a part), then each text
        # truncated to its budget.
        cache = pa.LargeListArray.from_arrays(pa.array(starts_of), pa.array(ids_of))
        taken = cache.take(pa.array(number))
        first = taken.offsets.to_numpy()
        first = first - first[0]
        total = int(first[-1])
        first = first[:-1]
        ids = taken.flatten().to_numpy()
        # Text r's words start at or after offsets[r], and its ids with its first word's.
        id_first = np.append(first, total)[np.searchsorted(starts, offsets)]
        counts = np.diff(id_first)
        if counts.max(initial=0) > self._budget:  # (Arrow's slices run without the GIL)
            texts = pa.LargeListArray.from_arrays(pa.array(id_first), pa.array(ids))
            ids = pc.list_slice(texts, 0, self._budget).flatten().to_numpy()
            counts = np.minimum(counts, self._budget)
        head, tail = pipeline.first, pipeline.last
        lengths = counts + len(head) + len(tail)
        out_offsets = np.cumsum(lengths) - lengths
        out = np.empty(int(lengths.sum()), np.int32)
        # Text r's ids fill the slots between its head and its tail: a mask of those slots,
        # not an index per id (np.repeat of each text's row held the GIL).
        is_id = np.ones(len(out), bool)
        for k, token in enumerate(head):
            out[out_offsets + k] = token
            is_id[out_offsets + k] = False
        for k, token in enumerate(tail):
            out[out_offsets + len(head) + counts + k] = token
            is_id[out_offsets + len(head) + counts + k] = False
        out[is_id] = ids
        return lengths, out

    def _word_numbers(self, distinct: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each distinct word's number in the cache, tokenizing (and caching) new ones; with
        the cache's ``starts`` and ``ids`` as they were then (another thread may start the
        cache again once the lock is released). The words are looked up by Arrow, without
        the GIL; only new ones become Python strings."""
        with self._lock:
            if len(self._words) + len(distinct) > _MAX_CACHED_WORDS:
                self._reset()
            found = pc.index_in(distinct, value_set=self._words)
            numbers = found.fill_null(-1).to_numpy().astype(np.int64)
            new_at = np.flatnonzero(numbers < 0)
            if len(new_at):
                new_words = distinct.take(pa.array(new_at))
                pieces = [self._pieces(w) for w in new_words.to_pylist()]
                numbers[new_at] = len(self._words) + np.arange(len(new_at))
                self._words = pa.concat_arrays([self._words, new_words])
                counts = np.fromiter(map(len, pieces), np.int64, len(pieces))
                self._starts = np.concatenate([self._starts, self._starts[-1] + np.cumsum(counts)])
                flat = [i for p in pieces for i in p]
                self._ids = np.concatenate([self._ids, np.asarray(flat, np.int32)])
            return numbers, self._starts, self._ids

    def _pieces(self, word: str) -> list[int]:
        """One word's ids: the longest vocabulary prefix, then ``##``-prefixed pieces
        (``tokenizers``' WordPiece), or the unknown token if any piece is missing."""
        pipeline = self._pipeline
        if len(word) > pipeline.max_word_chars:
            return [pipeline.unk_id]
        vocab, ids, start = pipeline.vocab, [], 0
        while start < len(word):
            end, found = len(word), None
            while start < end:
                piece = word[start:end] if start == 0 else pipeline.prefix + word[start:end]
                found = vocab.get(piece)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return [pipeline.unk_id]
            ids.append(found)
            start = end
        return ids


def _offset_type(type_: pa.DataType) -> type:
    if pa.types.is_string(type_):
        return np.int32
    if pa.types.is_large_string(type_):
        return np.int64
    raise TypeError(f"WordPiece.encode takes a string or large_string array, got {type_}")


def _rows(data: np.ndarray, kinds: np.ndarray, offsets: np.ndarray, rows: np.ndarray):
    """The bytes, their kinds and the offsets of ``rows`` (``bool``) of texts laid out by
    ``offsets``."""
    if rows.all():
        return data, kinds, offsets
    lengths = np.diff(offsets)
    kept = np.repeat(rows, lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths[rows])]).astype(offsets.dtype)
    return data[kept], kinds[kept], offsets


def _rows_with(flags: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``bool[rows]``: which rows of ``offsets`` hold a flagged byte."""
    rows = np.zeros(len(offsets) - 1, bool)
    rows[np.searchsorted(offsets, np.flatnonzero(flags), side="right") - 1] = True
    return rows


def _pipeline(spec: dict, lowercase: bool) -> _Pipeline | None:
    normalizer, model = spec.get("normalizer"), spec.get("model") or {}
    if normalizer is not None and normalizer.get("type") != "BertNormalizer":
        return None
    if (spec.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        return None
    if model.get("type") != "WordPiece":
        return None
    vocab = model["vocab"]
    if model.get("unk_token") not in vocab:
        return None
    special = _special_tokens(spec.get("post_processor"))
    if special is None:
        return None
    return _Pipeline(
        vocab=dict(vocab),
        unk_id=vocab[model["unk_token"]],
        prefix=model.get("continuing_subword_prefix", "##"),
        max_word_chars=int(model.get("max_input_chars_per_word", 100)),
        lowercase=lowercase or bool(normalizer and normalizer.get("lowercase", True)),
        first=special[0],
        last=special[1],
        added=tuple(t["content"] for t in spec.get("added_tokens") or ()),
    )


def _special_tokens(processor: dict | None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids a post-processor puts before and after a single text, or None if it does
    anything else."""
    if processor is None:
        return (), ()
    if processor.get("type") == "BertProcessing":
        return (int(processor["cls"][1]),), (int(processor["sep"][1]),)
    if processor.get("type") != "TemplateProcessing":
        return None
    single, tokens = processor.get("single") or [], processor.get("special_tokens") or {}
    sequences = [i for i, part in enumerate(single) if "Sequence" in part]
    if len(sequences) != 1 or single[sequences[0]]["Sequence"].get("id") != "A":
        return None
    ids: list[list[int]] = [[], []]
    for i, part in enumerate(single):
        if "SpecialToken" in part:
            token = tokens.get(part["SpecialToken"]["id"])
            if token is None:
                return None
            ids[i > sequences[0]].extend(int(t) for t in token["ids"])
    return tuple(ids[0]), tuple(ids[1])
