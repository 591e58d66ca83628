"""``bench/embed.py``'s variants, one function each, run in a child process of their own
(``child``) pinned to the benchmark's CPUs, which prints its result on one line for the
parent. ``bench/embed.py``'s docstring says what each measures."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

from bench._lib import harness

BATCH_SIZE = 64
DIM = 384
# The flagship's variants, and its limit's: their flags beside the benchmark's --pipeline-args.
XLA = ["--layer_kernel", "xla"]
FLAGSHIPS = {"pipeline": [], "pipeline_float32": ["--matmuls", "float32"], "pipeline_xla": XLA}
LIMITS = {"limit": [], "limit_xla": XLA}
# sentence-transformers in each precision: the torch dtype it computes in.
ST_VARIANTS = {"sentence_transformers": "float32", "sentence_transformers_bf16": "bfloat16"}
VARIANTS = (*LIMITS, *FLAGSHIPS, *ST_VARIANTS, "runinference", "host_only", "tokenize_only")
MODEL_VARIANTS = (*LIMITS, *FLAGSHIPS, *ST_VARIANTS, "runinference")
# Run when named: XLA's layers, the default's off a TPU.
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v not in ("limit_xla", "pipeline_xla"))

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
print(f"sentence-transformers on {model.device}, {cfg['st_dtype']}", flush=True)
# One batch first: the steady state, as the flagship's warm rounds.
model.encode(texts[: cfg["batch_size"]], batch_size=cfg["batch_size"], convert_to_numpy=True)
start = time.perf_counter()
vectors = model.encode(texts, batch_size=cfg["batch_size"], convert_to_numpy=True)
seconds = time.perf_counter() - start  # the vectors are on the host: the device is done
np.save(cfg["out"] + "/vectors.npy", vectors.astype(np.float32))
print("RESULT " + json.dumps(
    {"seconds": seconds, "torch": torch.__version__, "device": "torch " + str(model.device),
     "matmuls": cfg["st_dtype"]}
), flush=True)
"""


def _job_argv(cfg: dict, flags: list[str]) -> list[str]:
    return ["--input", cfg["parquet"], "--output", cfg["out"], "--runner=FnApiRunner",
            "--compilation_cache_dir", cfg["cache_dir"], *cfg["pipeline_args"], *flags]  # fmt: skip


def pipeline(cfg: dict, flags: list[str], encoder=None) -> dict:
    """``pipelines.embed`` on the FnApiRunner (with ``encoder`` in place of the model's, if
    given), timed from ``run()`` called to the job finished."""
    from beam_jax.text import SentenceEncoder
    from pipelines.embed import job
    from pipelines.embed.flags import parse_args

    start = time.perf_counter()
    summary = job.run(_job_argv(cfg, flags), encoder=encoder)
    seconds = time.perf_counter() - start
    if not summary.conserved or summary.results != cfg["n"]:
        raise AssertionError(f"the flagship lost rows: {summary}")
    args, _ = parse_args(_job_argv(cfg, flags))
    matmuls = SentenceEncoder.from_dir(args.model_dir, matmuls=args.matmuls).resolved_matmuls()
    return {
        "seconds": seconds,
        "device": harness.device(),
        "matmuls": None if encoder else matmuls,
        "compiles": summary.compiles,
        "compile_seconds": summary.compile_seconds,
        "compile_trace_seconds": summary.kernel.compile_trace_seconds,
        "padding_ratio": summary.padding_ratio,
        "batching": summary.batching,
    }


def _trivial_kernel(params, element, lengths):
    """384 floats from a text's token ids, at no cost: the sum of its real token ids."""
    import jax.numpy as jnp

    ids = element["input_ids"]
    total = jnp.sum(jnp.where(jnp.arange(ids.shape[0]) < lengths["L"], ids, 0))
    return jnp.broadcast_to(total.astype(jnp.float32), (DIM,))


def _trivial_packed_kernel(params, row, segments):
    """``_trivial_kernel`` for a packed row: each segment's sum of token ids, repeated."""
    import jax.numpy as jnp

    n = segments.lengths.shape[-1]
    # A one-hot product, not a scatter (slow on CPU): exact, as every sum is below 2**24.
    one_hot = (segments.ids[:, None] == jnp.arange(1, n + 1)[None, :]).astype(jnp.float32)
    totals = row["input_ids"].astype(jnp.float32) @ one_hot
    return jnp.broadcast_to(totals[:, None], (n, DIM))


def _no_params():
    return {}


def host_only(cfg: dict) -> dict:
    """The flagship with a kernel that takes no time (the job's ``Encoder`` hook)."""
    from pipelines.embed.job import Encoder

    return pipeline(cfg, [], Encoder(_trivial_kernel, _trivial_packed_kernel, _no_params))


def tokenize_only(cfg: dict) -> dict:
    """The Parquet read row group by row group, each one's texts tokenized with the
    flagship's call (``Tokenizer.encode_arrow``), nothing else; every token counted."""
    import pyarrow.parquet as pq

    from beam_jax.text import SentenceEncoder

    tokenizer = SentenceEncoder.from_dir(cfg["model_dir"]).tokenizer()
    start, texts, tokens = time.perf_counter(), 0, 0
    parquet = pq.ParquetFile(cfg["parquet"])
    for group in range(parquet.num_row_groups):
        ids, failures = tokenizer.encode_arrow(parquet.read_row_group(group).column("text"))
        if failures:
            raise AssertionError(f"row group {group}: {len(failures)} rows failed to tokenize")
        texts, tokens = texts + len(ids), tokens + len(ids.values)
    seconds = time.perf_counter() - start
    if (texts, tokens) != (cfg["n"], cfg["tokens"]):
        raise AssertionError(f"tokenized {texts} texts into {tokens} tokens; expected "
                             f"{cfg['n']} and {cfg['tokens']}")  # fmt: skip
    return {"seconds": seconds, "device": "host (no JAX)"}


def runinference(cfg: dict) -> dict:
    """The same model under stock ``RunInference``, set up as a careful user would: texts
    tokenized first, Beam's own length buckets at the flagship's default boundaries,
    batches of exactly 64 padded to 64 rows and their bucket's length (one compile per
    bucket), JAX's persistent compilation cache; the same Parquet in and out."""
    import apache_beam as beam
    import jax
    import numpy as np
    import pyarrow as pa
    from apache_beam.io.parquetio import ReadFromParquetBatched, WriteToParquetBatched
    from apache_beam.ml.inference.base import (
        KeyedModelHandler,
        ModelHandler,
        PredictionResult,
        RunInference,
    )

    from beam_jax.jobs import embeddings_schema, embeddings_table
    from beam_jax.text import SentenceEncoder
    from pipelines.embed.flags import DEFAULT_BUCKETS

    bounds = tuple(DEFAULT_BUCKETS)

    class Model:  # a class: Beam keeps a weak reference to the model
        def __init__(self):
            jax.config.update("jax_compilation_cache_dir", cfg["cache_dir"])
            encoder = SentenceEncoder.from_dir(cfg["model_dir"])
            self.params = jax.device_put(encoder.load_params())
            self.fn = jax.jit(jax.vmap(encoder.element_fn, in_axes=(None, 0, 0)))

    class PadToBucket(ModelHandler):
        def __init__(self):
            super().__init__(
                min_batch_size=BATCH_SIZE,
                max_batch_size=BATCH_SIZE,
                max_batch_duration_secs=1,  # a bucket's last batch waits this long
                batch_length_fn=len,  # KeyedModelHandler hands it the token ids
                # Beam's buckets are lower-inclusive: ``b + 1`` groups lengths up to ``b``.
                batch_bucket_boundaries=[b + 1 for b in bounds[:-1]],
            )

        def load_model(self):
            return Model()

        def run_inference(self, batch, model, inference_args=None):
            lengths = np.array([len(x) for x in batch], np.int32)
            width = next(b for b in bounds if b >= lengths.max())
            padded = np.zeros((BATCH_SIZE, width), np.int32)
            for row, x in enumerate(batch):
                padded[row, : len(x)] = x
            full = np.zeros(BATCH_SIZE, np.int32)
            full[: len(batch)] = lengths
            out = np.asarray(model.fn(model.params, {"input_ids": padded}, {"L": full}))
            return [PredictionResult(x, v) for x, v in zip(batch, out, strict=False)]

    class Tokenize(beam.DoFn):
        def setup(self):
            self.tokenizer = SentenceEncoder.from_dir(cfg["model_dir"]).tokenizer()

        def process(self, table):
            ids = self.tokenizer.encode_batch(table.column("text").to_pylist())
            yield from zip(table.column("id").to_pylist(), ids, strict=True)

    def to_table(rows):
        vectors = np.stack([np.asarray(v.inference, np.float32) for _, v in rows])
        return embeddings_table(pa.array([k for k, _ in rows]), vectors, schema)

    schema = embeddings_schema(pa.int64())
    start = time.perf_counter()
    p = beam.Pipeline("FnApiRunner")
    _ = (
        p
        | ReadFromParquetBatched(cfg["parquet"], columns=["id", "text"])
        | beam.ParDo(Tokenize())
        | RunInference(KeyedModelHandler(PadToBucket()))
        | beam.BatchElements(min_batch_size=1024, max_batch_size=1024)
        | beam.Map(to_table)
        | WriteToParquetBatched(f"{cfg['out']}/embeddings", schema, file_name_suffix=".parquet")
    )
    p.run().wait_until_finish()
    seconds = time.perf_counter() - start
    matmuls = SentenceEncoder.from_dir(cfg["model_dir"]).resolved_matmuls()
    return {"seconds": seconds, "device": harness.device(), "matmuls": matmuls}


def child(variant: str, cfg_path: str) -> None:
    """Runs ``variant`` on the config the parent wrote, pinned to its CPUs; emits its result."""
    cfg = json.loads(Path(cfg_path).read_text())
    harness.pin(cfg["threads"])
    if variant in (*FLAGSHIPS, "host_only"):  # as the command's process: the devices open as
        flags = _job_argv(cfg, FLAGSHIPS.get(variant, []))  # pipelines imports, before Beam
        sys.orig_argv = [sys.executable, "-m", "pipelines.embed", *flags]
        importlib.import_module("pipelines")
    if variant in LIMITS:
        from bench._lib.limit import run_limit

        out = run_limit({**cfg, "pipeline_args": cfg["pipeline_args"] + LIMITS[variant]})
    elif variant == "profile":
        from bench._lib.profile import profiled_run

        out = profiled_run(cfg)
    elif variant in FLAGSHIPS:
        out = pipeline(cfg, FLAGSHIPS[variant])
    else:
        out = {"runinference": runinference, "host_only": host_only,
               "tokenize_only": tokenize_only}[variant](cfg)  # fmt: skip
    harness.emit(out)


def child_env(threads: int) -> dict:
    """The children's environment: the repository importable, ``threads`` for each pool."""
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")
    return harness.child_env(**dict.fromkeys(names, str(threads)))


def expected_host_only(texts: list[str], model_dir: str | None = None):
    """What ``host_only`` writes for ``texts``: float32 ``[n, 384]``, each row its text's
    sum of token ids."""
    import numpy as np

    from beam_jax.text import SentenceEncoder

    ids = SentenceEncoder.from_dir(model_dir).tokenizer().encode_batch(texts)
    return np.repeat(np.asarray([int(x.sum()) for x in ids], np.float32)[:, None], DIM, axis=1)


def load_vectors(out: str, n: int):
    """A run's embeddings in id order: ``vectors.npy`` (the limit, sentence-transformers)
    or the ``embeddings*.parquet`` files the Beam jobs wrote."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.exists(f"{out}/vectors.npy"):
        return np.load(f"{out}/vectors.npy")
    files = sorted(Path(out).glob("embeddings*.parquet"))
    table = pa.concat_tables(pq.read_table(f, columns=["id", "embedding"]) for f in files)
    vectors = np.zeros((n, DIM), np.float32)
    vectors[table.column("id").to_numpy()] = np.stack(
        table.column("embedding").to_numpy(zero_copy_only=False)
    )
    return vectors
