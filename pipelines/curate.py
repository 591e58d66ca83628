"""Find mislabelled records: full-batch training passes, then per-record gradient scores.

A data-curation job in the manner of Paul et al. 2021 ("Deep Learning on a Data Diet"): train
a small classifier briefly on a labelled text set, then score every record by how hard or
suspicious it looks: GraNd (the norm of its loss gradient, by ``vmap(grad(...))``) and EL2N
(the norm of its error vector). Mislabelled records rank high early in training. To measure
that, a seeded fraction of the labels is flipped first, so the ground truth is known.

Each stage is one Beam pipeline run (any runner), and everything between runs goes through
files under ``--output``, as it would between the driver and Dataflow workers::

    rows (id, text, label) ─▶ check, tokenize ─▶ data/records-*.parquet, data/stats.json
                                └─ dead letters ─▶ failed/prepare-*.jsonl
    pass t = 0..P-1:  records ─▶ ReduceKernel(gradient) ─▶ passes/gradient-t.npz
                      driver: Adam step ─▶ passes/params-(t+1).npz   (shipped to the next pass)
    records ─▶ RunKernel(vmap(grad)) ─▶ scores-*.parquet (id, label, true_label, flipped,
                                                          grand, el2n, loss, predicted)
    driver: AUROC and precision of each score ─▶ summary.json, curate.png

The model and kernels are in :mod:`pipelines.curate_model`, the built-in data in
:mod:`pipelines.labelled_corpus`, the metrics and plot in :mod:`pipelines.curate_report`.
See docs/curate.md.

Example:
    >>> summary = run(["--output", "/tmp/curate"])  # doctest: +SKIP
    >>> summary.auroc["grand"] > 0.9  # doctest: +SKIP
    True

Run it::

    python -m pipelines.curate                      # the built-in labelled corpus
    python -m pipelines.curate --input rows.jsonl --flip_fraction 0 --output out/
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.parquetio import ReadFromParquet, ReadFromParquetBatched, WriteToParquetBatched
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions

import beam_jax as bj
from pipelines import curate_model as cm
from pipelines import curate_report as report
from pipelines import embed_text, labelled_corpus, minilm
from pipelines import text_rows as tr

__all__ = ["CurateSummary", "LabelNoise", "PassStats", "parse_args", "run"]

DEFAULT_OUTPUT = "output/curate"
# Measured on the built-in corpus (docs/curate.md): with Adam at 0.05, the scores separate
# flipped from clean labels best after 12-16 full-batch steps, before the model starts to
# memorise the flipped labels too.
DEFAULT_PASSES = 14
DEFAULT_LEARNING_RATE = 0.05
DEFAULT_FLIP_FRACTION = 0.1
DEFAULT_BATCH_SIZE = 64
DEFAULT_NUM_BUCKETS = 6
DEFAULT_RUNNER = "FnApiRunner"
TOP_FRACTION = 0.1  # precision is reported for the top 10% of records by score
SCORES = ("grand", "el2n", "loss")
METRICS_NAMESPACE = "curate"
_ROWS_PER_TABLE = 1024


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one int, got {text!r}")
    return values


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, PipelineOptions]:
    """Splits ``argv`` into this job's flags and Beam's ``PipelineOptions``.

    Beam's flags (``--runner``, ``--direct_num_workers``, ``--project``...) apply to every
    pipeline the job runs; the runner defaults to the in-process FnApiRunner.
    """
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.curate",
        description="Train a small text classifier by full-batch passes (ReduceKernel), then "
        "score every record with GraNd and EL2N (RunKernel) to find mislabelled records.",
        epilog="Other flags go to Beam unchanged, for every pipeline run. See docs/curate.md.",
    )
    parser.add_argument(
        "--input",
        help="Parquet or JSON lines with 'id', 'text' and 'label' (a string); default: "
        "standard-library docstring passages labelled by their module",
    )
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="output directory")
    parser.add_argument(
        "--classes",
        type=_positive,
        default=labelled_corpus.DEFAULT_CLASSES,
        help="without --input: how many modules (the largest) to keep as classes",
    )
    parser.add_argument(
        "--flip_fraction",
        type=float,
        default=DEFAULT_FLIP_FRACTION,
        help="each record's label is replaced by another class with this probability, "
        "decided by a seeded hash of its id (0 for real curation without a ground truth)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the flips and the init")
    parser.add_argument(
        "--passes",
        type=_positive,
        default=DEFAULT_PASSES,
        help="full-batch training steps (one pipeline run each) before the scores are taken",
    )
    parser.add_argument("--learning_rate", type=float, default=DEFAULT_LEARNING_RATE)
    parser.add_argument("--hash_bits", type=_positive, default=10, help="2**bits embedding rows")
    parser.add_argument("--dim", type=_positive, default=32, help="embedding width")
    parser.add_argument(
        "--buckets",
        type=_int_list,
        help="token-length bucket boundaries; default: planned from the records' lengths "
        f"(--num_buckets, {DEFAULT_NUM_BUCKETS} by default)",
    )
    parser.add_argument("--num_buckets", type=_positive, default=DEFAULT_NUM_BUCKETS)
    parser.add_argument("--batch_size", type=_positive, default=DEFAULT_BATCH_SIZE)
    parser.add_argument(
        "--batch_sizes", type=_int_list, help="padded batch sizes allowed (default powers of 2)"
    )
    parser.add_argument(
        "--compilation_cache_dir",
        help="JAX persistent compilation cache, so each pass loads its compiled shapes; default "
        f"{embed_text.DEFAULT_CACHE} on the local runners; 'none' turns it off",
    )
    args, rest = parser.parse_known_args(argv)
    if not 0 <= args.flip_fraction < 1:
        parser.error(f"--flip_fraction must be within [0, 1), got {args.flip_fraction}")
    if not args.learning_rate > 0:
        parser.error(f"--learning_rate must be positive, got {args.learning_rate}")
    if args.hash_bits > 24:
        parser.error(f"--hash_bits must be at most 24, got {args.hash_bits}")
    if args.input is not None:
        tr.input_format(args.input)  # a clear error for an unknown extension, before any run
    options = PipelineOptions(rest)
    standard = options.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = DEFAULT_RUNNER
    if args.compilation_cache_dir is None and embed_text._is_local(standard.runner):
        args.compilation_cache_dir = os.path.expanduser(embed_text.DEFAULT_CACHE)
    elif args.compilation_cache_dir in ("none", ""):
        args.compilation_cache_dir = None
    options.view_as(SetupOptions).save_main_session = False
    return args, options


# ---------------------------------------------------------------- labels and their noise


@dataclasses.dataclass(frozen=True)
class LabelNoise:
    """Which records get a wrong label, decided per record from a seeded hash of its id.

    Each record's label is replaced with probability ``fraction`` by one of the other
    classes, chosen uniformly. The choice depends only on the seed, the id and the true
    label, so every pass, worker and runner sees the same labels.

    Example:
        >>> noise = LabelNoise(("a", "b", "c"), fraction=0.5, seed=0)
        >>> noise.observe(17, "a") == noise.observe(17, "a")
        True

    Args:
        classes: The class names; a label's index is its position here.
        fraction: The probability of a flip, within [0, 1).
        seed: Seeds the hash.
    """

    classes: tuple[str, ...]
    fraction: float
    seed: int

    def __post_init__(self):
        if len(self.classes) < 2:
            raise ValueError(f"need at least 2 classes to flip between, got {self.classes}.")
        if not 0 <= self.fraction < 1:
            raise ValueError(f"fraction must be within [0, 1), got {self.fraction}.")

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes)}

    def observe(self, key: Any, label: str) -> tuple[int, int]:
        """``(true, observed)`` class indices of the record with id ``key`` and ``label``."""
        true = self._index[label]
        digest = hashlib.blake2b(repr((self.seed, key)).encode(), digest_size=16).digest()
        if int.from_bytes(digest[:8], "little") / 2**64 >= self.fraction:
            return true, true
        shift = 1 + int.from_bytes(digest[8:], "little") % (len(self.classes) - 1)
        return true, (true + shift) % len(self.classes)


# ---------------------------------------------------------------- stage 1: prepare records

VALIDATION, TOKENIZE = tr.VALIDATION, tr.TOKENIZE


class ToRecords(beam.DoFn):
    """Checks one row (a dict, or a JSON line) and tokenizes its text.

    Emits ``{"id", "label", "tokens"}`` (word-piece ids without ``[CLS]``/``[SEP]``, at
    most 254) per good row, and one ``FailedElement`` per bad row on ``dead_letters``.

    Args:
        id_type: The type every id must have.
    """

    def __init__(self, id_type: tr.IdType):
        self._id_type = id_type

    def setup(self):
        self._tokenizer = minilm.Tokenizer(tr.local_model_dir(None))
        counter = functools.partial(beam.metrics.Metrics.counter, METRICS_NAMESPACE)
        self._rows = counter("rows")
        self._rejected = {s: counter(f"dead_letters_{s}") for s in (VALIDATION, TOKENIZE)}

    def process(self, row: Any) -> Iterator[Any]:
        if not (isinstance(row, bytes | str) and not row.strip()):  # blank lines are not rows
            self._rows.inc()
            yield self._record(row)

    def _record(self, row: Any) -> Any:
        """The record of one row, or its dead letter."""
        if isinstance(row, bytes | str):
            try:
                row = json.loads(row)
            except ValueError as e:
                return self._dead(f"the line is not valid JSON ({e})", VALIDATION, None, row)
        if not isinstance(row, dict):
            problem = f"the line holds a JSON {type(row).__name__}, not an object"
            return self._dead(problem, VALIDATION, None, row)
        key, text, label = row.get("id"), row.get("text"), row.get("label")
        problem = None
        if key is None:
            problem = "the row has no id (null or missing); every row needs one"
        elif not self._id_type.accepts(key):
            problem = f"the id {key!r} is a {type(key).__name__}, but the ids are " + (
                self._id_type.describe()
            )
        elif not isinstance(text, str):
            problem = f"expected a string 'text', got {type(text).__name__}"
        elif not isinstance(label, str) or not label:
            problem = f"expected a non-empty string 'label', got {label!r}"
        if problem is not None:
            return self._dead(problem, VALIDATION, key, row)
        tokens = self._tokenizer.encode(text)[1:-1]
        if not len(tokens):
            error = tr.EmptyTextError(
                "the text has no tokens besides [CLS] and [SEP] (it is empty, whitespace, or "
                "only characters the tokenizer drops)"
            )
            return self._dead(error, TOKENIZE, key, row)
        return {"id": key, "label": label, "tokens": tokens}

    def _dead(self, error: str | Exception, stage: str, key: Any, row: Any):
        self._rejected[stage].inc()
        if isinstance(error, str):
            error = bj.InvalidElementError(error)
        record = bj.FailedElement.from_exception(error, stage=stage, element=row, key=key)
        return beam.pvalue.TaggedOutput(tr.DEAD_LETTERS, record)


class _Stats(beam.CombineFn):
    """How many records of each label and of each token length: picks classes and buckets."""

    def create_accumulator(self):
        return Counter(), Counter()

    def add_input(self, acc, record):
        acc[0][record["label"]] += 1
        acc[1][len(record["tokens"])] += 1
        return acc

    def merge_accumulators(self, accs):
        labels, lengths = Counter(), Counter()
        for a, b in accs:
            labels.update(a)
            lengths.update(b)
        return labels, lengths

    def extract_output(self, acc):
        return {
            "labels": dict(sorted(acc[0].items())),
            "lengths": {str(k): v for k, v in sorted(acc[1].items())},
        }


def _records_schema(id_type: tr.IdType) -> pa.Schema:
    return pa.schema(
        [("id", id_type.arrow_type), ("label", pa.string()), ("tokens", pa.list_(pa.int32()))]
    )


def _records_table(records: Sequence[dict], schema: pa.Schema) -> pa.Table:
    lengths = np.array([len(r["tokens"]) for r in records], np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = np.concatenate([np.asarray(r["tokens"], np.int32) for r in records])
    return pa.Table.from_arrays(
        [
            pa.array([r["id"] for r in records], schema.field("id").type),
            pa.array([r["label"] for r in records], pa.string()),
            pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
        ],
        schema=schema,
    )


def _write_json(value: Any, path: str) -> None:
    with FileSystems.create(path) as f:
        f.write(json.dumps(value, indent=1).encode())


def _read_json(path: str) -> Any:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return json.loads(f.read())


def _builtin_rows(num_classes: int) -> Iterator[dict]:
    _, rows = labelled_corpus.labelled_passages(num_classes)
    for key, text, label in rows:
        yield {"id": key, "text": text, "label": label}


def _first_file(pattern: str) -> str:
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise FileNotFoundError(f"--input {pattern!r} matches no file")
    return min(m.path for m in matches)


def _read_rows(pipeline: beam.Pipeline, args: argparse.Namespace) -> tuple[Any, tr.IdType]:
    if args.input is None:
        rows = (
            pipeline
            | "Seed" >> beam.Create([args.classes])
            | "BuiltinCorpus" >> beam.FlatMap(_builtin_rows)
        )
        return rows, tr.IdType.from_name("int")
    if tr.input_format(args.input) == "parquet":
        id_type = tr.IdType.of_parquet(args.input)
        path = _first_file(args.input)
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            names = pq.read_schema(f).names
        if "label" not in names:
            raise ValueError(f"{path} has no column 'label'; it has {names}")
        read = ReadFromParquet(args.input, columns=["id", "text", "label"])
        return pipeline | "ReadParquet" >> read, id_type
    id_type = tr.IdType.of_json_lines(args.input)
    return pipeline | "ReadLines" >> beam.io.ReadFromText(args.input), id_type


def _write_dead_letters(dead, output: str, name: str) -> None:
    _ = (
        dead
        | f"{name}ToJson" >> beam.Map(tr.dead_letter_json)
        | f"{name}WriteFailed"
        >> beam.io.WriteToText(
            FileSystems.join(output, "failed", name), file_name_suffix=".jsonl", skip_if_empty=True
        )
    )


# ---------------------------------------------------------------- stages 2 and 3: passes


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every pass needs: where things are, the labels, the batching, the options."""

    output: str
    noise: LabelNoise
    bucketing: bj.Bucketing
    options: PipelineOptions
    compilation_cache_dir: str | None

    @property
    def records(self) -> str:
        return FileSystems.join(self.output, "data", "records-*.parquet")

    def params_path(self, step: int) -> str:
        return FileSystems.join(self.output, "passes", f"params-{step:03d}.npz")

    def gradient_path(self, step: int) -> str:
        return FileSystems.join(self.output, "passes", f"gradient-{step:03d}.npz")

    @property
    def spec(self) -> dict:
        return {
            "tokens": bj.ArraySpec(("L",), np.int32),
            "label": bj.ArraySpec((), np.int32, valid_range=(0, len(self.noise.classes))),
        }


def _examples(table: pa.Table, noise: LabelNoise) -> Iterator[tuple[tuple, dict]]:
    """Keyed kernel inputs: ``((id, true, observed), {"tokens", "label": observed})``."""
    tokens = table.column("tokens").combine_chunks()
    values = tokens.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    offsets = tokens.offsets.to_numpy()
    for i, (key, label) in enumerate(
        zip(table.column("id").to_pylist(), table.column("label").to_pylist(), strict=True)
    ):
        true, observed = noise.observe(key, label)
        element = {"tokens": values[offsets[i] : offsets[i + 1]], "label": np.int32(observed)}
        yield (key, true, observed), element


def _read_examples(pipeline: beam.Pipeline, job: _Job):
    return (
        pipeline
        | "ReadRecords" >> ReadFromParquetBatched(job.records)
        | "Examples" >> beam.FlatMap(_examples, job.noise)
    )


def _save_params(params: dict, path: str) -> None:
    if "://" not in path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    bj.save_params(params, path)


def _save_reduction(reduction: bj.Reduction, path: str) -> None:
    if reduction.total is None:
        raise bj.KernelError(
            "no record reached the gradient sum (all were dead-lettered); see failed/"
        )
    _save_params({"total": reduction.total, "count": np.int64(reduction.count)}, path)


@dataclasses.dataclass(frozen=True)
class PassStats:
    """One full-batch pass: the loss and accuracy at the parameters it started from.

    Attributes:
        loss: Mean cross-entropy against the observed labels.
        accuracy: Share of records whose predicted class is their observed label.
        count: Records summed.
        dead_letters: Records dead-lettered in this pass (e.g. a non-finite gradient).
        compiles: Batch shapes compiled (or loaded from the compilation cache).
        seconds: Wall time of the pass, pipeline start-up included.
    """

    loss: float
    accuracy: float
    count: int
    dead_letters: int
    compiles: int
    seconds: float


def _run_pipeline(pipeline: beam.Pipeline):
    result = pipeline.run()
    result.wait_until_finish()
    return result


def gradient_pass(job: _Job, step: int) -> tuple[dict, PassStats]:
    """One pipeline run: the full-batch mean gradient at ``params-step``.

    Returns:
        The mean gradient (a dict like the parameters) and the pass's statistics.
    """
    started = time.perf_counter()
    pipeline = beam.Pipeline(options=job.options)
    total, dead = (
        _read_examples(pipeline, job)
        | "FullBatchGradient"
        >> bj.ReduceKernel(
            cm.gradient_kernel,
            spec=job.spec,
            bucketing=job.bucketing,
            load_params=functools.partial(bj.load_params, job.params_path(step)),
            keyed=True,
            validation=bj.Validation(check_outputs_finite=True),
            compilation_cache_dir=job.compilation_cache_dir,
        ).with_exception_handling()
    )
    _ = total | "SaveGradient" >> beam.Map(_save_reduction, job.gradient_path(step))
    _write_dead_letters(dead, job.output, f"pass-{step:03d}")
    kernel = bj.summarize(_run_pipeline(pipeline))
    saved = bj.load_params(job.gradient_path(step))
    # save_params stores 0-d arrays with shape (1,): read scalars with .item().
    count = int(saved["count"].item())
    total = saved["total"]
    grad = {k: np.asarray(v, np.float64) / count for k, v in total["grad"].items()}
    stats = PassStats(
        loss=total["loss"].item() / count,
        accuracy=total["correct"].item() / count,
        count=count,
        dead_letters=kernel.dead_letters,
        compiles=kernel.compiles,
        seconds=time.perf_counter() - started,
    )
    return grad, stats


def _scores_table(rows: Sequence[tuple[tuple, dict]], schema: pa.Schema, classes) -> pa.Table:
    names = np.asarray(classes, dtype=object)
    true = np.array([k[1] for k, _ in rows])
    observed = np.array([k[2] for k, _ in rows])
    columns = {
        "id": pa.array([k[0] for k, _ in rows], schema.field("id").type),
        "label": pa.array(names[observed].tolist(), pa.string()),
        "true_label": pa.array(names[true].tolist(), pa.string()),
        "flipped": pa.array(true != observed),
        **{s: pa.array(np.array([o[s] for _, o in rows], np.float32)) for s in SCORES},
        "predicted": pa.array(names[[int(o["predicted"]) for _, o in rows]].tolist()),
    }
    return pa.Table.from_pydict(columns, schema=schema)


def _scores_schema(id_type: pa.DataType) -> pa.Schema:
    return pa.schema(
        [("id", id_type), ("label", pa.string()), ("true_label", pa.string()),
         ("flipped", pa.bool_())]
        + [(s, pa.float32()) for s in SCORES]
        + [("predicted", pa.string())]
    )  # fmt: skip


def score_pass(job: _Job, step: int, id_type: pa.DataType) -> bj.Summary:
    """One pipeline run: every record's scores at ``params-step``, to ``scores-*.parquet``."""
    pipeline = beam.Pipeline(options=job.options)
    results, dead = (
        _read_examples(pipeline, job)
        | "Score"
        >> bj.RunKernel(
            cm.score_kernel,
            spec=job.spec,
            bucketing=job.bucketing,
            load_params=functools.partial(bj.load_params, job.params_path(step)),
            batched=True,
            keyed=True,
            validation=bj.Validation(check_outputs_finite=True),
            compilation_cache_dir=job.compilation_cache_dir,
        ).with_exception_handling()
    )
    schema = _scores_schema(id_type)
    _ = (
        results
        | "BatchScores"
        >> beam.BatchElements(min_batch_size=_ROWS_PER_TABLE, max_batch_size=_ROWS_PER_TABLE)
        | "ScoresToArrow" >> beam.Map(_scores_table, schema, job.noise.classes)
        | "WriteScores"
        >> WriteToParquetBatched(
            FileSystems.join(job.output, "scores"), schema, file_name_suffix=".parquet"
        )
    )
    _write_dead_letters(dead, job.output, "score")
    return bj.summarize(_run_pipeline(pipeline))


# ---------------------------------------------------------------- the driver


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
    passes: tuple[PassStats, ...]
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
            for s in SCORES
            if s in self.auroc
        )
        return (
            f"curate: {self.rows} rows -> {self.records} records ({self.flipped} flipped), "
            f"{self.dead_letters} dead letters; {len(self.passes)} full-batch passes, loss "
            f"{self.passes[0].loss:.3f} -> {self.final_loss:.3f}; {found or 'no flips to find'}"
            f"; {self.seconds['total']:.1f} s wall"
        )


def _remove_previous_outputs(output: str) -> None:
    # A rerun writes a new set of files; old shards or passes of another count would linger.
    patterns = [
        FileSystems.join(output, "data", "*"),
        FileSystems.join(output, "passes", "*.npz"),
        FileSystems.join(output, "failed", "*.jsonl"),
        FileSystems.join(output, "scores-*-of-*.parquet"),
        FileSystems.join(output, "summary.json"),
        FileSystems.join(output, "curate.png"),
    ]
    old = [m.path for r in FileSystems.match(patterns) for m in r.metadata_list]
    if old:
        FileSystems.delete(old)


def prepare(args: argparse.Namespace, options: PipelineOptions) -> tuple[dict, dict, tr.IdType]:
    """One pipeline run: rows checked and tokenized into ``data/records-*.parquet``.

    Returns:
        The stats (label and length counts), this run's counters, and the id type.
    """
    pipeline = beam.Pipeline(options=options)
    rows, id_type = _read_rows(pipeline, args)
    records = rows | "ToRecords" >> beam.ParDo(ToRecords(id_type)).with_outputs(
        tr.DEAD_LETTERS, main="records"
    )
    schema = _records_schema(id_type)
    data = FileSystems.join(args.output, "data")
    _ = (
        records.records
        | "BatchRecords"
        >> beam.BatchElements(min_batch_size=_ROWS_PER_TABLE, max_batch_size=_ROWS_PER_TABLE)
        | "RecordsToArrow" >> beam.Map(_records_table, schema)
        | "WriteRecords"
        >> WriteToParquetBatched(
            FileSystems.join(data, "records"), schema, file_name_suffix=".parquet"
        )
    )
    _ = (
        records.records
        | "Stats" >> beam.CombineGlobally(_Stats())
        | "WriteStats" >> beam.Map(_write_json, FileSystems.join(data, "stats.json"))
    )
    _write_dead_letters(records[tr.DEAD_LETTERS], args.output, "prepare")
    result = _run_pipeline(pipeline)
    stats = _read_json(FileSystems.join(data, "stats.json"))
    return stats, bj.metric_totals(result, METRICS_NAMESPACE), id_type


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
            tables.append(pq.read_table(f, columns=[*SCORES, "flipped"]))
    table = pa.concat_tables(tables)
    scores = {s: table.column(s).to_numpy() for s in SCORES}
    return scores, table.column("flipped").to_numpy(zero_copy_only=False)


def run(argv: Sequence[str] | None = None) -> CurateSummary:
    """Runs the job to completion, prints a summary and returns it.

    Args:
        argv: Command-line flags (see ``python -m pipelines.curate --help``); Beam's flags
            pass through to every pipeline run. ``None`` reads ``sys.argv``.

    Returns:
        The counts, the loss per pass, and how well each score finds the flipped labels.
    """
    started = time.perf_counter()
    args, options = parse_args(argv)
    report.require_matplotlib()
    _remove_previous_outputs(args.output)

    stats, counters, id_type = prepare(args, options)
    prepared = time.perf_counter()
    if sum(stats["labels"].values()) == 0:
        raise ValueError(f"no usable rows; see the dead letters in {args.output}/failed/")
    classes = tuple(sorted(stats["labels"]))
    job = _Job(
        output=args.output,
        noise=LabelNoise(classes, args.flip_fraction, args.seed),
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
    _save_params(params, job.params_path(0))
    optimizer = cm.Adam(learning_rate=args.learning_rate)
    state = optimizer.init(params)
    passes = []
    for step in range(args.passes):
        grad, stats_t = gradient_pass(job, step)
        params, state = optimizer.update(grad, state, params)
        _save_params(params, job.params_path(step + 1))
        passes.append(stats_t)
        logging.info("pass %d: loss %.4f, %.1f s", step, stats_t.loss, stats_t.seconds)
    trained = time.perf_counter()

    kernel = score_pass(job, args.passes, id_type.arrow_type)
    scores, flipped = _evaluate(args.output)
    auroc, precision = {}, {}
    if flipped.any() and not flipped.all():
        for s in SCORES:
            auroc[s] = report.auroc(scores[s], flipped)
            precision[s] = report.precision_at(scores[s], flipped, TOP_FRACTION)
        auroc["random"], precision["random"] = 0.5, float(flipped.mean())
    dead = {
        VALIDATION: counters.get(f"dead_letters_{VALIDATION}", 0),
        TOKENIZE: counters.get(f"dead_letters_{TOKENIZE}", 0),
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
    _write_json(summary.to_json(), FileSystems.join(args.output, "summary.json"))
    _plot(summary, scores, flipped, args.output)
    print(summary, flush=True)
    return summary


def _plot(summary: CurateSummary, scores, flipped, output: str) -> None:
    import tempfile

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


def main() -> None:
    logging.getLogger().setLevel(logging.WARNING)
    run()


if __name__ == "__main__":
    # Re-import under the package name, so what Beam pickles refers to `pipelines.curate`.
    from pipelines import curate

    curate.main()
