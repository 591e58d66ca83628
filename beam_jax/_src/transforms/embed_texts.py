"""EmbedTexts: plain strings or ``(id, text)`` pairs in, ``(id, vector)`` pairs out.

The per-element face of :class:`EmbedText`: it batches the elements into record batches
itself (Beam's ``BatchElements``), embeds them with ``EmbedText`` and turns the output
rows back into pairs, so a Beam user needs no Arrow.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import pickle
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beam_jax._src.bucketing.buckets import Bucketing
from beam_jax._src.bucketing.packing import Packing
from beam_jax._src.bucketing.packing_choice import PackingChoice
from beam_jax._src.core.dead_letter import (
    DEAD_LETTERS,
    VALIDATION,
    FailedElement,
    encodable_key,
)
from beam_jax._src.core.wording import article
from beam_jax._src.errors import InvalidElementError, SpecError
from beam_jax._src.runners.dask_refusals import refuse_beams_dask_runner
from beam_jax._src.text.sentence_encoder import SentenceEncoder
from beam_jax._src.transforms.base import RunKernelResult
from beam_jax._src.transforms.embed_text import EMBEDDING, EmbedText

# The record batches' columns. The id column is a string column that holds every id, of
# any type (and of mixed types), so that it comes back as it was given: a string id as
# itself behind "s" (readable, and only as long as the id), any other id pickled behind "p".
_ID = "id"
_TEXT = "text"


def _encode_id(key: Any) -> str:
    if isinstance(key, str):
        return "s" + key
    return "p" + base64.b64encode(pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL)).decode()


def _decode_id(code: str) -> Any:
    if code.startswith("s"):
        return code[1:]
    return pickle.loads(base64.b64decode(code[1:]))


def _split(element: Any) -> tuple[Any, Any]:
    """``(id, text)`` of one input: a 2-tuple is a pair; anything else is a text, its own id."""
    if isinstance(element, tuple) and len(element) == 2:
        return element
    return element, element


def _text_problem(text: Any) -> str | None:
    """Why ``text`` is not a text EmbedTexts can embed, in the words of its elements."""
    if isinstance(text, str):
        return None
    if text is None:
        return (
            "the text is None; EmbedTexts takes strings or (id, text) pairs of a string. "
            "Give the element a text or drop it"
        )
    got = type(text).__name__
    if isinstance(text, bytes | bytearray):
        return (
            f"the text is {got}; EmbedTexts takes strings or (id, text) pairs of a string. "
            "Decode it first (text.decode('utf-8'), or the text's own encoding) or drop it"
        )
    return (
        f"the text is {article(got)} {got}; EmbedTexts takes strings or (id, text) pairs of "
        "a string. Convert it with str() first or drop it"
    )


class _ToRecordBatch(beam.DoFn):
    """A list of elements in; one record batch of the string texts out, and one dead letter
    per text that is not a string."""

    def process(self, elements: list[Any]) -> Iterator[Any]:
        ids, texts = [], []
        for element in elements:
            key, text = _split(element)
            problem = _text_problem(text)
            if problem is not None:
                error = InvalidElementError(problem)
                yield beam.pvalue.TaggedOutput(
                    DEAD_LETTERS,
                    FailedElement.from_exception(error, stage=VALIDATION, element=text, key=key),
                )
                continue
            ids.append(_encode_id(key))
            texts.append(text)
        if ids:
            yield pa.RecordBatch.from_arrays(
                [pa.array(ids, pa.string()), pa.array(texts, pa.string())], names=[_ID, _TEXT]
            )


def _pairs(batch: pa.RecordBatch) -> Iterator[tuple[Any, np.ndarray]]:
    """``(id, vector)`` for each row of EmbedText's output."""
    column = batch.column(EMBEDDING)
    vectors = column.values.to_numpy(zero_copy_only=False).reshape(len(column), -1)
    for key, vector in zip(batch.column(_ID).to_pylist(), vectors, strict=True):
        yield _decode_id(key), vector


def _keyed_by_id(record: FailedElement) -> FailedElement:
    """One of EmbedText's dead letters keyed by the element's id instead of its code.

    A string id too long for a dead letter's key arrives cut (``FailedElement`` bounds every
    key) and stays cut, as it would have been keyed directly."""
    try:
        key, key_type = encodable_key(_decode_id(record.key))
    except Exception:  # noqa: BLE001 - a pickled id too long for a key arrives cut
        return dataclasses.replace(record, key_type="encoded id")
    return dataclasses.replace(record, key=key, key_type=key_type)


class _FailOnDeadLetter(beam.DoFn):
    """Without exception handling, an element that cannot be embedded fails the pipeline."""

    def process(self, record: FailedElement) -> Iterator[Any]:
        raise InvalidElementError(
            f"EmbedTexts could not embed the element with id {record.key!r} (stage "
            f"{record.stage}): {record.error_type}: {record.message}. To get such elements "
            "as dead letters instead, use EmbedTexts(...).with_exception_handling()"
        )
        yield  # pragma: no cover - a generator, for Beam


class EmbedTexts(beam.PTransform):
    """Sentence embeddings of plain strings or ``(id, text)`` pairs: ``(id, vector)`` out.

    Each element is a text (its own id) or ``(id, text)``; the output holds one ``(id,
    vector)`` per text (float32 numpy). The elements are batched into record batches and
    embedded by :class:`EmbedText`. With ``.with_exception_handling()`` the transform
    returns ``(vectors, dead_letters)``, one ``FailedElement`` per element not embedded,
    keyed by its id; without, such an element fails the pipeline.

    Example:
        >>> from beam_jax.text import EmbedTexts
        >>> vectors = pairs | EmbedTexts()  # doctest: +SKIP
        >>> vectors, failed = pairs | EmbedTexts().with_exception_handling()  # doctest: +SKIP

    Args:
        model_dir: a sentence-transformers model directory (local or on a Beam file system),
            a ``SentenceEncoder``, or ``None`` for the packaged all-MiniLM-L6-v2.
        max_batch_size: most texts per record batch (``BatchElements``' largest batch).
        batching: ``EmbedText``'s ``batching`` (token-length buckets by default).
        compilation_cache_dir: JAX's persistent compilation cache, if any.
        precompile: compile every listed shape from each worker's start.
        accelerator: a Beam ``accelerator`` resource hint for the kernel step only.
    """

    def __init__(
        self,
        model_dir: SentenceEncoder | str | None = None,
        *,
        max_batch_size: int = 1024,
        batching: Bucketing | Packing | PackingChoice | None = None,
        compilation_cache_dir: str | None = None,
        precompile: bool = False,
        accelerator: str | None = None,
    ):
        super().__init__()
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise SpecError(f"max_batch_size must be a positive int, got {max_batch_size!r}")
        self.max_batch_size = max_batch_size
        self.embed = EmbedText(
            model_dir,
            text_column=_TEXT,
            id_column=_ID,
            batching=batching,
            compilation_cache_dir=compilation_cache_dir,
            precompile=precompile,
            accelerator=accelerator,
        )
        self._handle_errors = False

    def with_exception_handling(self) -> EmbedTexts:
        """A copy that returns ``RunKernelResult(vectors, dead_letters)`` instead of failing
        the pipeline on an element it cannot embed."""
        clone = copy.copy(self)
        clone._handle_errors = True
        return clone

    def start_workers(self) -> beam.PTransform:
        """Apply to the pipeline: the model loads and its shapes compile from its start."""
        return self.embed.start_workers()

    def expand(self, elements):
        refuse_beams_dask_runner(elements.pipeline, "EmbedTexts")
        batches = (
            elements
            | "Batch" >> beam.BatchElements(max_batch_size=self.max_batch_size)
            | "RecordBatches"
            >> beam.ParDo(_ToRecordBatch())
            .with_output_types(pa.RecordBatch)
            .with_outputs(DEAD_LETTERS, main="batches")
        )
        rows, dead = batches.batches | "EmbedText" >> self.embed
        vectors = rows | "Pairs" >> beam.FlatMap(_pairs)
        failed = (
            batches[DEAD_LETTERS],
            dead | "KeyedById" >> beam.Map(_keyed_by_id),
        ) | "DeadLetters" >> beam.Flatten()
        if not self._handle_errors:
            _ = failed | "FailOnDeadLetter" >> beam.ParDo(_FailOnDeadLetter())
            return vectors
        return RunKernelResult(vectors, failed)
