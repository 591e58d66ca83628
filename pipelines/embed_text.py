"""Sentence embeddings with all-MiniLM-L6-v2, in JAX, from Parquet or JSON lines to Parquet.

Reads rows of ``id`` and ``text`` file by file (:mod:`pipelines.text_input`), tokenizes them
in batches with the Rust tokenizer (truncating at 256 tokens, as sentence-transformers does),
embeds them with the pure-JAX encoder of :mod:`pipelines.minilm` in token-length buckets
through ``beam_jax.RunKernel``, and writes ``id`` + ``embedding`` (``list<float32>``, 384
values) to Parquet in parts named by input file and row range (:mod:`pipelines.text_parts`).
Parquet and the built-in corpus take the columnar path (:mod:`pipelines.embed_columnar`):
Arrow record batches through ``beam_jax.RunKernelOnArrow``, the same output;
``--per_element`` takes them the per-element way, as JSON lines always go.
Every row that cannot be embedded becomes one JSON line under ``OUTPUT/_failed/``, and every
file that cannot be read one line naming it. The parts are staged and published only when the
job succeeds (:class:`beam_jax.jobs.OutputDir`); a rerun resumes. See docs/embed_text.md.

Example:
    >>> summary = run(["--builtin_texts", "50", "--output", "/tmp/embed"])  # doctest: +SKIP
    >>> summary.conserved  # doctest: +SKIP
    True

Run it::

    python -m pipelines.embed_text                                  # the built-in corpus
    python -m pipelines.embed_text --input 'data/*.parquet' --output out/
    python -m pipelines.embed_text --input gs://b/in/*.jsonl --output gs://b/out \\
        --runner DataflowRunner --project P --region R --temp_location gs://b/tmp \\
        --setup_file ./setup.py --sdk_container_image IMAGE
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import DebugOptions, StandardOptions

import beam_jax as bj
from beam_jax import jobs
from beam_jax.jobs import OutputDir, OutputExistsError, RunConsole, failure_line, verbose_requested
from pipelines import dataflow_job, embed_columnar, embed_text_plan, minilm
from pipelines import input_files as inp
from pipelines import text_input as ti
from pipelines import text_parts as tp
from pipelines import text_rows as tr
from pipelines.embed_step import EmbedStep
from pipelines.embed_text_flags import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BUCKETS,
    DEFAULT_CACHE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_OUTPUT,
    parse_args,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_CACHE",
    "DEFAULT_OUTPUT",
    "EmbedTextSummary",
    "EmbedTexts",
    "parse_args",
    "run",
]


class EmbedTexts(EmbedStep):
    """Sentence embeddings (all-MiniLM-L6-v2 in JAX) as a PTransform, for your own pipeline.

    ``RowBatch``es in; ``(key, float32[384])`` results and ``FailedElement``s out.
    :meth:`from_pairs` takes ``(id, text)`` pairs instead, as most pipelines have them.
    A row's key is its id, unless the batch gives ``keys`` (this job's are ``(file, row)`` tuples,
    so that each result finds its output part); dead letters carry the same key.

    Example:
        >>> pairs = p | beam.Create([(1, "Beam batches records."), (2, "")])  # doctest: +SKIP
        >>> vectors, failed = pairs | EmbedTexts.from_pairs("int")  # doctest: +SKIP
        >>> vectors | beam.Map(print)  # (1, array([...], dtype=float32)) # doctest: +SKIP

    Args:
        id_type: The type every id must have.
        bucketing: Token-length buckets and batch sizes; defaults to this module's.
        model_dir: See ``text_rows.local_model_dir``.
        compilation_cache_dir: JAX's persistent compilation cache, if any.
        precompile: compile every listed shape in background threads from each worker's
            start, while it reads and tokenizes (for planned buckets, whose shapes are
            all used; fixed buckets list every power-of-two batch size).
        accelerator: A Beam ``accelerator`` resource hint (on Dataflow e.g.
            ``"type:nvidia-l4;count:1;install-nvidia-driver"``) for the embedding kernel
            only; tokenizing stays on the default workers.
    """

    def __init__(
        self,
        id_type: tr.IdType,
        *,
        bucketing: bj.Bucketing | None = None,
        model_dir: str | None = None,
        compilation_cache_dir: str | None = None,
        precompile: bool = False,
        accelerator: str | None = None,
    ):
        bucketing = bucketing or bj.Bucketing(
            boundaries={"L": DEFAULT_BUCKETS},
            batch_size=DEFAULT_BATCH_SIZE,
            max_padded_size=DEFAULT_MAX_TOKENS,
        )
        super().__init__(
            tr.Tokenize(id_type, model_dir),
            bj.RunKernel(
                minilm.embed_element,
                spec={"input_ids": bj.ArraySpec(("L",), np.int32)},
                bucketing=bucketing,
                load_params=functools.partial(tr.load_params, model_dir),
                keyed=True,
                compilation_cache_dir=compilation_cache_dir,
                precompile=precompile,
            ).with_exception_handling(),
            accelerator=accelerator,
        )
        self.id_type = id_type
        self.bucketing = bucketing
        self.model_dir = model_dir
        self.compilation_cache_dir = compilation_cache_dir

    @classmethod
    def from_pairs(
        cls, id_type: str = "int", *, rows_per_batch: int = 256, **kwargs: Any
    ) -> beam.PTransform:
        """``(id, text)`` pairs in; ``(id, float32[384])`` results and dead letters out.

        Args:
            id_type: ``"int"`` or ``"string"``: the type every id must have (a row whose id
                is not is a dead letter).
            rows_per_batch: Rows tokenized together (one tokenizer call).
            **kwargs: As for the constructor (``bucketing``, ``model_dir``,
                ``compilation_cache_dir``, ``precompile``, ``accelerator``).

        Returns:
            A transform whose output unpacks as ``results, dead_letters``.
        """
        if not isinstance(rows_per_batch, int) or rows_per_batch < 1:
            raise ValueError(f"rows_per_batch must be a positive int, got {rows_per_batch!r}")
        return _EmbedPairs(cls(tr.IdType.from_name(id_type), **kwargs), rows_per_batch)


class _EmbedPairs(beam.PTransform):
    """``(id, text)`` pairs batched into ``RowBatch``es, then ``EmbedTexts``."""

    def __init__(self, embed: EmbedTexts, rows_per_batch: int):
        super().__init__()
        self._embed = embed
        self._rows_per_batch = rows_per_batch

    def expand(self, pairs):
        batches = (
            pairs
            | "Batch" >> beam.BatchElements(max_batch_size=self._rows_per_batch)
            | "RowBatches" >> beam.Map(tr.RowBatch.from_pairs)
        )
        return batches | "EmbedTexts" >> self._embed


@dataclasses.dataclass(frozen=True)
class EmbedTextSummary:
    """What a finished run did.

    Attributes:
        rows: Input rows read (blank JSON lines are not rows).
        results: Embeddings written.
        dead_letters: Rows written to ``_failed/``, total and per stage.
        padding_ratio: Padded / real tokens, counting padded batch rows.
        compiles: Batch shapes compiled (per worker process, summed).
        compile_seconds: Time spent compiling them, summed over compiles (most run in
            background threads while the job reads and tokenizes).
        batches: Kernel calls.
        wall_seconds: From ``run()`` called to the pipeline finished.
        kernel: The ``beam_jax.Summary`` of the embedding step alone.
        unreadable_files: Files whose reading failed (each has one dead letter naming it).
        parts_written: Output parts written by this run.
        parts_reused: Parts found written by an earlier, unfinished run of the same job.
    """

    rows: int
    results: int
    dead_letters: int
    dead_letters_by_stage: dict[str, int]
    padding_ratio: float
    compiles: int
    compile_seconds: float
    batches: int
    wall_seconds: float
    kernel: bj.Summary
    unreadable_files: int = 0
    parts_written: int = 0
    parts_reused: int = 0
    compile_wait_seconds: float = 0.0

    @property
    def sentences_per_second(self) -> float:
        return self.results / self.wall_seconds if self.wall_seconds > 0 else float("nan")

    @property
    def conserved(self) -> bool:
        """Whether every row ended as exactly one embedding or one dead letter."""
        return self.rows == self.results + self.dead_letters

    def totals(self) -> bj.Summary:
        """The whole job as a ``beam_jax.Summary`` (rows in), for ``assert_conserved``."""
        return dataclasses.replace(
            self.kernel,
            elements=self.rows,
            results=self.results,
            dead_letters=self.dead_letters,
            dead_letters_by_stage=dict(self.dead_letters_by_stage),
        )

    def __str__(self) -> str:
        stages = ", ".join(f"{k} {v}" for k, v in self.dead_letters_by_stage.items() if v)
        files = f", {self.unreadable_files} unreadable files" if self.unreadable_files else ""
        resumed = f"; resumed after {self.parts_reused} parts" if self.parts_reused else ""
        return (
            f"embed_text: {self.rows} rows -> {self.results} embeddings, "
            f"{self.dead_letters} dead letters{f' ({stages})' if stages else ''}{files}"
            f"{resumed}; "
            f"padding {self.padding_ratio:.2f}x over {self.batches} batches; "
            f"{self.compiles} compiles ({self.compile_seconds:.1f} s, "
            f"{self.compile_wait_seconds:.1f} s of it waited for); "
            f"{self.sentences_per_second:.1f} sentences/s, {self.wall_seconds:.1f} s wall"
        )


def _build(
    pipeline,
    args,
    inputs: inp.Inputs,
    id_type: tr.IdType,
    staging: str,
    done,
    launch,
    progress_dir: str | None = None,
):
    """Adds the job to ``pipeline``; returns its embedding transform (to start its worker)."""
    if inputs.format != "jsonl" and not args.per_element:
        embed, results, dead = embed_columnar.build(
            pipeline, args, inputs, id_type, staging, done, launch
        )
        count = len  # record batches of results
    else:
        embed, results, dead = _build_per_element(
            pipeline, args, inputs, id_type, staging, done, launch
        )
        count = None
    if progress_dir is not None:  # counted by the workers, printed by the driver
        _ = results | "ProgressDone" >> beam.ParDo(
            jobs.CountProgress(progress_dir, "done", size=count)
        )
        _ = dead | "ProgressDead" >> beam.ParDo(jobs.CountProgress(progress_dir, "dead"))
    if launch.planned and not embed_text_plan.in_process(pipeline.options):
        # The model loads and the planned shapes compile while the input is read (in the
        # pipeline's first stage; in-process runners start it in run()).
        _ = pipeline | "StartEmbedWorker" >> embed.start_workers()
    return embed


def _build_per_element(
    pipeline, args, inputs: inp.Inputs, id_type: tr.IdType, staging: str, done, launch
) -> tuple[EmbedTexts, Any, Any]:
    reads = (
        pipeline
        | "Files" >> beam.Create(range(len(inputs.files)))
        | "SpreadFiles" >> beam.Reshuffle()
        | "Read"
        >> beam.ParDo(ti.ReadRows(inputs, args.rows_per_part, done)).with_outputs(
            ti.ReadRows.PARTS, ti.ReadRows.UNREADABLE, main="batches"
        )
    )
    # One file's batches spread over all workers, as a splittable source's would.
    batches = reads.batches | "SpreadBatches" >> beam.Reshuffle()
    embed = EmbedTexts(
        id_type,
        bucketing=launch.bucketing,
        model_dir=args.model_dir,
        compilation_cache_dir=args.compilation_cache_dir,
        precompile=launch.planned,
        accelerator=args.accelerator,
    )
    results, dead = batches | "EmbedTexts" >> embed
    by_part = functools.partial(tp.by_part, part_rows=args.rows_per_part)
    _ = (
        {
            "rows": reads[ti.ReadRows.PARTS],
            "results": results | "ResultsByPart" >> beam.Map(by_part),
            "dead": dead | "DeadByPart" >> beam.Map(by_part),
        }
        | "GroupByPart" >> beam.CoGroupByKey()
        | "WriteParts" >> beam.ParDo(tp.WriteParts(staging, inputs, tr.output_schema(id_type)))
        # A consumer for the parts' names: the local FnApiRunner then reads WriteParts'
        # output, and so fails when a worker dies there, instead of waiting for it forever
        # (measured: a SIGKILL in WriteParts hung a multi-process run, Beam 2.77).
        | "CountParts" >> beam.combiners.Count.Globally()
    )
    _ = reads[ti.ReadRows.UNREADABLE] | "WriteUnreadable" >> beam.ParDo(
        tp.WriteUnreadable(staging, inputs)
    )
    return embed, results, dead


def _summarize(result, wall_seconds: float, parts_reused: int) -> EmbedTextSummary:
    kernel = bj.summarize(result)
    ours = bj.metric_totals(result, tr.METRICS_NAMESPACE)
    by_stage = {
        tr.VALIDATION: ours.get(f"dead_letters_{tr.VALIDATION}", 0)
        + kernel.dead_letters_by_stage.get(tr.VALIDATION, 0),
        tr.TOKENIZE: ours.get(f"dead_letters_{tr.TOKENIZE}", 0),
        **{s: n for s, n in kernel.dead_letters_by_stage.items() if s != tr.VALIDATION},
    }
    return EmbedTextSummary(
        rows=ours.get("rows", 0),
        results=kernel.results,
        dead_letters=sum(by_stage.values()),
        dead_letters_by_stage=by_stage,
        padding_ratio=kernel.padding_ratio,
        compiles=kernel.compiles,
        compile_seconds=kernel.compile_seconds,
        batches=kernel.batches,
        wall_seconds=wall_seconds,
        kernel=kernel,
        unreadable_files=ours.get("files_unreadable", 0),
        parts_written=ours.get("parts_written", 0),
        parts_reused=parts_reused,
        compile_wait_seconds=kernel.compile_wait_seconds,
    )


def _check_threshold(summary, threshold, files: int, output: OutputDir, reused) -> None:
    results, dead = tp.part_counts(output.staging, reused) if reused else (0, 0)
    rows, dead = summary.rows + results + dead, summary.dead_letters + dead
    over = [
        f"{bad} of {total} {what} failed ({bad / total:.2%})"
        for bad, total, what in ((dead, rows, "rows"), (summary.unreadable_files, files, "files"))
        if total and bad / total > threshold
    ]
    if over:
        path, count = output.collect_dead_letters()
        raise bj.DeadLetterThresholdError(
            f"{' and '.join(over)}, more than --threshold {threshold:g}. Nothing was published: "
            f"the earlier files in {output.path} (if any) are untouched. The {count} dead "
            f"letters are in {path}. Fix the data and rerun with --overwrite, or rerun with a "
            f"higher --threshold to publish the parts already written in {output.staging} "
            "without recomputing them"
        )


def _explain_failure(error: Exception, output: OutputDir, parts_reused: int) -> None:
    try:
        path, count = output.collect_dead_letters()
        parts = len(output.staged_parts())
    except Exception:  # noqa: BLE001 - the job's own error matters more than this note
        return
    error.add_note(
        f"embed_text: the job failed, so nothing was published; the earlier files in "
        f"{output.path} (if any) are untouched. {parts} parts are kept in {output.staging} "
        f"({parts_reused} from earlier runs), and rerunning the same command resumes from them. "
        f"Their {count} dead letters so far are in {path}."
    )


def _dry_run(args, options, inputs: inp.Inputs, id_type: tr.IdType, output: OutputDir) -> None:
    """Builds the job for its runner without running it (Beam's ``--dry_run=True``)."""
    launch = embed_text_plan.plan_for(args, inputs, embed_text_plan.local_devices(options))
    print(launch, flush=True)
    pipeline = beam.Pipeline(options=options)  # validates the options for the runner
    _build(pipeline, args, inputs, id_type, output.staging, frozenset(), launch)
    result = pipeline.run()  # DataflowRunner: translated and packaged, not submitted
    path = options.view_as(DebugOptions).dataflow_job_file
    if path and hasattr(result, "job"):
        dataflow_job.write_job_file(dataflow_job.job_description(result), path)
    print(
        f"embed_text: dry run: the job was built for {options.view_as(StandardOptions).runner} "
        f"and not run{f'; its description is in {path}' if path else ''}; nothing was "
        f"written to {output.path}",
        flush=True,
    )


def run(argv: Sequence[str] | None = None) -> EmbedTextSummary | None:
    """Runs the job to completion, publishes its output, prints a summary and returns it.

    Args:
        argv: Command-line flags (see ``python -m pipelines.embed_text --help``); Beam's
            flags pass through. ``None`` reads ``sys.argv``.

    Returns:
        The run's counts, padding, compiles and throughput; ``None`` with Beam's
        ``--dry_run=True``, which builds the job for its runner (options validated, the
        ``--setup_file`` package built) and writes the Dataflow job description to
        ``--dataflow_job_file``, if given, without running or submitting anything.

    Raises:
        SystemExit: On an unknown flag or a bad value.
        FileNotFoundError: If ``--input`` matches no file.
        ValueError: If no Parquet input file has the columns.
        beam_jax.jobs.OutputExistsError: If ``--output`` holds files and no
            ``--overwrite`` was given.
        beam_jax.DeadLetterThresholdError: If more rows or files failed than
            ``--threshold`` allows; nothing is published, and the message names the file
            holding the dead letters.
    """
    started = time.perf_counter()
    args, options = parse_args(argv)
    # A tampered or incomplete model fails the launch, naming the file.
    tr.local_model_dir(args.model_dir)
    if args.input is None:
        inputs = inp.builtin_inputs(args.builtin_texts)
    else:
        inputs = dataclasses.replace(
            inp.match_inputs(args.input), id_column=args.id_column, text_column=args.text_column
        )
    id_type = inp.id_type_of(inputs, args.id_type)
    output = OutputDir(args.output, layout=tp.LAYOUT)
    job = {
        "inputs": inputs.describe(),
        "id_type": str(id_type.arrow_type),
        "rows_per_part": args.rows_per_part,
        "model_dir": args.model_dir,
        "max_tokenized_chars": tr.MAX_TOKENIZED_CHARS,
    }
    if dataflow_job.dry_run(options):
        return _dry_run(args, options, inputs, id_type, output)
    reused = output.prepare(job, overwrite=args.overwrite)
    launch = embed_text_plan.plan_for(args, inputs, embed_text_plan.local_devices(options))
    print(launch, flush=True)
    pipeline = beam.Pipeline(options=options)
    console = RunConsole("embed_text", args, options, output.path)
    done = tp.done_parts(reused, inputs)
    embed = _build(
        pipeline, args, inputs, id_type, output.staging, done, launch, console.progress_dir
    )
    try:
        with console:
            if launch.planned and embed_text_plan.in_process(options):
                # This process runs the pipeline: the model loads and the planned shapes
                # compile while Beam starts and reads the input.
                embed.start_worker_here()
            result = pipeline.run()
            result.wait_until_finish()
    except Exception as e:
        _explain_failure(e, output, len(reused))
        raise
    finally:
        embed.forget_worker_here()
    summary = _summarize(result, time.perf_counter() - started, len(reused))
    print(summary, flush=True)
    _check_threshold(summary, args.threshold, len(inputs.files), output, reused)
    output.publish({"job": job, "summary": str(summary)})
    jobs.write_metrics(jobs.metrics_record("embed_text", summary, result), output.path)
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    try:
        run(argv)
    except (OutputExistsError, FileNotFoundError, bj.DeadLetterThresholdError) as e:
        # Errors about the user's files, whose message says what to do: no traceback.
        sys.exit(f"embed_text: {type(e).__name__}: {e}")
    except Exception as e:
        if verbose_requested(argv):
            raise
        sys.exit(failure_line("embed_text", e))


if __name__ == "__main__":
    # Re-import under the package name, so the DoFns and functions that Beam pickles refer
    # to `pipelines.embed_text`, which workers can import, and not to `__main__`.
    from pipelines import embed_text

    embed_text.main()
