"""The flagship's columnar path: Arrow record batches from reading to writing, for Parquet.

Each file's rows are read as record batches of ``id`` and ``text`` (:class:`ReadColumns`),
tokenized a batch at a time into a ``list<int32>`` column of token ids
(:class:`TokenizeColumns`), embedded by ``beam_jax.RunKernelOnArrow`` in token-length
buckets, and written part by part (:mod:`pipelines.column_parts`), with no Python object
per row on the way: only rows that fail get one, their dead letter. The output, the dead
letters and the resumable parts are those of the per-element path (``--per_element``,
:mod:`pipelines.text_rows`); only the route differs. JSON lines keep the per-element path:
``pyarrow.json`` fails a whole block on one bad line, and a row's dead letter must name it.

Example:
    >>> build(pipeline, args, inputs, id_type, staging, done, bucketing)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

import beam_jax as bj
from pipelines import column_parts as cp
from pipelines import corpus, minilm
from pipelines import text_input as ti
from pipelines import text_parts as tp
from pipelines import text_rows as tr
from pipelines.embed_step import EmbedStep
from pipelines.input_files import Inputs

__all__ = ["EmbedTextColumns", "ReadColumns", "TokenizeColumns", "build"]

INPUT_IDS = "input_ids"
KEY = cp.KEY


class ReadColumns(beam.DoFn):
    """A file's index in; record batches of ``key``, ``id`` and ``text`` out.

    Reads Parquet with pyarrow as :class:`pipelines.text_input.ReadRows` does (the same
    batches of at most 1,024 rows of one part, the same parts skipped on a resume, the same
    :class:`~pipelines.text_input.UnreadableFile` for a file that fails), but keeps the
    columns as Arrow. Also reads the built-in corpus.

    Outputs: record batches (main); ``((file_index, part_start), PartIds)`` for each
    (``"parts"``); one ``UnreadableFile`` for a file that fails (``"unreadable"``).
    """

    PARTS = ti.ReadRows.PARTS
    UNREADABLE = ti.ReadRows.UNREADABLE

    def __init__(self, inputs: Inputs, part_rows: int, done: frozenset[tuple[int, int]]):
        if inputs.format not in ("parquet", "builtin"):
            raise ValueError(
                f"the columnar path reads Parquet or the built-in corpus, not {inputs.format}"
            )
        self._inputs = inputs
        self._part_rows = part_rows
        self._done = done

    def setup(self):
        self._unreadable = beam.metrics.Metrics.counter(tr.METRICS_NAMESPACE, "files_unreadable")

    def process(self, file_index: int) -> Iterator[Any]:
        part_rows, done = self._part_rows, self._done

        def wanted(position: int) -> bool:
            return (file_index, position // part_rows * part_rows) not in done

        if self._inputs.format == "parquet":
            path = self._inputs.files[file_index].path
            batches = ti.parquet_batches(path, part_rows, wanted, self._inputs.columns)
        else:
            batches = _builtin_batches(self._inputs.builtin_texts, part_rows, wanted)
        try:
            for start, batch in batches:
                positions = np.arange(start, start + batch.num_rows, dtype=np.int64)
                ids = batch.column("id")
                yield beam.pvalue.TaggedOutput(
                    self.PARTS,
                    ((file_index, start // part_rows * part_rows), cp.PartIds(positions, ids)),
                )
                keys = pa.array(positions | (file_index << cp.ROW_BITS))
                yield pa.RecordBatch.from_arrays(
                    [keys, ids, batch.column("text")], names=[KEY, "id", "text"]
                )
        except ti.FileFault as fault:
            self._unreadable.inc()
            error = fault.error
            yield beam.pvalue.TaggedOutput(
                self.UNREADABLE,
                ti.UnreadableFile(file_index, fault.position, type(error).__name__, str(error)),
            )


def _builtin_batches(n: int | None, part_rows: int, wanted) -> Iterator[tuple[int, Any]]:
    """The built-in corpus as ``parquet_batches`` gives a file: slabs of one part each."""
    texts = [t for _, t in corpus.builtin_corpus(n)]
    step, position = min(ti.ROWS_PER_BATCH, part_rows), 0
    while position < len(texts):
        stop = min(len(texts), position + step, (position // part_rows + 1) * part_rows)
        if wanted(position):
            ids = pa.array(range(position, stop), pa.int64())
            yield position, pa.record_batch({"id": ids, "text": texts[position:stop]})
        position = stop


def _valid_utf8(column: pa.Array) -> bool:
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return False
    try:
        column.validate(full=True)  # checks the UTF-8 of every value (SIMD, ~GB/s)
    except pa.ArrowInvalid:
        return False
    return True


class TokenizeColumns(beam.DoFn):
    """Checks and tokenizes a record batch of ``key``, ``id``, ``text`` with one tokenizer call.

    Emits a record batch of ``key`` and ``input_ids`` (``list<int32>``) for the good rows,
    and one ``FailedElement`` per bad row on ``dead_letters``, with the stage, error and
    message :class:`pipelines.text_rows.Tokenize` gives the same row. Where the batch's
    columns have the run's types and valid UTF-8 (the usual case), the checks are
    vectorised and only failing rows become Python objects; otherwise the batch is checked
    value by value, as the per-element path does.

    Args:
        id_type: The type every id must have.
        model_dir: The model directory, as for ``text_rows.local_model_dir``.
    """

    def __init__(self, id_type: tr.IdType, model_dir: str | None = None):
        self._id_type = id_type
        self._model_dir = model_dir

    def setup(self):
        self._tokenizer = minilm.Tokenizer(tr.local_model_dir(self._model_dir))
        counter = functools.partial(beam.metrics.Metrics.counter, tr.METRICS_NAMESPACE)
        self._rows = counter("rows")
        self._rejected = {s: counter(f"dead_letters_{s}") for s in (tr.VALIDATION, tr.TOKENIZE)}

    def process(self, batch: pa.RecordBatch) -> Iterator[Any]:
        self._rows.inc(batch.num_rows)
        keys = batch.column(KEY)
        ids, text = batch.column("id"), batch.column("text")
        if ids.type == self._id_type.arrow_type and _valid_utf8(text) and _ids_utf8(ids):
            problems = self._null_problems(ids, text)
            texts = None
        else:
            problems, texts = self._row_problems(ids, text)
        for row, (problem, value) in problems.items():
            error = bj.InvalidElementError(problem)
            yield self._dead(error, tr.VALIDATION, keys[row].as_py(), value)
        good = np.ones(batch.num_rows, bool)
        good[list(problems)] = False
        rows = np.flatnonzero(good)
        if not len(rows):
            return
        if texts is None:
            texts = (text if len(rows) == batch.num_rows else text.take(rows)).to_pylist()
        else:
            texts = [texts[r] for r in rows]
        cut = [j for j in np.flatnonzero(_char_lengths(texts) > tr.MAX_TOKENIZED_CHARS)]
        whole = {j: texts[j] for j in cut}
        for j in cut:
            texts[j] = tr.tokenizer_prefix(texts[j])
        flat, lengths, errors = self._encode(texts)
        for j in cut:
            if j not in errors and lengths[j] < self._tokenizer.max_length:
                errors[j] = tr.too_long_error(
                    len(whole[j]), len(texts[j]), int(lengths[j]), self._tokenizer.max_length
                )
        for j, error in sorted(errors.items()):
            if isinstance(error, bj.InvalidElementError) and not isinstance(
                error, tr.TextTooLongError
            ):
                stage = tr.VALIDATION
            else:
                stage = tr.TOKENIZE
            yield self._dead(error, stage, keys[int(rows[j])].as_py(), whole.get(j, texts[j]))
        offsets = np.zeros(len(lengths) + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        input_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
        out = pa.RecordBatch.from_arrays(
            [keys if len(rows) == batch.num_rows else keys.take(rows), input_ids],
            names=[KEY, INPUT_IDS],
        )
        if errors:
            keep = np.ones(len(rows), bool)
            keep[list(errors)] = False
            out = out.filter(pa.array(keep))
        if out.num_rows:
            yield out

    def _null_problems(self, ids: pa.Array, text: pa.Array) -> dict[int, tuple[str, Any]]:
        """The rows with a null id or text (the only problems a typed, valid batch can have)."""
        if not ids.null_count and not text.null_count:
            return {}
        null = ids.is_null().to_numpy(zero_copy_only=False)
        null |= text.is_null().to_numpy(zero_copy_only=False)
        problems = {}
        for row in np.flatnonzero(null).tolist():
            value = text[row].as_py()
            problems[row] = (tr.row_problem(self._id_type, ids[row].as_py(), value), value)
        return problems

    def _row_problems(self, ids: pa.Array, text: pa.Array):
        """Every row checked as the per-element path checks it; returns the texts too."""
        id_values, id_problems = ti.python_values(ids, "id")
        texts, text_problems = ti.python_values(text, "text")
        problems = {}
        for row, (key, value, a, b) in enumerate(
            zip(id_values, texts, id_problems, text_problems, strict=True)
        ):
            problem = tr.row_problem(self._id_type, key, value, a or b)
            if problem is not None:
                problems[row] = (problem, value)
        return problems, texts

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, dict[int, Exception]]:
        """Token ids of ``texts`` (flat, and counts); a text the tokenizer rejects gets
        count 0 and its exception in the third value."""
        try:
            flat, lengths = self._tokenizer.encode_flat(texts)
            return flat, lengths, {}
        except Exception:  # noqa: BLE001 - one bad text: find it, keep the others
            pass
        pieces, lengths, errors = [], np.zeros(len(texts), np.int64), {}
        for j, text in enumerate(texts):
            problem = tr.unicode_problem(text, "text")
            if problem is not None:
                errors[j] = bj.InvalidElementError(problem)
                continue
            try:
                ids, _ = self._tokenizer.encode_flat([text])
            except Exception as e:  # noqa: BLE001 - the tokenizer's message, as a dead letter
                errors[j] = e
                continue
            pieces.append(ids)
            lengths[j] = len(ids)
        flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
        return flat, lengths, errors

    def _dead(self, error: Exception, stage: str, key: Any, text: Any):
        self._rejected[stage].inc()
        record = bj.FailedElement.from_exception(error, stage=stage, element=text, key=key)
        return beam.pvalue.TaggedOutput(tr.DEAD_LETTERS, record)


def _ids_utf8(ids: pa.Array) -> bool:
    return pa.types.is_integer(ids.type) or _valid_utf8(ids)


def _char_lengths(texts: list[str]) -> np.ndarray:
    return np.fromiter(map(len, texts), np.int64, len(texts))


class EmbedTextColumns(EmbedStep):
    """Record batches of ``key``, ``id``, ``text`` in; record batches of ``key`` and
    ``output`` (``fixed_size_list<float32, 384>``) and ``FailedElement``s out.

    Example:
        >>> results, dead = batches | EmbedTextColumns(id_type, bucketing=b)  # doctest: +SKIP

    Args:
        id_type: The type every id must have.
        bucketing: Token-length buckets and batch sizes.
        model_dir: See ``text_rows.local_model_dir``.
        compilation_cache_dir: JAX's persistent compilation cache, if any.
        precompile: compile every listed shape in background threads from each worker's
            start.
        accelerator: A Beam ``accelerator`` resource hint for the kernel step only.
    """

    def __init__(
        self,
        id_type: tr.IdType,
        *,
        bucketing: bj.Bucketing,
        model_dir: str | None = None,
        compilation_cache_dir: str | None = None,
        precompile: bool = False,
        accelerator: str | None = None,
    ):
        super().__init__(
            TokenizeColumns(id_type, model_dir),
            bj.RunKernelOnArrow(
                minilm.embed_element,
                spec={INPUT_IDS: bj.ArraySpec(("L",), np.int32)},
                columns=bj.ArrowColumns(leaves={INPUT_IDS: INPUT_IDS}, id=KEY),
                bucketing=bucketing,
                load_params=functools.partial(tr.load_params, model_dir),
                compilation_cache_dir=compilation_cache_dir,
                precompile=precompile,
            ).with_exception_handling(),
            tokens_type=pa.RecordBatch,
            accelerator=accelerator,
        )
        self.id_type = id_type
        self.bucketing = bucketing
        self.model_dir = model_dir
        self.compilation_cache_dir = compilation_cache_dir


def build(
    pipeline: beam.Pipeline,
    args: Any,
    inputs: Inputs,
    id_type: tr.IdType,
    staging: str,
    done: frozenset[tuple[int, int]],
    launch: Any,
) -> tuple[EmbedTextColumns, Any, Any]:
    """Adds the columnar job to ``pipeline``: read, embed, write parts and unreadable files.

    Args:
        pipeline: The pipeline to add to.
        args: The parsed flags of ``pipelines.embed_text``.
        inputs: The run's inputs (Parquet or the built-in corpus).
        id_type: The run's id type.
        staging: The run's staging directory.
        done: Parts already written, skipped.
        launch: The launch plan (``pipelines.embed_text_plan``): the embedding step's
            buckets, and whether its planned shapes compile at worker start.

    Returns:
        The embedding transform (whose worker the caller may start early), and its results
        (record batches) and dead letters.
    """
    part_rows = args.rows_per_part
    reads = (
        pipeline
        | "Files" >> beam.Create(range(len(inputs.files)))
        | "SpreadFiles" >> beam.Reshuffle()
        | "Read"
        >> beam.ParDo(ReadColumns(inputs, part_rows, done))
        .with_output_types(pa.RecordBatch)
        .with_outputs(ReadColumns.PARTS, ReadColumns.UNREADABLE, main="batches")
    )
    # One file's batches spread over all workers, as a splittable source's would.
    batches = reads.batches | "SpreadBatches" >> beam.Reshuffle()
    embed = EmbedTextColumns(
        id_type,
        bucketing=launch.bucketing,
        model_dir=args.model_dir,
        compilation_cache_dir=args.compilation_cache_dir,
        precompile=launch.planned,
        accelerator=args.accelerator,
    )
    results, dead = batches | "EmbedTexts" >> embed
    _ = (
        {
            "rows": reads[ReadColumns.PARTS],
            "results": results
            | "ResultsByPart" >> beam.FlatMap(cp.results_by_part, part_rows=part_rows),
            "dead": dead | "DeadByPart" >> beam.Map(cp.dead_by_part, part_rows=part_rows),
        }
        | "GroupByPart" >> beam.CoGroupByKey()
        | "WriteParts"
        >> beam.ParDo(cp.WritePartColumns(staging, inputs, tr.output_schema(id_type)))
        # A consumer for the parts' names, as in the per-element path: the local FnApiRunner
        # then fails when a worker dies in WriteParts instead of waiting for it forever.
        | "CountParts" >> beam.combiners.Count.Globally()
    )
    _ = reads[ReadColumns.UNREADABLE] | "WriteUnreadable" >> beam.ParDo(
        tp.WriteUnreadable(staging, inputs)
    )
    return embed, results, dead
