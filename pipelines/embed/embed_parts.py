"""The job's one step per part: tokenize, embed and write it (``beam_jax.text.EmbedBatches``
with :func:`tokenize_parts` and a :class:`~pipelines.embed.write.PartWriter`).

One DoFn makes the job correct however a runner fuses steps: a part's rows, results and
dead letters meet in the instance that opened it. The ``accelerator`` hint goes on this step.

Example:
    >>> step = EmbedParts(tokenize, kernel, writer, progress_dir)  # doctest: +SKIP
    >>> names = parts | beam.ParDo(step)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa

from beam_jax import jobs
from beam_jax.text import EmbedBatches, IdType, TokenizeBatches
from pipelines.embed.parts import KEY, METRICS_NAMESPACE, Part
from pipelines.embed.write import PartWriter

_WINDOW, _TIMESTAMP = beam.DoFn.WindowParam, beam.DoFn.TimestampParam


def tokenize_parts(id_type: pa.DataType, model, text_column: str = "text") -> TokenizeBatches:
    """The tokenize step, one tokenizer call per part: ``key`` and ``input_ids`` out; ids
    checked against the run's type; dead letters keyed by the id, with file and row;
    ``rows`` and dead letters counted in the job's metrics."""
    return TokenizeBatches(
        model,
        id_type=IdType(id_type),
        carry=KEY,
        metrics_namespace=METRICS_NAMESPACE,
        text_name=text_column,  # the read step names the input's text column "text"
    )


class EmbedParts(EmbedBatches):
    """Parts in (record batches of ``key``, ``id``, ``text``, one part each); each part's
    files written once every row of it has an embedding or a dead letter; its name out.

    Args:
        tokenize: The tokenize step (:func:`tokenize_parts`).
        kernel: The embedding step (``pipelines.embed.job.embed_kernel``).
        writer: Writes the parts.
        progress: The driver's progress directory (rows done and dead), if any.
    """

    def __init__(self, tokenize, kernel, writer: PartWriter, progress: str | None = None):
        super().__init__(tokenize, kernel)
        self._writer = writer
        self._progress = progress

    def setup(self):
        super().setup()
        self._writer.setup()
        self._bad_lines = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "lines_unreadable")
        # Rows done and dead, counted by the workers, printed by the driver.
        fields = ("done", "dead") if self._progress is not None else ()
        self._counts = [jobs.CountProgress(self._progress, f, size=int) for f in fields]
        for count in self._counts:
            count.setup()

    def start_bundle(self):
        super().start_bundle()
        self._writer.start_bundle()

    def process(self, batch: pa.RecordBatch, window=_WINDOW, timestamp=_TIMESTAMP) -> Iterator[Any]:
        self._where = (window, timestamp)  # for the outputs of what the tokenizer refuses now
        part = Part.of(batch)
        self._writer.open(part)
        self._bad_lines.inc(len(part.bad_lines))
        for record in part.bad_lines:  # JSON lines that are no row: the part's dead letters
            yield from self._names(self._writer.add_dead(record, self._where))
        if batch.num_rows:
            yield from self._names(super().process(batch, window, timestamp))

    def finish_bundle(self) -> Iterator[Any]:
        yield from self._names(super().finish_bundle())
        yield from self._names(self._writer.finish_bundle())
        for count in self._counts:
            count.finish_bundle()

    def teardown(self):
        super().teardown()
        self._writer.teardown()

    def _names(self, written: Iterator[Any]) -> Iterator[Any]:
        """The parts' names (each a ``WindowedValue``), their rows counted as progress."""
        for out in written:
            name, results, dead = out.value
            for count, n in zip(self._counts, (results, dead), strict=False):
                count.process(n)
            yield out.with_value(name)

    def _at(self, windowed) -> tuple:
        return self._where if windowed is None else (windowed.windows[0], windowed.timestamp)

    def results(self, batch, windowed) -> Iterator[Any]:
        yield from self._writer.add_results(batch, self._at(windowed))

    def tokenizer_dead_letter(self, record, windowed) -> Iterator[Any]:
        yield from self._writer.add_dead(record, self._at(windowed))

    def kernel_dead_letter(self, record, windowed) -> Iterator[Any]:
        yield from self._writer.add_kernel_dead(record, self._at(windowed))
