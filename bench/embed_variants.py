"""The variants of bench/embed_text.py (its docstring says what each measures): their names
and groups, and one function each, run in a child process of its own (``child``) pinned to
the benchmark's CPUs, which prints its result on one line for the parent."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import harness
from embed_host import (
    DIM,
    Collections,
    FirstPart,
    job_parts,
    model_dir,
    taken_away,
    trivial_encoder,
)

VARIANTS = (
    "pipeline",
    "sentence_transformers",
    "sentence_transformers_bf16",
    "runinference",
    "host_only",
    "host_only_buckets",
    "host_only_pretokenized",
    "host_only_no_vectors",
    "host_only_neither",
    "tokenize_only",
    "tokenize_only_rust",
    "tokenize_in_beam",
    "write_only",
    "pipeline_packed",
    "pipeline_buckets",
    "pipeline_float32",
    "pipeline_threads",
    "host_only_threads",
)
HOST_ONLY = {
    "host_only": [],
    "host_only_buckets": ["--batching", "buckets"],
    "host_only_threads": [],
}
# host_only with background steps taken away (see taken_away).
HOST_WITHOUT = {
    "host_only_pretokenized": ("tokenize",),
    "host_only_no_vectors": ("vectors",),
    "host_only_neither": ("tokenize", "vectors"),
}
# The Beam jobs whose CPU and launch are reported beside their rate (embed_report's
# cpu_bounds and after_launch): the host's, and the one that only reads and tokenizes.
TIMED_JOBS = (*HOST_ONLY, *HOST_WITHOUT, "tokenize_in_beam")
# The flagship with its batching chosen; "pipeline" lets it choose.
FLAGSHIPS = {
    "pipeline": [],
    "pipeline_packed": ["--batching", "packed"],
    "pipeline_buckets": ["--batching", "buckets"],
    "pipeline_float32": ["--matmuls", "float32"],
    "pipeline_threads": [],
}
# Bundles in threads of the one process, as an accelerator worker runs them (one SDK
# process, its harness threads): the in-memory FnApiRunner running one bundle per
# benchmark core at once (``bundle_threads``).
THREADED = ("pipeline_threads", "host_only_threads")
# sentence-transformers in each precision: the torch dtype it computes in.
ST_VARIANTS = {"sentence_transformers": "float32", "sentence_transformers_bf16": "bfloat16"}
MODEL_VARIANTS = (*FLAGSHIPS, *ST_VARIANTS, "runinference")
# The variants whose latest output is read after the rounds (the cosine).
COMPARED = (*FLAGSHIPS, *ST_VARIANTS)
# The flagship against sentence-transformers at the same precision.
SAME_PRECISION = (
    ("pipeline_float32", "sentence_transformers"),
    ("pipeline", "sentence_transformers_bf16"),
)
BATCH_SIZE = 64

# Runs in the interpreter that has sentence-transformers (and torch); needs no jax.
ST_SCRIPT = r"""
import json, sys, time
import numpy as np, torch
cfg = json.load(open(sys.argv[1]))
torch.set_num_threads(cfg["threads"])
from sentence_transformers import SentenceTransformer
texts = json.load(open(cfg["texts"]))
model = SentenceTransformer(cfg["model_dir"], device=cfg["st_device"])
if cfg["st_dtype"] == "bfloat16":  # autocast: bfloat16 matmuls, as on CPUs with AMX
    kind = "cuda" if str(model.device).startswith("cuda") else "cpu"
    torch.autocast(kind, dtype=torch.bfloat16).__enter__()
# One batch first: the steady state, as the flagship's warm rounds.
model.encode(texts[: cfg["batch_size"]], batch_size=cfg["batch_size"], convert_to_numpy=True)
start = time.perf_counter()
vectors = model.encode(texts, batch_size=cfg["batch_size"], convert_to_numpy=True)
seconds = time.perf_counter() - start  # the vectors are on the host: the device is done
np.save(cfg["out"], vectors.astype(np.float32))
print("RESULT " + json.dumps(
    {"seconds": seconds, "torch": torch.__version__, "device": str(model.device),
     "st_dtype": cfg["st_dtype"]}
), flush=True)
"""


def _matmuls(cfg: dict) -> str:
    """The dtype the flagship's dense matmuls ran in, in this (its only worker's) process:
    ``--matmuls`` resolved as its worker resolved it (measured once per process)."""
    from beam_jax.text import SentenceEncoder
    from pipelines.embed.flags import parse_args

    args, _ = parse_args(["--runner=FnApiRunner", *cfg["pipeline_args"]])
    return SentenceEncoder.from_dir(cfg["model_dir"], matmuls=args.matmuls).resolved_matmuls()


def pipeline(cfg: dict, encoder=None) -> dict:
    """``pipelines.embed`` on the FnApiRunner (with ``encoder`` in place of the model's, if
    given), timed from ``run()`` called to the job finished, with its launch and end."""
    from pipelines.embed import job

    out = Path(cfg["out"])
    with Collections() as collections, FirstPart() as first_part:
        start, cpu_start = time.perf_counter(), time.process_time()
        summary = job.run(
            ["--input", cfg["parquet"], "--output", str(out), "--runner=FnApiRunner"]
            + cfg["pipeline_args"],
            encoder=encoder,
        )
    seconds, run_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    if not summary.conserved or summary.results != cfg["n"]:
        raise AssertionError(f"pipeline lost rows: {summary}")
    return {
        "matmuls": None if encoder else _matmuls(cfg),
        "seconds": seconds,
        "run_cpu_s": run_cpu_s,
        "compiles": summary.compiles,
        "compile_seconds": summary.compile_seconds,
        # Compile time batches waited for (the critical path), apart from the rest, which
        # ran in background threads while the job read and tokenized.
        "compile_wait_seconds": summary.compile_wait_seconds,
        # How long the job waited for the device's results: the device on the critical path.
        "result_wait_seconds": summary.kernel.result_wait_seconds,
        "padding_ratio": summary.padding_ratio,
        "load_at_end": os.getloadavg()[0],
        # The cyclic garbage collector during the run: full passes walk every live object.
        "gc_full_passes": collections.full,
        "gc_full_s": collections.full_s,
        "gc_young_s": collections.young_s,
        # From run() called to the first part tokenized: the launch, paid once per job.
        "launch_s": None if first_part.at is None else first_part.at - start,
        "first_part_epoch": first_part.at_epoch,
        # From the last part tokenized to run() returned: the parts still in the job then.
        "end_s": None if first_part.last is None else start + seconds - first_part.last,
    }


def host_only(cfg: dict, flags: list[str], without: tuple[str, ...] = ()) -> dict:
    """``pipeline`` with the encoder (and its parameters) swapped for a trivial kernel, and
    the steps ``without`` names taken away (``taken_away``)."""
    encoder = trivial_encoder()
    cfg = dict(cfg, pipeline_args=cfg["pipeline_args"] + flags)
    counts = taken_away(cfg, without)
    return {**pipeline(cfg, encoder), **counts}


def flagship(cfg: dict, flags: list[str]) -> dict:
    """``pipeline`` with ``flags`` (the batching chosen), plus the slots the kernel ran at
    each row length, from the job's per-bucket metrics (``OUTPUT/_metrics.json``)."""
    out = pipeline(dict(cfg, pipeline_args=cfg["pipeline_args"] + flags))
    record = json.loads((Path(cfg["out"]) / "_metrics.json").read_text())
    out["slots_by_length"] = {
        label: totals["padded_size"] for label, totals in record["buckets"].items()
    }
    return out


def tokenize_only_rust(cfg: dict) -> dict:
    """``tokenize_only`` with the Rust tokenizer for every text."""
    return tokenize_only(cfg, rust=True)


def tokenize_only(cfg: dict, rust: bool = False) -> dict:
    """The host's floor: read the Parquet row group by row group and tokenize each one's
    texts with the flagship's tokenizer call (``Tokenizer.encode_arrow`` on the column:
    printable-ASCII texts with numpy, the others by the Rust tokenizer with threads from
    ``RAYON_NUM_THREADS``), nothing else.

    The tokenizer is loaded before the clock starts; every text and token is counted
    against the data's.
    """
    import pyarrow.parquet as pq

    from beam_jax.text import SentenceEncoder

    tokenizer = SentenceEncoder.from_dir(cfg["model_dir"]).tokenizer()
    start, cpu_start = time.perf_counter(), time.process_time()
    texts = tokens = 0
    parquet = pq.ParquetFile(cfg["parquet"])
    for group in range(parquet.num_row_groups):
        column = parquet.read_row_group(group, columns=["text"]).column("text")
        encode = tokenizer._encode_arrow_rust if rust else tokenizer.encode_arrow
        ids, failures = encode(column)
        if failures:
            raise AssertionError(f"row group {group}: {len(failures)} rows failed to tokenize")
        texts += len(ids)
        tokens += len(ids.values)
    seconds, run_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    if (texts, tokens) != (cfg["n"], cfg["tokens"]):
        raise AssertionError(
            f"tokenized {texts} texts into {tokens} tokens; expected {cfg['n']} and {cfg['tokens']}"
        )
    return {"seconds": seconds, "run_cpu_s": run_cpu_s, "tokens": tokens}


def write_only(cfg: dict) -> dict:
    """What the job writes, written alone (see the module's docstring); every id is
    counted against the data's."""
    import numpy as np
    import pyarrow as pa

    from pipelines.embed import write

    schema = write.embeddings_schema(pa.int64())
    out = Path(cfg["out"])
    start, cpu_start = time.perf_counter(), time.process_time()
    parquet, parts = job_parts(cfg)
    rows = 0
    for k, groups in enumerate(parts):
        ids = parquet.read_row_groups(groups, columns=["id"]).column("id").combine_chunks()
        vectors = np.empty((len(ids), DIM), np.float32)
        vectors[:] = ids.to_numpy()[:, None]  # a value per row, as the host's kernel gives
        table = write.embeddings_table(ids, vectors, schema)
        write.write_embeddings(table, str(out / f"embeddings-{k:05d}.parquet"))
        rows += len(ids)
    seconds, run_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    if rows != cfg["n"]:
        raise AssertionError(f"wrote {rows} rows; expected {cfg['n']}")
    return {"seconds": seconds, "run_cpu_s": run_cpu_s}


def tokenize_in_beam(cfg: dict) -> dict:
    """The flagship's read and tokenize steps alone in a Beam pipeline (see the module's
    docstring), every text and token counted against the data's."""
    import apache_beam as beam
    import pyarrow.compute as pc

    import beam_jax as bj
    from beam_jax.text import SentenceEncoder
    from pipelines.embed.flags import parse_args
    from pipelines.embed.job import _id_type, _read_and_tokenize
    from pipelines.embed.parts import Inputs
    from pipelines.embed.tokenize import INPUT_IDS

    args, options = parse_args(
        ["--input", cfg["parquet"], "--output", cfg["out"], "--runner=FnApiRunner"]
        + cfg["pipeline_args"]
    )
    model = SentenceEncoder.from_dir(args.model_dir)
    model.tokenizer()  # loaded before the clock; the tokenize step shares it
    inputs = Inputs.from_args(args)
    id_type = _id_type(args, inputs)

    class CountTokens(beam.DoFn):
        def setup(self):
            self._texts = beam.metrics.Metrics.counter("bench", "texts")
            self._tokens = beam.metrics.Metrics.counter("bench", "tokens")

        def process(self, batch):
            self._texts.inc(batch.num_rows)
            self._tokens.inc(pc.sum(pc.list_value_length(batch.column(INPUT_IDS))).as_py())

    with FirstPart() as first_part:
        start, cpu_start = time.perf_counter(), time.process_time()
        pipeline = beam.Pipeline(options=options)
        tokens, _ = _read_and_tokenize(pipeline, args, model, inputs, id_type)
        _ = tokens.tokens | "Count" >> beam.ParDo(CountTokens())
        result = pipeline.run()
        result.wait_until_finish()
    seconds, run_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    counted = bj.metric_totals(result, "bench")
    if (counted.get("texts"), counted.get("tokens")) != (cfg["n"], cfg["tokens"]):
        raise AssertionError(
            f"the pipeline tokenized {counted.get('texts')} texts into {counted.get('tokens')} "
            f"tokens; expected {cfg['n']} and {cfg['tokens']}"
        )
    return {
        "seconds": seconds,
        "run_cpu_s": run_cpu_s,
        "tokens": counted["tokens"],
        "launch_s": None if first_part.at is None else first_part.at - start,
    }


def runinference(cfg: dict) -> dict:
    """The same model under stock ``RunInference``, set up as a careful user would."""
    import apache_beam as beam
    import jax
    import numpy as np
    import pyarrow as pa
    from apache_beam.io.parquetio import ReadFromParquetBatched, WriteToParquetBatched
    from apache_beam.metrics import Metrics
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.ml.inference.base import (
        KeyedModelHandler,
        ModelHandler,
        PredictionResult,
        RunInference,
    )
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_jax.text import SentenceEncoder
    from pipelines.embed.write import embeddings_schema

    class Model:
        """The parameters, tokenizer and jitted function (a class: Beam keeps a weakref)."""

        def __init__(self):
            encoder = SentenceEncoder.from_dir(model_dir())
            self.params = jax.device_put(encoder.load_params())
            self.tokenizer = encoder.tokenizer()
            self.fn = jax.jit(jax.vmap(encoder.element_fn, in_axes=(None, 0, 0)))
            self.shapes = set()

    from beam_jax._src.kernel.cache import enable_compilation_cache
    from pipelines.embed.flags import DEFAULT_BUCKETS

    bounds = tuple(DEFAULT_BUCKETS)

    class PadToBucket(ModelHandler):
        """Pad a batch of ``(id, token ids)`` to 64 rows and its bucket's length, run it."""

        def __init__(self):
            # Beam's buckets are lower-inclusive: ``b + 1`` groups lengths up to ``b``.
            super().__init__(
                min_batch_size=BATCH_SIZE,
                max_batch_size=BATCH_SIZE,
                # Needed for Beam's length-aware keying; a bucket's last partial batch
                # waits this long for its timer on the FnApiRunner.
                max_batch_duration_secs=1,
                batch_length_fn=lambda kv: len(kv[1]),  # KeyedModelHandler: (id, ids)
                batch_bucket_boundaries=[b + 1 for b in bounds[:-1]],
            )

        def load_model(self):
            enable_compilation_cache(cfg["cache_dir"])
            return Model()

        def run_inference(self, batch, model, inference_args=None):
            lengths = np.array([len(x) for x in batch], np.int32)
            width = next(b for b in bounds if b >= lengths.max())
            padded = np.zeros((BATCH_SIZE, width), np.int32)
            for row, x in enumerate(batch):
                padded[row, : len(x)] = x
            full = np.zeros(BATCH_SIZE, np.int32)
            full[: len(batch)] = lengths
            if padded.shape not in model.shapes:  # jax.jit compiles it (or loads it) now
                model.shapes.add(padded.shape)
                Metrics.counter("bench", "compiles").inc()
            Metrics.counter("bench", "padded_tokens").inc(padded.size)
            Metrics.counter("bench", f"padded_tokens_{width}").inc(padded.size)
            out = np.asarray(model.fn(model.params, {"input_ids": padded}, {"L": full}))
            return [PredictionResult(x, v) for x, v in zip(batch, out[: len(batch)], strict=True)]

    class Tokenize(beam.DoFn):
        def setup(self):
            self.tokenizer = SentenceEncoder.from_dir(model_dir()).tokenizer()

        def process(self, table):
            ids = self.tokenizer.encode_batch(table.column("text").to_pylist())
            yield from zip(table.column("id").to_pylist(), ids, strict=True)

    schema = embeddings_schema(pa.int64())  # the flagship's parts' columns
    start = time.perf_counter()
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    _ = (
        p
        | ReadFromParquetBatched(cfg["parquet"], columns=["id", "text"])
        | beam.ParDo(Tokenize())
        | RunInference(KeyedModelHandler(PadToBucket()))
        | beam.MapTuple(lambda key, result: (key, result.inference))
        | beam.BatchElements(min_batch_size=1024, max_batch_size=1024)
        | beam.Map(_embeddings_table, schema)
        | WriteToParquetBatched(
            str(Path(cfg["out"]) / "embeddings"), schema, file_name_suffix=".parquet"
        )
    )
    result = p.run()
    result.wait_until_finish()
    seconds = time.perf_counter() - start
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query(MetricsFilter().with_namespace("bench"))["counters"]
    }
    prefix = "padded_tokens_"
    return {
        "seconds": seconds,
        "compiles": counters.get("compiles", 0),
        "padding_ratio": counters.get("padded_tokens", 0) / cfg["tokens"],
        "slots_by_length": {
            k[len(prefix) :]: v for k, v in counters.items() if k.startswith(prefix)
        },
    }


def _embeddings_table(rows, schema):
    """``(id, float32[D])`` pairs as one Arrow table of ``schema``, without per-value Python."""
    import numpy as np
    import pyarrow as pa

    from pipelines.embed.write import embeddings_table

    if not rows:
        return schema.empty_table()
    vectors = np.stack([np.asarray(v, np.float32) for _, v in rows])
    return embeddings_table(pa.array([k for k, _ in rows]), vectors, schema)


def bundle_threads(cfg: dict) -> list[str]:
    """The flags of the ``THREADED`` variants: one bundle worker per benchmark core."""
    return [f"--direct_num_workers={cfg['threads']}"]


def child(variant: str, cfg_path: str) -> None:
    """Runs ``variant`` on the config the parent wrote, pinned to its CPUs; prints the result."""
    cfg = json.loads(Path(cfg_path).read_text())
    harness.pin(cfg["threads"])
    if variant in THREADED:
        cfg["pipeline_args"] = cfg["pipeline_args"] + bundle_threads(cfg)
    if variant in HOST_ONLY:
        out = host_only(cfg, HOST_ONLY[variant])
    elif variant in HOST_WITHOUT:
        out = host_only(cfg, [], HOST_WITHOUT[variant])
    elif variant in FLAGSHIPS:
        out = flagship(cfg, FLAGSHIPS[variant])
    else:
        out = {
            "runinference": runinference,
            "tokenize_only": tokenize_only,
            "tokenize_only_rust": tokenize_only_rust,
            "tokenize_in_beam": tokenize_in_beam,
            "write_only": write_only,
        }[variant](cfg)
    harness.emit(out)
