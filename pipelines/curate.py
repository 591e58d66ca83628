"""Find mislabelled records: full-batch training passes, then per-record gradient scores.

A data-curation job in the manner of Paul et al. 2021 ("Deep Learning on a Data Diet"): train
a small classifier briefly on a labelled text set, then score every record by how hard or
suspicious it looks: GraNd (the norm of its loss gradient, by ``vmap(grad(...))``) and EL2N
(the norm of its error vector). Mislabelled records rank high early in training. To measure
that, a seeded fraction of the labels is flipped first, so the ground truth is known.

Each stage is one Beam pipeline run (any runner), and everything between runs goes through
files under ``--output``, as it would between the driver and Dataflow workers::

    rows (id, text, label) ─▶ check, tokenize ─▶ data/records-*.parquet, data/stats.json
                                └─ dead letters ─▶ _failed/prepare-*.jsonl
    pass t = 0..P-1:  records ─▶ ReduceKernel(gradient) ─▶ passes/gradient-t.npz
                      driver: Adam step ─▶ passes/params-(t+1).npz   (shipped to the next pass)
    records ─▶ RunKernel(vmap(grad)) ─▶ scores-*.parquet (id, label, true_label, flipped,
                                                          grand, el2n, loss, predicted)
    driver: AUROC and precision of each score ─▶ summary.json, curate.png

Every stage writes under ``OUTPUT/_unfinished/``; the files move into ``OUTPUT`` only when
the whole job has succeeded, and a non-empty ``OUTPUT`` needs ``--overwrite``, which replaces
this job's earlier files and no other (:class:`beam_jax.jobs.OutputDir`, as ``embed_text``).
The model and kernels are in :mod:`pipelines.curate_model`, the built-in data in
:mod:`pipelines.labelled_corpus`, the metrics and plot in :mod:`pipelines.curate_report`.
See docs/curate.md.

Example:
    >>> summary = run(["--output", "/tmp/curate"])  # doctest: +SKIP
    >>> summary.auroc["grand"] > 0.9  # doctest: +SKIP
    True

Run it::

    python -m pipelines.curate                      # the built-in corpus, 10% of labels flipped
    python -m pipelines.curate --input rows.jsonl --output out/     # your labels, none flipped
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.parquetio import WriteToParquetBatched
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions

import beam_jax as bj
from beam_jax import jobs
from beam_jax.jobs import OutputDir, OutputExistsError, OutputLayout
from pipelines import curate_data as data
from pipelines import curate_model as cm
from pipelines import curate_passes as cp
from pipelines import curate_report as report
from pipelines import input_files, labelled_corpus
from pipelines import text_rows as tr
from pipelines.embed import flags

__all__ = ["CurateSummary", "parse_args", "run"]

DEFAULT_OUTPUT = "output/curate"
# Measured on the built-in corpus (bench/curate_steps.py): with Adam at 0.05, the scores
# separate flipped from clean labels best after 14-20 full-batch steps (AUROC 0.95-0.96);
# by 30 the model has begun to memorise the flipped labels too (0.88).
DEFAULT_PASSES = 14
DEFAULT_LEARNING_RATE = 0.05
# Only on the built-in corpus, whose flips are the ground truth the scores are measured
# against; a user's own labels are never flipped unless --flip_fraction asks for it.
DEFAULT_FLIP_FRACTION = 0.1
DEFAULT_BATCH_SIZE = 64
DEFAULT_NUM_BUCKETS = 6
DEFAULT_RUNNER = "FnApiRunner"
# The files of a run, under OUTPUT (and staged under OUTPUT/_unfinished/).
_FILES = (
    r"data/records-\d{5}-of-\d{5}\.parquet|data/stats\.json"
    r"|passes/(params|gradient)-\d{3}\.npz|_failed/(prepare|pass-\d{3}|score)-.+\.jsonl"
    r"|scores-\d{5}-of-\d{5}\.parquet|summary\.json|curate\.png"
)
RECORD = "_curate.json"
LAYOUT = OutputLayout(
    published=re.compile(rf"^({_FILES})$"),
    # failed/*.jsonl and _run.log: where dead letters and the log went before.
    ours=re.compile(rf"^({_FILES}|{RECORD}|failed/[\w-]+\.jsonl|_run\.log)$"),
    record=RECORD,
    resumable=False,  # each stage reads the one before: a rerun starts afresh
)
TOP_FRACTION = 0.1  # precision is reported for the top 10% of records by score
# Records are written in row groups of 256, which the passes spread over the workers.
_ROWS_PER_TABLE = 256


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, PipelineOptions]:
    """Splits ``argv`` into this job's flags and Beam's ``PipelineOptions``.

    Beam's flags (``--runner``, ``--direct_num_workers``, ``--project``...) apply to every
    pipeline the job runs; the runner defaults to the in-process FnApiRunner.
    """
    parser = argparse.ArgumentParser(
        prog=jobs.prog("pipelines.curate", "curate"),
        description="Train a small text classifier by full-batch passes (ReduceKernel), then "
        "score every record with GraNd and EL2N (RunKernel) to find mislabelled records.",
        epilog="Beam's flags (--runner, --direct_num_workers, --project, ...) pass through, "
        "for every pipeline run; any other flag is an error. See docs/curate.md.",
        formatter_class=flags.DefaultsHelpFormatter,
        allow_abbrev=False,  # a prefix must not take a Beam flag's value
    )
    parser.add_argument(
        "--input",
        help="Parquet or JSON lines with 'id', 'text' and 'label' (a string); default: "
        "standard-library docstring passages labelled by their module",
    )
    parser.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        help="output directory; must be empty, or see --overwrite",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace this job's earlier files in --output once this run succeeds (they are "
        "kept until then; other files are never touched); also discards another run's "
        "unfinished files there",
    )
    parser.add_argument(
        "--classes",
        type=flags.positive_int,
        default=labelled_corpus.DEFAULT_CLASSES,
        help="without --input: how many modules (the largest) to keep as classes",
    )
    parser.add_argument(
        "--flip_fraction",
        type=float,
        help="each record's label is replaced by another class with this probability, "
        "decided by a seeded hash of its id, to measure how well the scores find them "
        f"(default: {DEFAULT_FLIP_FRACTION} on the built-in corpus; 0 with --input, whose "
        "labels are taken as they are unless this flag is given)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the flips and the init")
    parser.add_argument(
        "--passes",
        type=flags.positive_int,
        default=DEFAULT_PASSES,
        help="full-batch training steps (one pipeline run each) before the scores are taken",
    )
    parser.add_argument(
        "--learning_rate",
        type=float,
        default=DEFAULT_LEARNING_RATE,
        help="Adam's learning rate for the full-batch steps",
    )
    parser.add_argument(
        "--hash_bits", type=flags.positive_int, default=10, help="2**bits embedding rows"
    )
    parser.add_argument("--dim", type=flags.positive_int, default=32, help="embedding width")
    parser.add_argument(
        "--buckets",
        type=flags.int_list,
        help="token-length bucket boundaries; default: planned from the records' lengths "
        f"(--num_buckets, {DEFAULT_NUM_BUCKETS} by default)",
    )
    parser.add_argument(
        "--num_buckets",
        type=flags.positive_int,
        default=DEFAULT_NUM_BUCKETS,
        help="without --buckets: how many token-length buckets to plan",
    )
    parser.add_argument(
        "--batch_size",
        type=flags.positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="the largest padded batch of records per kernel call",
    )
    parser.add_argument(
        "--batch_sizes",
        type=flags.int_list,
        help="padded batch sizes allowed (default powers of 2)",
    )
    parser.add_argument(
        "--compilation_cache_dir",
        help="JAX persistent compilation cache, so each pass loads its compiled shapes; default "
        f"{flags.DEFAULT_CACHE} on the local runners; 'none' turns it off",
    )
    jobs.add_flags(parser)
    args, rest = parser.parse_known_args(argv)
    flags.reject_unknown_flags(parser, rest)
    if args.flip_fraction is None:
        args.flip_fraction = DEFAULT_FLIP_FRACTION if args.input is None else 0.0
    if not 0 <= args.flip_fraction < 1:
        parser.error(f"--flip_fraction must be within [0, 1), got {args.flip_fraction}")
    if not args.learning_rate > 0:
        parser.error(f"--learning_rate must be positive, got {args.learning_rate}")
    if args.hash_bits > 24:
        parser.error(f"--hash_bits must be at most 24, got {args.hash_bits}")
    if args.input is not None:
        # A clear error for an unknown extension, before any run.
        input_files.input_format(args.input)
    options = PipelineOptions(rest)
    standard = options.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = DEFAULT_RUNNER
    if args.compilation_cache_dir is None and jobs.is_local(standard.runner):
        args.compilation_cache_dir = os.path.expanduser(flags.DEFAULT_CACHE)
    elif args.compilation_cache_dir in ("none", ""):
        args.compilation_cache_dir = None
    options.view_as(SetupOptions).save_main_session = False
    return args, options


@dataclasses.dataclass(frozen=True)
class CurateSummary:
    """What a finished run did and found.

    Attributes:
        rows: Input rows read.
        records: Rows that became training records (the others are dead letters).
        dead_letters_by_stage: Dead letters per stage, over every pipeline run.
        classes: The class names.
        flipped: Records whose label was flipped.
        boundaries: The token-length buckets used.
        passes: One ``PassStats`` per full-batch training pass.
        final_loss: Mean loss at the parameters the scores were taken with.
        auroc: Per score (``grand``, ``el2n``, ``loss``), the AUROC for finding the flipped
            records; ``random`` is chance, 0.5. Empty when nothing (or everything) flipped.
        precision_at_top: Per score, the share of flipped records among the top 10%;
            ``random`` is the share of flipped records overall.
        seconds: Wall time per stage: ``prepare``, ``train``, ``score``, ``total``.
    """

    rows: int
    records: int
    dead_letters_by_stage: dict[str, int]
    classes: tuple[str, ...]
    flipped: int
    boundaries: tuple[int, ...]
    passes: tuple[cp.PassStats, ...]
    final_loss: float
    auroc: dict[str, float]
    precision_at_top: dict[str, float]
    seconds: dict[str, float]

    @property
    def dead_letters(self) -> int:
        return sum(self.dead_letters_by_stage.values())

    @property
    def losses(self) -> list[float]:
        """The mean loss before each pass, then at the scored parameters."""
        return [p.loss for p in self.passes] + [self.final_loss]

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["losses"] = self.losses
        return out

    def __str__(self) -> str:
        found = ", ".join(
            f"{s} AUROC {self.auroc[s]:.3f} / P@10% {self.precision_at_top[s]:.2f}"
            for s in cp.SCORES
            if s in self.auroc
        )
        return (
            f"curate: {self.rows} rows -> {self.records} records ({self.flipped} flipped), "
            f"{self.dead_letters} dead letters; {len(self.passes)} full-batch passes, loss "
            f"{self.passes[0].loss:.3f} -> {self.final_loss:.3f}; {found or 'no flips to find'}"
            f"; {self.seconds['total']:.1f} s wall"
        )


def _job_record(args: argparse.Namespace) -> dict:
    """What the run computes, for its staging directory's job record."""
    names = ("input", "classes", "flip_fraction", "seed", "passes", "learning_rate",
             "hash_bits", "dim", "buckets", "num_buckets", "batch_size", "batch_sizes")  # fmt: skip
    return {n: getattr(args, n) for n in names}


def prepare(
    args: argparse.Namespace, options: PipelineOptions, work: str
) -> tuple[dict, dict, tr.IdType]:
    """One pipeline run: rows checked and tokenized into ``WORK/data/records-*.parquet``.

    Returns:
        The stats (label and length counts), this run's counters, and the id type.
    """
    pipeline = beam.Pipeline(options=options)
    rows, id_type = data.read_rows(pipeline, args.input, args.classes)
    records = rows | "ToRecords" >> beam.ParDo(data.ToRecords(id_type)).with_outputs(
        tr.DEAD_LETTERS, main="records"
    )
    schema = data.records_schema(id_type)
    data_dir = FileSystems.join(work, "data")
    _ = (
        records.records
        | "BatchRecords"
        >> beam.BatchElements(min_batch_size=_ROWS_PER_TABLE, max_batch_size=_ROWS_PER_TABLE)
        | "RecordsToArrow" >> beam.Map(data.records_table, schema)
        | "WriteRecords"
        >> WriteToParquetBatched(
            FileSystems.join(data_dir, "records"), schema, file_name_suffix=".parquet"
        )
    )
    _ = (
        records.records
        | "Stats" >> beam.CombineGlobally(data.RecordStats())
        | "WriteStats" >> beam.Map(data.write_json, FileSystems.join(data_dir, "stats.json"))
    )
    cp.write_dead_letters(records[tr.DEAD_LETTERS], work, "prepare")
    result = cp.run_pipeline(pipeline)
    stats = data.read_json(FileSystems.join(data_dir, "stats.json"))
    return stats, bj.metric_totals(result, data.METRICS_NAMESPACE), id_type


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


def _evaluate(output: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every record's scores and flipped flag, read back from ``scores-*.parquet``."""
    pattern = FileSystems.join(output, "scores-*-of-*.parquet")
    paths = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    tables = []
    for path in paths:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            tables.append(pq.read_table(f, columns=[*cp.SCORES, "flipped"]))
    table = pa.concat_tables(tables)
    scores = {s: table.column(s).to_numpy() for s in cp.SCORES}
    return scores, table.column("flipped").to_numpy(zero_copy_only=False)


def run(argv: Sequence[str] | None = None) -> CurateSummary:
    """Runs the job to completion, prints a summary and returns it.

    Args:
        argv: Command-line flags (see ``python -m pipelines.curate --help``); Beam's flags
            pass through to every pipeline run. ``None`` reads ``sys.argv``.

    Returns:
        The counts, the loss per pass, and how well each score finds the flipped labels.

    Raises:
        SystemExit: On an unknown flag or a bad value.
        beam_jax.jobs.OutputExistsError: If ``--output`` holds files and no
            ``--overwrite`` was given; nothing is written then.
    """
    started = time.perf_counter()
    args, options = parse_args(argv)
    report.require_matplotlib()
    output = OutputDir(args.output, layout=LAYOUT)
    record = _job_record(args)
    output.prepare(record, overwrite=args.overwrite)
    work = output.staging

    console = jobs.RunConsole("curate", args, options, output.path, count_progress=False)
    with console:  # Beam's and the workers' logs go to OUTPUT/_unfinished/run.log
        stats, counters, id_type = prepare(args, options, work)
        prepared = time.perf_counter()
        records = sum(stats["labels"].values())
        dead = sum(v for k, v in counters.items() if k.startswith("dead_letters_"))
        console.say(
            f"curate: prepared {records:,} records from {counters.get('rows', 0):,} rows, "
            f"{dead:,} dead letters, {prepared - started:.1f} s"
        )
        if records == 0:
            raise ValueError(f"no usable rows; see the dead letters in {work}/_failed/")
        classes = tuple(sorted(stats["labels"]))
        job = cp.Job(
            output=work,
            noise=data.LabelNoise(classes, args.flip_fraction, args.seed),
            bucketing=bj.Bucketing(
                boundaries={"L": _boundaries(args, stats["lengths"])},
                batch_size=args.batch_size,
                batch_sizes=args.batch_sizes,
            ),
            options=options,
            compilation_cache_dir=args.compilation_cache_dir,
        )
        config = cm.ModelConfig(num_classes=len(classes), hash_bits=args.hash_bits, dim=args.dim)
        params = cm.init_params(config, args.seed)
        cp.save_params(params, job.params_path(0))
        optimizer = cm.Adam(learning_rate=args.learning_rate)
        state = optimizer.init(params)
        passes = []
        for step in range(args.passes):
            grad, stats_t = cp.gradient_pass(job, step)
            params, state = optimizer.update(grad, state, params)
            cp.save_params(params, job.params_path(step + 1))
            passes.append(stats_t)
            console.say(
                f"curate: pass {step + 1}/{args.passes}: loss {stats_t.loss:.4f}, "
                f"{stats_t.seconds:.1f} s"
            )
        trained = time.perf_counter()

        kernel = cp.score_pass(job, args.passes, id_type.arrow_type)
        console.say(
            f"curate: scored {kernel.results:,} records, {time.perf_counter() - trained:.1f} s"
        )
    scores, flipped = _evaluate(work)
    auroc, precision = {}, {}
    if flipped.any() and not flipped.all():
        for s in cp.SCORES:
            auroc[s] = report.auroc(scores[s], flipped)
            precision[s] = report.precision_at(scores[s], flipped, TOP_FRACTION)
        auroc["random"], precision["random"] = 0.5, float(flipped.mean())
    dead = {
        data.VALIDATION: counters.get(f"dead_letters_{data.VALIDATION}", 0),
        data.TOKENIZE: counters.get(f"dead_letters_{data.TOKENIZE}", 0),
        "train": sum(p.dead_letters for p in passes),
        "score": kernel.dead_letters,
    }
    finished = time.perf_counter()
    summary = CurateSummary(
        rows=counters.get("rows", 0),
        records=sum(stats["labels"].values()),
        dead_letters_by_stage=dead,
        classes=classes,
        flipped=int(flipped.sum()),
        boundaries=job.bucketing.boundaries["L"],
        passes=tuple(passes),
        final_loss=float(np.mean(scores["loss"])),
        auroc=auroc,
        precision_at_top=precision,
        seconds={
            "prepare": prepared - started,
            "train": trained - prepared,
            "score": finished - trained,
            "total": finished - started,
        },
    )
    data.write_json(summary.to_json(), FileSystems.join(work, "summary.json"))
    _plot(summary, scores, flipped, work)
    output.publish({"job": record, "summary": str(summary)})
    print(summary, flush=True)
    return summary


def _plot(summary: CurateSummary, scores, flipped, output: str) -> None:
    title = (
        f"{summary.records} records, {summary.flipped} labels flipped; scores after "
        f"{len(summary.passes)} full-batch passes"
    )
    # matplotlib writes local files; copy through Beam's file systems for gs:// outputs.
    with tempfile.TemporaryDirectory() as tmp:
        local = f"{tmp}/curate.png"
        report.plot(local, summary.losses, {"GraNd": scores["grand"], "EL2N": scores["el2n"]},
                    flipped, title=title)  # fmt: skip
        with (
            open(local, "rb") as src,
            FileSystems.create(FileSystems.join(output, "curate.png")) as dst,
        ):
            dst.write(src.read())


def main(argv: Sequence[str] | None = None) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    try:
        run(argv)
    except OutputExistsError as e:  # about the user's files; the message says what to do
        sys.exit(f"curate: {type(e).__name__}: {e}")
    except Exception as e:
        if jobs.verbose_requested(argv):
            raise
        sys.exit(jobs.failure_line("curate", e))


if __name__ == "__main__":
    # Re-import under the package name, so what Beam pickles refers to `pipelines.curate`.
    from pipelines import curate

    curate.main()
