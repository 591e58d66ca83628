"""EmbedText: record batches of texts in, record batches of embeddings out (tokenize + kernel),
both in one step (:class:`EmbedBatches`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.windowed_value import WindowedValue

from beam_jax._src.arrow.columns import ArrowColumns
from beam_jax._src.bucketing.buckets import Bucketing
from beam_jax._src.bucketing.packing import Packing
from beam_jax._src.bucketing.packing_choice import PackingChoice
from beam_jax._src.bucketing.rule import default_boundaries
from beam_jax._src.core.dead_letter import DEAD_LETTERS, FailedElement
from beam_jax._src.errors import SpecError
from beam_jax._src.runners.dask_refusals import refuse_beams_dask_runner
from beam_jax._src.text.sentence_encoder import SentenceEncoder
from beam_jax._src.transforms.base import RunKernelResult
from beam_jax._src.transforms.run_kernel_on_arrow import RunKernelOnArrow
from beam_jax._src.transforms.tokenize import INPUT_IDS, TokenizeBatches

__all__ = ["EmbedBatches", "EmbedText", "on_accelerator"]

EMBEDDING = "embedding"
_WINDOW, _TIMESTAMP = beam.DoFn.WindowParam, beam.DoFn.TimestampParam
_OUTPUT = "output"  # RunKernelOnArrow's column for a kernel returning one array


def _unwrap(output: Any) -> tuple[str | None, Any, WindowedValue | None]:
    """``(tag, value, windowed)`` of a DoFn's output: its tag (None: main), its value, and
    the ``WindowedValue`` it came in, if it did."""
    tag = None
    if isinstance(output, TaggedOutput):
        tag, output = output.tag, output.value
    if isinstance(output, WindowedValue):
        return tag, output.value, output
    return tag, output, None


def _wrap(tag: str | None, value: Any, windowed: WindowedValue | None) -> Any:
    """The output ``_unwrap`` took apart, with ``value`` in it."""
    out = value if windowed is None else windowed.with_value(value)
    return out if tag is None else TaggedOutput(tag, out)


class EmbedBatches(beam.DoFn):
    """Tokenize and embed in one step: record batches of texts in, record batches of
    ``carry`` and ``output`` out (main), one ``FailedElement`` per row that failed either
    (``DEAD_LETTERS``).

    One DoFn, so no runner's fusion decides whether tokens and their rows meet; an
    ``accelerator`` hint on it asks for the model's device. It calls a ``TokenizeBatches``
    and a ``RunKernelOnArrow``'s DoFn in turn. A subclass may take over what comes out by
    overriding :meth:`results`, :meth:`tokenizer_dead_letter` and :meth:`kernel_dead_letter`.

    Example:
        >>> kernel = RunKernelOnArrow(fn, ...).with_exception_handling()  # doctest: +SKIP
        >>> step = EmbedBatches(TokenizeBatches(encoder), kernel)  # doctest: +SKIP
        >>> out = batches | beam.ParDo(step).with_outputs(DEAD_LETTERS)  # doctest: +SKIP

    Args:
        tokenize: The tokenize step; its ``carry`` column must be the kernel's id column.
        kernel: A ``RunKernelOnArrow`` of the encoder, reading ``input_ids``, with exception
            handling (its threshold is not applied here).
    """

    def __init__(self, tokenize: TokenizeBatches, kernel: RunKernelOnArrow):
        self._tokenize = tokenize
        self._kernel = kernel.dofn()

    def setup(self):
        self._tokenize.setup()
        self._kernel.setup()

    def start_bundle(self):
        self._tokenize.start_bundle()
        self._kernel.start_bundle()

    def process(self, batch: pa.RecordBatch, window=_WINDOW, timestamp=_TIMESTAMP) -> Iterator[Any]:
        for out in self._tokenize.process(batch, window, timestamp):
            yield from self._from_tokenizer(out, window)

    def finish_bundle(self) -> Iterator[Any]:
        # The tokenizer's last batches go to the kernel before the kernel's last batches run.
        for out in self._tokenize.finish_bundle():
            yield from self._from_tokenizer(out, None)
        for out in self._kernel.finish_bundle():
            yield from self._from_kernel(out)

    def teardown(self):
        self._tokenize.teardown()

    def _from_tokenizer(self, out: Any, window: Any) -> Iterator[Any]:
        tag, value, windowed = _unwrap(out)
        if tag == DEAD_LETTERS:
            yield from self.tokenizer_dead_letter(value, windowed)
            return
        for result in self._kernel.process(value, windowed.windows[0] if windowed else window):
            yield from self._from_kernel(result)

    def _from_kernel(self, out: Any) -> Iterator[Any]:
        tag, value, windowed = _unwrap(out)
        if tag == DEAD_LETTERS:
            yield from self.kernel_dead_letter(value, windowed)
        else:
            yield from self.results(value, windowed)

    def results(self, batch: pa.RecordBatch, windowed: WindowedValue | None) -> Iterator[Any]:
        """A kernel batch's results (``carry`` and ``output``), in ``windowed``'s window."""
        yield _wrap(None, batch, windowed)

    def tokenizer_dead_letter(self, record: FailedElement, windowed) -> Iterator[Any]:
        """A row the tokenize step refused (keyed by its id, with its file and row)."""
        yield _wrap(DEAD_LETTERS, record, windowed)

    def kernel_dead_letter(self, record: FailedElement, windowed) -> Iterator[Any]:
        """A row the kernel failed (keyed by its ``carry`` value, with its file and row: the
        tokenize step's batches say where their rows were read)."""
        yield _wrap(DEAD_LETTERS, record, windowed)


def on_accelerator(transform: beam.PTransform, accelerator: str | None) -> beam.PTransform:
    """``transform`` with Beam's ``accelerator`` resource hint, if ``accelerator`` is given
    (e.g. ``"type:nvidia-l4;count:1;install-nvidia-driver"``), else as it is.

    Put it on the step that runs the model, and keep what must meet (a row and its result)
    inside that step: a step with its own hint runs in its own environment, fused with no
    other.

    Example:
        >>> step = on_accelerator(beam.Map(len), None)
    """
    return transform.with_resource_hints(accelerator=accelerator) if accelerator else transform


def _embeddings(batch: pa.RecordBatch, id_column: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [batch.column(id_column), batch.column(_OUTPUT)], names=[id_column, EMBEDDING]
    )


class EmbedText(beam.PTransform):
    """Sentence embeddings of a text column: record batches in, record batches out.

    Each record batch is tokenized in one call and embedded by ``RunKernelOnArrow`` in
    token-length buckets or packed rows; the output holds the id column and ``embedding``
    (``fixed_size_list<float32, dim>``). Every row that cannot be embedded becomes one
    ``FailedElement`` keyed by its id (with its file and row where ``ReadArrowBatches`` read it).

    Example:
        >>> from beam_jax.text import EmbedText, SentenceEncoder
        >>> embed = EmbedText(SentenceEncoder.from_dir(), text_column="body", id_column="doc")
        >>> vectors, failed = batches | embed  # doctest: +SKIP

    Args:
        encoder: a ``beam_jax.text.SentenceEncoder`` (or an object with its ``spec``,
            kernels, ``load_params()``, ``max_length`` and ``tokenizer()``), a model
            directory, or ``None`` for the packaged all-MiniLM-L6-v2.
        text_column: the column of texts.
        id_column: the column that names each row (copied to the output and the dead
            letters' ``key``).
        batching: a ``Bucketing``, a ``Packing`` or what ``plan_packing`` returned; default
            buckets at powers of two up to the encoder's ``max_length``.
        compilation_cache_dir: JAX's persistent compilation cache, if any.
        precompile: compile every listed shape from each worker's start.
        accelerator: a Beam ``accelerator`` resource hint for the step that tokenizes and
            runs the model.
    """

    def __init__(
        self,
        encoder: SentenceEncoder | str | None = None,
        *,
        text_column: str = "text",
        id_column: str = "id",
        batching: Bucketing | Packing | PackingChoice | None = None,
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
        packed = isinstance(batching, Packing | PackingChoice)
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
            program_key=encoder.program_key(packed) if hasattr(encoder, "program_key") else None,
            precompile=precompile,
        ).with_exception_handling()

    def _on_accelerator(self, transform: beam.PTransform) -> beam.PTransform:
        return on_accelerator(transform, self.accelerator)

    def start_workers(self) -> beam.PTransform:
        """Apply to the pipeline: the model loads and its shapes compile from its start."""
        return self._on_accelerator(self.kernel.start_workers())

    def expand(self, batches):  # a RunKernelResult: no output type hint (Beam warns of it)
        refuse_beams_dask_runner(batches.pipeline, "EmbedText")
        tokenize = TokenizeBatches(
            self.encoder, text_column=self.text_column, id_column=self.id_column
        )
        step = beam.ParDo(EmbedBatches(tokenize, self.kernel)).with_output_types(pa.RecordBatch)
        step = self._on_accelerator(step).with_outputs(DEAD_LETTERS, main="results")
        outputs = batches | "TokenizeAndEmbed" >> step
        vectors = outputs.results | "Embeddings" >> beam.Map(
            _embeddings, self.id_column
        ).with_output_types(pa.RecordBatch)
        return RunKernelResult(vectors, outputs[DEAD_LETTERS])
