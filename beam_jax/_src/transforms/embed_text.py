"""EmbedText: record batches of texts in, record batches of embeddings out (tokenize + kernel)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beam_jax._src.arrow.columns import ArrowColumns
from beam_jax._src.arrow.io import origin_of
from beam_jax._src.bucketing.buckets import Bucketing
from beam_jax._src.bucketing.packing import Packing
from beam_jax._src.bucketing.packing_plan import PackingPlan
from beam_jax._src.bucketing.rule import default_boundaries
from beam_jax._src.core.dead_letter import DEAD_LETTERS, VALIDATION, FailedElement
from beam_jax._src.errors import InvalidElementError, SpecError
from beam_jax._src.text.sentence_encoder import SentenceEncoder
from beam_jax._src.text.tokenizer import TextTooLongError
from beam_jax._src.transforms.base import RunKernelResult
from beam_jax._src.transforms.run_kernel_on_arrow import RunKernelOnArrow

TOKENIZE = "tokenize"
INPUT_IDS = "input_ids"
EMBEDDING = "embedding"
_OUTPUT = "output"  # RunKernelOnArrow's column for a kernel returning one array


class _Tokenize(beam.DoFn):
    """A record batch in; ``id`` + ``input_ids`` for the rows that tokenize, one dead letter
    per row that does not (a null or non-string text: ``validation``; a text the tokenizer
    rejects: ``tokenize``). One tokenizer call per batch."""

    def __init__(self, encoder: Any, text_column: str, id_column: str):
        self._encoder = encoder
        self._text = text_column
        self._id = id_column

    def setup(self):
        self._tokenizer = self._encoder.tokenizer()

    def process(self, batch: pa.RecordBatch) -> Iterator[Any]:
        names = batch.schema.names
        missing = [c for c in (self._id, self._text) if c not in names]
        if missing:
            raise SpecError(
                f"EmbedText needs the columns {missing}; the record batch has {names}. Name "
                "the columns with text_column= and id_column="
            )
        ids, texts = batch.column(self._id), batch.column(self._text)
        path, first = origin_of(batch)
        if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
            error = InvalidElementError(
                f"the text column {self._text!r} has type {texts.type}; expected strings"
            )
            for row in range(batch.num_rows):
                yield self._dead(error, VALIDATION, ids, texts, row, path, first)
            return
        encoded, failures = self._tokenizer.encode_arrow(texts)
        null = texts.is_null().to_numpy(zero_copy_only=False)
        for row in np.flatnonzero(null).tolist():
            error = InvalidElementError("the row has a null text; every row needs a string")
            yield self._dead(error, VALIDATION, ids, texts, row, path, first)
        for row, error in sorted(failures.items()):
            if not null[row]:
                # A text that is not Unicode is the data's fault; one the tokenizer cannot
                # cut or rejects is the tokenizer's.
                bad_text = isinstance(error, InvalidElementError)
                stage = (
                    TOKENIZE if isinstance(error, TextTooLongError) or not bad_text else VALIDATION
                )
                yield self._dead(error, stage, ids, texts, row, path, first)
        good = ~encoded.is_null().to_numpy(zero_copy_only=False)
        out = pa.RecordBatch.from_arrays([ids, encoded], names=[self._id, INPUT_IDS])
        if not good.all():
            out = out.filter(pa.array(good))
        if out.num_rows:
            yield out

    @staticmethod
    def _dead(error, stage, ids, texts, row, path, first):
        record = FailedElement.from_exception(
            error,
            stage=stage,
            element=_text(texts, row),
            key=ids[row].as_py(),
            source=path,
            row=None if first is None else first + row,
        )
        return beam.pvalue.TaggedOutput(DEAD_LETTERS, record)


def _text(texts: pa.Array, row: int) -> Any:
    """A row's text for its dead letter (invalid UTF-8 shown with escapes)."""
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        return repr(texts[row])
    raw = texts.slice(row, 1).cast(pa.binary())[0].as_py()
    return None if raw is None else raw.decode("utf-8", errors="backslashreplace")


def _embeddings(batch: pa.RecordBatch, id_column: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [batch.column(id_column), batch.column(_OUTPUT)], names=[id_column, EMBEDDING]
    )


class EmbedText(beam.PTransform):
    """Sentence embeddings of a text column: record batches in, record batches out.

    Each record batch is tokenized with one call to the encoder's tokenizer (flat Arrow
    arrays, no Python object per row), and its token ids are embedded by
    ``RunKernelOnArrow`` in token-length buckets or packed rows. The output record batches
    hold the id column and ``embedding`` (``fixed_size_list<float32, dim>``); every row that
    cannot be embedded becomes one ``FailedElement`` keyed by its id (with its file and row
    when the batch was read by ``ReadArrowBatches``).

    Example:
        >>> from beam_jax.text import EmbedText, SentenceEncoder
        >>> embed = EmbedText(SentenceEncoder.from_dir(), text_column="body", id_column="doc")
        >>> vectors, failed = batches | embed  # doctest: +SKIP

    Args:
        encoder: the model: a ``beam_jax.text.SentenceEncoder``, a model directory for
            ``SentenceEncoder.from_dir``, or ``None`` for the packaged all-MiniLM-L6-v2 (any
            object with ``spec``, ``element_fn``, ``packed_fn``, ``load_params()``,
            ``max_length`` and ``tokenizer()`` whose ``encode_arrow`` tokenizes a column).
        text_column: the column of texts.
        id_column: the column that names each row (copied to the output and the dead
            letters' ``key``).
        batching: a ``Bucketing``, a ``Packing`` or what ``plan_packing`` returned; default
            buckets at powers of two up to the encoder's ``max_length``.
        compilation_cache_dir: JAX's persistent compilation cache, if any.
        precompile: compile every listed shape from each worker's start.
        accelerator: a Beam ``accelerator`` resource hint for the kernel step only.
    """

    def __init__(
        self,
        encoder: SentenceEncoder | str | None = None,
        *,
        text_column: str = "text",
        id_column: str = "id",
        batching: Bucketing | Packing | PackingPlan | None = None,
        compilation_cache_dir: str | None = None,
        precompile: bool = False,
        accelerator: str | None = None,
    ):
        super().__init__()
        if encoder is None or isinstance(encoder, str):
            encoder = SentenceEncoder.from_dir(encoder)
        for name in ("spec", "element_fn", "packed_fn", "load_params", "tokenizer"):
            if not hasattr(encoder, name):
                raise SpecError(
                    f"EmbedText's encoder has no {name!r}; give a beam_jax.text.SentenceEncoder "
                    f"(or an object with spec, element_fn, packed_fn, load_params, tokenizer), "
                    f"got {type(encoder).__name__}"
                )
        if not text_column or not id_column or text_column == id_column:
            raise SpecError(
                f"text_column and id_column must be two different names, got {text_column!r} "
                f"and {id_column!r}"
            )
        if batching is None:
            batching = Bucketing(boundaries={"L": default_boundaries(encoder.max_length)})
        packed = isinstance(batching, Packing | PackingPlan)
        if not packed and not isinstance(batching, Bucketing):
            raise SpecError(
                f"batching must be a Bucketing, a Packing or what plan_packing returned, got "
                f"{batching!r}"
            )
        self.encoder = encoder
        self.text_column, self.id_column = text_column, id_column
        self.accelerator = accelerator
        self.kernel = RunKernelOnArrow(
            encoder.packed_fn if packed else encoder.element_fn,
            spec=encoder.spec,
            columns=ArrowColumns(leaves={INPUT_IDS: INPUT_IDS}, id=id_column),
            bucketing=None if packed else batching,
            packing=batching if packed else None,
            load_params=encoder.load_params,
            compilation_cache_dir=compilation_cache_dir,
            precompile=precompile,
        ).with_exception_handling()

    def _on_accelerator(self, transform: beam.PTransform) -> beam.PTransform:
        if self.accelerator:
            return transform.with_resource_hints(accelerator=self.accelerator)
        return transform

    def start_workers(self) -> beam.PTransform:
        """Apply to the pipeline: the model loads and its shapes compile from its start."""
        return self._on_accelerator(self.kernel.start_workers())

    def expand(self, batches) -> RunKernelResult:
        tokens = batches | "Tokenize" >> beam.ParDo(
            _Tokenize(self.encoder, self.text_column, self.id_column)
        ).with_output_types(pa.RecordBatch).with_outputs(DEAD_LETTERS, main="tokens")
        results, dead = tokens.tokens | "Embed" >> self._on_accelerator(self.kernel)
        vectors = results | "Embeddings" >> beam.Map(_embeddings, self.id_column).with_output_types(
            pa.RecordBatch
        )
        failed = (tokens[DEAD_LETTERS], dead) | "DeadLetters" >> beam.Flatten()
        return RunKernelResult(vectors, failed)
