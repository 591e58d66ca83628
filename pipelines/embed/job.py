"""The flagship's job graph and run: resume, staged publishing, threshold, summary (the
route: the package's docstring and docs/embed_text.md).

Example:
    >>> summary = run(["--builtin_texts", "50", "--output", "/tmp/embed"])  # doctest: +SKIP
    >>> summary.conserved  # doctest: +SKIP
    True
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import StandardOptions

import beam_jax as bj
from beam_jax import jobs
from beam_jax.jobs import OutputDir, RunConsole, on_accelerator
from beam_jax.text import INPUT_IDS, MAX_TOKENIZED_CHARS, TOKENIZE, SentenceEncoder
from pipelines.embed import plan as launch_plan
from pipelines.embed import write
from pipelines.embed.embed_parts import EmbedParts, tokenize_parts
from pipelines.embed.flags import DEFAULT_OUTPUT, parse_args
from pipelines.embed.parts import KEY, METRICS_NAMESPACE, Inputs
from pipelines.embed.read import ReadParts

__all__ = ["DEFAULT_OUTPUT", "EmbedTextSummary", "Encoder", "embed_kernel", "run"]


@dataclasses.dataclass(frozen=True)
class EmbedTextSummary:
    """What a finished run did: rows read (blank JSON lines are not rows), embeddings and
    dead letters written (total and per stage), padding (padded / real tokens), compiles
    (per worker process, summed) and their seconds, kernel calls, wall seconds, the
    embedding step's ``beam_jax.Summary``, unreadable files, parts written and reused from
    an earlier unfinished run, how the batches were shaped (packed or buckets) and why."""

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
    batching: str = "buckets"
    batching_reason: str = ""

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
        n = jobs.counted
        files = f", {n(self.unreadable_files, 'unreadable file')}" if self.unreadable_files else ""
        resumed = f"; resumed after {n(self.parts_reused, 'part')}" if self.parts_reused else ""
        # No batch, no ratio (NaN): "padding -", as beam-jax report shows a missing figure.
        padding = f"{self.padding_ratio:.2f}x" if math.isfinite(self.padding_ratio) else "-"
        return (
            f"embed_text: {n(self.rows, 'row')} -> {n(self.results, 'embedding')}, "
            f"{n(self.dead_letters, 'dead letter')}{f' ({stages})' if stages else ''}{files}"
            f"{resumed}; {'packed' if self.batching == 'packed' else 'bucketed'}, padding "
            f"{padding} over {n(self.batches, 'batch')}; "
            f"{n(self.compiles, 'compile')} ({self.compile_seconds:.1f} s, "
            f"{self.kernel.compile_trace_seconds:.1f} s of it tracing, "
            f"{self.compile_wait_seconds:.1f} s waited for); "
            f"results waited for {self.kernel.result_wait_seconds:.1f} s; "
            f"{self.sentences_per_second:.1f} sentences/s, {self.wall_seconds:.1f} s wall"
        )


@dataclasses.dataclass(frozen=True)
class Encoder:
    """Functions that replace the model's in the embedding step (``None`` keeps the model's),
    e.g. a kernel that takes no time, to measure the host alone (``bench/embed.py --variants
    host_only``): ``element_fn`` for token-length buckets, ``packed_fn`` for packed rows,
    ``load_params`` on each worker."""

    element_fn: Any = None
    packed_fn: Any = None
    load_params: Any = None


def embed_kernel(
    args, model: SentenceEncoder, launch: launch_plan.LaunchPlan, encoder=Encoder()
) -> bj.RunKernelOnArrow:
    """The embedding step: ``key`` and ``input_ids`` in, ``key`` and ``output`` out,
    bucketed or packed as ``launch`` says."""
    packed = launch.packing is not None
    name = "packed_fn" if packed else "element_fn"
    fn = getattr(encoder, name) or getattr(model, name)
    return bj.RunKernelOnArrow(
        fn,
        spec=model.spec,
        columns=bj.ArrowColumns(leaves={INPUT_IDS: INPUT_IDS}, id=KEY),
        bucketing=launch.bucketing,
        packing=launch.packing,
        load_params=encoder.load_params or model.load_params,
        compilation_cache_dir=args.compilation_cache_dir,
        # The model's own kernel is stored whole in the cache; a replacement is not.
        program_key=model.program_key(packed) if fn == getattr(model, name) else None,
        precompile=launch.planned,
        chunk_units=args.tokens_per_chunk or None,
    ).with_exception_handling()


def _build(
    pipeline, args, model, inputs, id_type, staging, done, launch, progress=None, encoder=None
):
    """Adds the job (the route in the package docstring) to ``pipeline``, skipping the parts
    in ``done``; returns its embedding transform (to start its worker)."""
    spread = not jobs.single_worker_here(pipeline.options)
    read = ReadParts(inputs, args.rows_per_part, done, id_type, spread=spread)
    parts, unreadable = pipeline | "Read" >> read
    embed = embed_kernel(args, model, launch, encoder or Encoder())
    tokenize = tokenize_parts(id_type, model, inputs.text_column)
    writer = write.PartWriter(staging, inputs, jobs.embeddings_schema(id_type, inputs.carried))
    step = beam.ParDo(EmbedParts(tokenize, embed, writer, progress))
    names = parts | "Embed" >> on_accelerator(step, args.accelerator)
    # A consumer across a shuffle: the local FnApiRunner then fails when a worker dies
    # there instead of waiting forever (a SIGKILL in the writing step hung it, Beam 2.77).
    _ = names | "KeyPartNames" >> beam.WithKeys(None) | "GatherPartNames" >> beam.GroupByKey()
    written = unreadable | "WriteUnreadable" >> beam.ParDo(write.WriteUnreadable(staging, inputs))
    if progress is not None:  # counted by the workers, printed by the driver
        _ = written | "CountUnreadable" >> beam.ParDo(jobs.CountProgress(progress, "unreadable"))
    if launch.planned and not jobs.workers_here(pipeline.options):
        # The model loads and the planned shapes compile while the input is read (in the
        # first stage; where the workers run in this process, run() starts it).
        _ = pipeline | "StartEmbedWorker" >> on_accelerator(embed.start_workers(), args.accelerator)
    return embed


def _id_type(args, inputs: Inputs) -> pa.DataType:
    """``--id_type`` (checked against the input), or the input's (the built-in corpus: int64)."""
    given = {"int": pa.int64(), "string": pa.string()}.get(args.id_type)
    if inputs.format == "builtin":
        if given == pa.string():
            raise ValueError(
                "the ids were given as strings (--id_type string), but the built-in corpus's "
                "ids are integers (int64), so every row would be a dead letter; pass "
                "--id_type int or leave --id_type out"
            )
        return pa.int64()
    return jobs.id_type_of([f.path for f in inputs.files], *inputs.columns, given=given)


def _summarize(result, wall_seconds: float, parts_reused: int) -> EmbedTextSummary:
    kernel = bj.summarize(result)
    ours = bj.metric_totals(result, METRICS_NAMESPACE)
    validation, lines = bj.Stage.VALIDATION, ours.get("lines_unreadable", 0)
    by_stage = {
        **({bj.Stage.READ: lines} if lines else {}),  # JSON lines that are no row
        validation: ours.get(f"dead_letters_{validation}", 0)
        + kernel.dead_letters_by_stage.get(validation, 0),
        TOKENIZE: ours.get(f"dead_letters_{TOKENIZE}", 0),
        **{s: n for s, n in kernel.dead_letters_by_stage.items() if s != validation},
    }
    return EmbedTextSummary(
        rows=ours.get("rows", 0) + lines,
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


def _published_summary(output: str) -> EmbedTextSummary:
    """The summary of the run published to ``output``, read back from its ``_metrics.json``
    (``jobs.metrics_record``: the kernel's ``beam_jax.Summary`` apart, NaN written as null)."""
    with FileSystems.open(f"{output}/_metrics.json", compression_type="uncompressed") as f:
        record = json.load(f)
    kernel = record["kernel"]
    if kernel.get("buffering") is not None:
        kernel["buffering"] = _restored(bj.BufferingSummary, kernel["buffering"])
    return _restored(
        EmbedTextSummary, {**record["summary"], "kernel": _restored(bj.Summary, kernel)}
    )


def _restored(cls, values: dict[str, Any]):
    """A ``cls`` of its fields in ``values`` (other keys, its properties, left out)."""
    fields = {f.name: f.type for f in dataclasses.fields(cls) if f.name in values}
    nan = float("nan")  # a float written as null
    return cls(
        **{n: nan if t == "float" and values[n] is None else values[n] for n, t in fields.items()}
    )


@jobs.freeze_startup_objects()
@jobs.prompt_bundle_ends()
def run(
    argv: Sequence[str] | None = None, *, encoder: Encoder | None = None
) -> EmbedTextSummary | None:
    """Runs the job to completion, publishes its output, prints a summary and returns it.

    Args:
        argv: Command-line flags (see ``python -m pipelines.embed --help``); Beam's
            flags pass through. ``None`` reads ``sys.argv``.
        encoder: The embedding step's functions, if not MiniLM's (see :class:`Encoder`).

    Returns:
        The run's counts, padding, compiles and throughput; ``None`` with Beam's
        ``--dry_run=True``, which builds the job for its runner (and writes
        ``--dataflow_job_file``, if given) without running or submitting anything. Where
        the same job succeeded before and was killed while publishing, the run finishes
        that publish, computes nothing and returns that run's summary.

    Raises:
        SystemExit: On an unknown flag or a bad value.
        FileNotFoundError: If ``--input`` matches no file.
        ValueError: If no Parquet input file has the columns, or ``--id_type`` does not
            fit the input's ids (every row would be a dead letter).
        beam_jax.jobs.OutputExistsError: If ``--output`` holds files and no
            ``--overwrite`` was given.
        beam_jax.DeadLetterThresholdError: If more rows or files failed than
            ``--threshold`` allows; nothing is published, and the message names the file
            holding the dead letters.
    """
    started = time.perf_counter()
    args, options = parse_args(argv)
    if jobs.workers_here(options) and not jobs.is_dry_run(options):
        jobs.open_local_devices()  # opening a TPU takes seconds: overlap it with the launch
    # A tampered or incomplete model fails the launch, naming the file.
    model = SentenceEncoder.from_dir(
        args.model_dir,
        manifest=args.model_manifest,
        matmuls=args.matmuls,
        layer_kernel=args.layer_kernel,
    )
    local = jobs.is_local(options.view_as(StandardOptions).runner)
    if args.matmuls == "auto" and local and not jobs.is_dry_run(options):
        # The workers run on this machine: decided once here, the precision is the job
        # record's (a rerun that resumes must match it) and every worker's.
        model = dataclasses.replace(model, matmuls=model.resolved_matmuls())
    inputs = Inputs.from_args(args)
    id_type = _id_type(args, inputs)
    output = OutputDir(args.output, layout=write.LAYOUT)
    job = {
        "inputs": inputs.describe(),
        "id_type": str(id_type),
        "rows_per_part": args.rows_per_part,
        # Parts span row groups (read together up to rows_per_part rows): the staged parts
        # of a run that cut a part at every row group are another job's, not resumed.
        "parts": "row groups read together",
        "model_dir": args.model_dir,
        "max_tokenized_chars": MAX_TOKENIZED_CHARS,
        "matmuls": model.matmuls,
    }
    if jobs.is_dry_run(options):  # Beam's --dry_run=True: the job built for its runner, not run
        launch = launch_plan.plan_for(args, inputs, jobs.devices_per_worker(options), model)
        print(launch, flush=True)
        pipeline = beam.Pipeline(options=options)  # validates the options for the runner
        _build(pipeline, args, model, inputs, id_type, output.staging, frozenset(), launch)
        return jobs.run_dry(pipeline, "embed_text", output.path)
    published = output.finish_publishing(job)
    if published is not None:  # this job succeeded, and was killed while publishing
        print(
            f"embed_text: finished publishing the earlier run of this job, cut short, to "
            f"{output.path}; nothing left to compute. That run:\n{published['summary']}",
            flush=True,
        )
        return _published_summary(output.path)
    reused = output.prepare(job, overwrite=args.overwrite)
    launch = launch_plan.plan_for(args, inputs, jobs.devices_per_worker(options), model)
    source = inputs.pattern or "the built-in corpus"
    print(f"embed_text: {launch.rows} of {source} -> {output.path}: {launch.short()}", flush=True)
    described = str(launch)  # the details, with --verbose
    model_kernel = encoder is None or None in (encoder.element_fn, encoder.packed_fn)
    if model_kernel and args.matmuls == "auto" and local:
        # (--matmuls applies to the model's kernels only, not to an Encoder's.)
        described += f"; --matmuls auto: {model.matmuls} on this machine"
    if local and args.on_accelerator and not args.accelerator and not args.tokens_per_chunk:
        platform = jobs.local_platform().platform
        described += f"; batches run whole (no chunks) on this machine's {platform}"
    if args.verbose:
        print(described, flush=True)
    pipeline = beam.Pipeline(options=options)
    done, results, dead = write.reused_parts(output.staging, reused, inputs)
    total = launch.rows.less(results + dead)
    console = RunConsole("embed_text", args, options, output.path, total=total)
    where = (output.staging, done, launch, console.progress_dir, encoder)
    embed = _build(pipeline, args, model, inputs, id_type, *where)
    try:
        with console:
            if launch.planned and jobs.workers_here(options):
                # The workers run here: the model loads and compiles while Beam starts.
                embed.start_worker_here()
            result = pipeline.run()
            result.wait_until_finish()
    except Exception as e:
        output.explain_failure(e, "embed_text", len(reused))
        raise
    finally:
        embed.forget_worker_here()
    summary = _summarize(result, time.perf_counter() - started, len(reused))
    summary = dataclasses.replace(summary, batching=launch.batching, batching_reason=launch.reason)
    print(summary, flush=True)
    rows = (summary.dead_letters + dead, summary.rows + results + dead)
    files = (summary.unreadable_files, len(inputs.files))
    output.check_threshold({"rows": rows, "files": files}, args.threshold)
    if not output.staged_parts():  # no row was read (an empty or unreadable input)
        write.write_no_rows(output.staging, inputs, id_type)
    # Staged, the metrics are published with the parts: a publish cut short keeps them.
    jobs.write_metrics(jobs.metrics_record("embed_text", summary, result), output.staging)
    output.publish({"job": job, "summary": str(summary), "batching": launch.describe()})
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    jobs.run_main(
        "embed_text", run, argv, user_errors=(FileNotFoundError, bj.DeadLetterThresholdError)
    )
