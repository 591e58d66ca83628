"""The curation job: records prepared once, full-batch training passes, then per-record
scores; each stage one Beam pipeline run, staged under ``OUTPUT/_unfinished/`` and published
whole on success (docs/curate.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.parquetio import WriteToParquetBatched

import beam_jax as bj
from beam_jax import jobs
from pipelines.curate import model, passes, read, report
from pipelines.curate.flags import parse_args

# The files of a run, under OUTPUT (and staged under OUTPUT/_unfinished/).
_FILES = (
    r"data/records-\d{5}-of-\d{5}\.parquet|data/stats\.json"
    r"|passes/(params|gradient)-\d{3}\.npz|_failed/(prepare|pass-\d{3}|score)-.+\.jsonl"
    r"|scores-\d{5}-of-\d{5}\.parquet|summary\.json|curate\.png"
)
RECORD = "_curate.json"
LAYOUT = jobs.OutputLayout(
    published=re.compile(rf"^({_FILES})$"),
    # failed/*.jsonl and _run.log: where dead letters and the log went before.
    ours=re.compile(rf"^({_FILES}|{RECORD}|_metrics\.json|failed/[\w-]+\.jsonl|_run\.log)$"),
    record=RECORD,
    resumable=False,  # each stage reads the one before: a rerun starts afresh
)
_JOB_FLAGS = (
    *("input", "classes", "flip_fraction", "seed", "passes", "learning_rate", "hash_bits"),
    *("dim", "buckets", "num_buckets", "batch_size", "batch_sizes", "columns"),
)


@dataclasses.dataclass(frozen=True)
class _Metrics:
    """What ``OUTPUT/_metrics.json`` holds of a run (``beam_jax.jobs.metrics_record``)."""

    rows: int
    results: int  # records scored
    dead_letters: int
    wall_seconds: float
    auroc: dict[str, float]
    kernel: bj.Summary  # the scoring run's


def _write_json(value, path: str) -> None:
    jobs.write_atomically(path, json.dumps(value, indent=1).encode())


def prepare(args: argparse.Namespace, options, work: str, schema: pa.Schema) -> tuple[dict, dict]:
    """One pipeline run: rows read, checked and tokenized into ``WORK/data/records-*``.

    Returns:
        The stats (label and length counts) and the run's counters.
    """
    pipeline = beam.Pipeline(options=options)
    rows, unreadable = read.read_rows(pipeline, args, schema)
    records = rows | "ToRecords" >> beam.ParDo(read.ToRecords(schema)).with_outputs(
        bj.DEAD_LETTERS, main="records"
    )
    data = FileSystems.join(work, "data")
    records_schema = read.records_schema(schema.field(0).type)
    _ = records.records | "WriteRecords" >> WriteToParquetBatched(
        FileSystems.join(data, "records"), records_schema, file_name_suffix=".parquet"
    )
    _ = (
        records.records
        | "Stats" >> beam.CombineGlobally(read.RecordStats())
        | "WriteStats" >> beam.Map(_write_json, FileSystems.join(data, "stats.json"))
    )
    dead = (records[bj.DEAD_LETTERS], unreadable) | "DeadLetters" >> beam.Flatten()
    passes.write_dead_letters(dead, work, "prepare")
    result = passes.run_pipeline(pipeline)
    with FileSystems.open(FileSystems.join(data, "stats.json")) as f:
        stats = json.loads(f.read())
    return stats, bj.metric_totals(result, read.METRICS_NAMESPACE)


def _boundaries(args: argparse.Namespace, lengths: dict[str, int]) -> tuple[int, ...]:
    longest = max(int(k) for k in lengths)
    if args.buckets is not None:
        if max(args.buckets) < longest:
            raise ValueError(
                f"--buckets {args.buckets} end below the longest record ({longest} tokens); "
                "add a larger boundary"
            )
        return tuple(args.buckets)
    sample = np.repeat([int(k) for k in lengths], list(lengths.values()))
    return bj.plan_boundaries(sample, args.num_buckets)


def _read_scores(output: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every record's scores and flipped flag, read back from ``scores-*.parquet``."""
    match = FileSystems.match([FileSystems.join(output, "scores-*-of-*.parquet")])[0]
    tables = []
    for path in sorted(m.path for m in match.metadata_list):
        with FileSystems.open(path) as f:
            tables.append(pq.read_table(f, columns=[*report.SCORES, "flipped"]))
    table = pa.concat_tables(tables)
    scores = {s: table.column(s).to_numpy() for s in report.SCORES}
    return scores, table.column("flipped").to_numpy(zero_copy_only=False)


@jobs.freeze_startup_objects()
@jobs.prompt_bundle_ends()
def run(argv: Sequence[str] | None = None) -> report.CurateSummary:
    """Runs the job to completion, prints a summary and returns it.

    Raises:
        SystemExit: On an unknown flag or a bad value.
        beam_jax.jobs.OutputExistsError: If ``--output`` holds files and no
            ``--overwrite`` was given; nothing is written then.
    """
    started = time.perf_counter()
    args, options = parse_args(argv)
    report.require_matplotlib()
    schema = read.input_schema(args.input, args.format, args.columns)
    output = jobs.OutputDir(args.output, layout=LAYOUT)
    record = {n: getattr(args, n) for n in _JOB_FLAGS}
    if output.finish_publishing(record) is not None:  # this job succeeded, then was killed
        with FileSystems.open(FileSystems.join(output.path, "summary.json")) as f:
            summary = report.CurateSummary.from_json(json.load(f))
        print(
            f"curate: finished publishing the earlier run of this job, cut short, to "
            f"{output.path}; nothing left to compute. That run:\n{summary}",
            flush=True,
        )
        return summary
    output.prepare(record, overwrite=args.overwrite)
    work = output.staging

    console = jobs.RunConsole("curate", args, options, output.path, count_progress=False)
    with console:  # Beam's and the workers' logs go to OUTPUT/_unfinished/run.log
        stats, counters = prepare(args, options, work, schema)
        prepared = time.perf_counter()
        records = sum(stats["labels"].values())
        dead = {s: counters.get(f"dead_letters_{s}", 0) for s in ("read", "validation", "tokenize")}
        rows = counters.get("rows", 0) + dead["read"]
        console.say(
            f"curate: prepared {jobs.counted(records, 'record')} from "
            f"{jobs.counted(rows, 'row')}, {jobs.counted(sum(dead.values()), 'dead letter')}, "
            f"{prepared - started:.1f} s"
        )
        if records == 0:
            first = next(jobs.read_dead_letters(f"{work}/_failed/*.jsonl"), None)
            if first is None:
                raise ValueError(f"no rows to curate: {args.input or 'the input'} holds none")
            raise ValueError(
                f"no usable rows: the first of {jobs.counted(sum(dead.values()), 'dead letter')}"
                f" failed its {first.stage} with {first.error_type}: {first.message} (all are "
                f"in {work}/_failed/)"
            )
        classes = tuple(sorted(stats["labels"]))
        if len(classes) < 2:
            raise ValueError(
                f"the input's {jobs.counted(records, 'record')} hold one label, {classes[0]!r}; "
                "curate trains a classifier over the labels it finds and needs at least 2. "
                "Give rows of other labels too, or name the input's label column with "
                "--label_column"
            )
        job = passes.Job(
            output=work,
            noise=passes.LabelNoise(classes, args.flip_fraction, args.seed),
            bucketing=bj.Bucketing(
                boundaries={"L": _boundaries(args, stats["lengths"])},
                batch_size=args.batch_size,
                batch_sizes=args.batch_sizes,
            ),
            options=options,
            compilation_cache_dir=args.compilation_cache_dir,
        )
        config = model.ModelConfig(len(classes), hash_bits=args.hash_bits, dim=args.dim)
        params = model.init_params(config, args.seed)
        bj.write_params(params, job.params_path(0))
        optimizer = model.Adam(learning_rate=args.learning_rate)
        state = optimizer.init(params)
        trained = []
        for step in range(args.passes):
            grad, pass_stats = passes.gradient_pass(job, step)
            params, state = optimizer.update(grad, state, params)
            bj.write_params(params, job.params_path(step + 1))
            trained.append(pass_stats)
            console.say(
                f"curate: pass {step + 1}/{args.passes}: loss {pass_stats.loss:.4f}, "
                f"{pass_stats.seconds:.1f} s"
            )
        scoring = time.perf_counter()
        scored = passes.score_pass(job, args.passes, schema.field(0).type)
        kernel = bj.summarize(scored)
        console.say(
            f"curate: scored {kernel.results:,} records, {time.perf_counter() - scoring:.1f} s"
        )
    scores, flipped = _read_scores(work)
    auroc, precision = report.found(scores, flipped)
    finished = time.perf_counter()
    by_stage = {**dead, "train": sum(p.dead_letters for p in trained), "score": kernel.dead_letters}
    summary = report.CurateSummary(
        rows=rows,
        records=records,
        dead_letters_by_stage=by_stage,
        classes=classes,
        flipped=int(flipped.sum()),
        boundaries=job.bucketing.boundaries["L"],
        passes=tuple(trained),
        final_loss=float(np.mean(scores["loss"])),
        auroc=auroc,
        precision_at_top=precision,
        seconds={
            "prepare": prepared - started,
            "train": scoring - prepared,
            "score": finished - scoring,
            "total": finished - started,
        },
    )
    _write_json(summary.to_json(), FileSystems.join(work, "summary.json"))
    title = (
        f"{jobs.counted(summary.records, 'record')}, {summary.flipped} labels flipped; scores "
        f"after {jobs.counted(len(summary.passes), 'full-batch pass')}"
    )
    named = {"GraNd": scores["grand"], "EL2N": scores["el2n"]}
    report.plot(FileSystems.join(work, "curate.png"), summary.losses, named, flipped, title=title)
    # beam-jax report OUTPUT reads the scoring run's kernel metrics beside the job's figures;
    # staged, they are published with the rest (and kept by a publish cut short).
    metrics = _Metrics(
        rows, kernel.results, summary.dead_letters, finished - started, auroc, kernel
    )
    jobs.write_metrics(jobs.metrics_record("curate", metrics, scored), work)
    output.publish({"job": record, "summary": str(summary)})
    print(summary, flush=True)
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    jobs.run_main("curate", run, argv)
