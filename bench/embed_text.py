"""Sentence embeddings per second: this pipeline against sentence-transformers and stock Beam.

    python bench/embed_text.py                   # 2,000 built-in texts, 3 rounds (~8 min)
    python bench/embed_text.py --quick           # 300 texts, 1 round (~1 min)
    python bench/embed_text.py --texts 4000 --json out.json
    python bench/embed_text.py --variants host_only,host_only_buckets --texts 100000

Three variants embed the same texts with all-MiniLM-L6-v2 on the same CPUs:

* ``pipeline``: ``pipelines.embed`` on the FnApiRunner, end to end: a Parquet file of
  ``id, text`` in, Parquet of ``id, embedding`` out. Timed from ``run()`` called to the job
  finished, so it includes Beam's start-up, reading, tokenizing, every compile and writing.
* ``sentence_transformers``: ``SentenceTransformer.encode(texts, batch_size=64)`` (it sorts
  by length and pads each batch to its longest text), in a separate interpreter that has
  torch (``--st-python``), on the CPU or on ``--st-device cuda``. Its ``seconds`` are
  ``encode`` alone after one warm-up batch (steady state); ``process_s`` is the whole
  process, as for every variant. ``sentence_transformers_bf16`` runs the same under
  ``torch.autocast(dtype=torch.bfloat16)``: the precision the flagship's ``--matmuls auto``
  takes on bfloat16 hardware. The flagship is set against it at matched precision:
  ``pipeline_float32`` against ``sentence_transformers``, ``pipeline`` against
  ``sentence_transformers_bf16`` (printed under "same precision").
* ``runinference``: the same JAX model under stock ``RunInference`` set up as a careful
  user would: texts tokenized first, Beam's own length buckets (``batch_length_fn`` and
  ``batch_bucket_boundaries`` at the pipeline's bucket boundaries, stateful batching),
  batches of exactly 64 (``min_batch_size=max_batch_size``) padded to 64 rows and to their
  bucket's length, so ``jax.jit`` compiles once per bucket, and JAX's persistent
  compilation cache. Same Parquet in and out as ``pipeline``.

``pipeline`` and ``runinference`` each get a compilation cache of their own, empty before
their first round: round 1 is their cold start, later rounds (median) their warm start, and
the ratios are given cold against cold and warm against warm.

Two more variants measure the host alone, the rate that decides whether an accelerator
would be fed: the whole pipeline (reading, tokenizing, batching, writing Parquet, dead
letters) with the encoder replaced by a trivial kernel of the same output shape (384
floats per text, computed from the token ids, so it takes no time):

* ``host_only``: ``pipelines.embed`` as it runs by default (``--batching auto``).
* ``host_only_buckets``: the same with ``--batching buckets`` (token-length buckets).

Each has a compilation cache of its own. The trivial kernel's output is the sum of the
text's token ids, repeated 384 times (``tests/test_bench.py`` checks every row of it).
For each, the CPU its run used (every thread, from ``run()`` called to the job finished)
is printed with how many cores that kept busy on average and how long the run would take
if that work kept every core busy throughout: the most that overlapping the host's steps
could gain without making them cheaper, also as a rate over ``tokenize_only``'s. Each
run's launch is timed too (from ``run()`` called to the job's first part handed to its
tokenizer: flags, model, plan, pipeline built, runner started, first part read), and the
rate of the rest of the run printed over ``tokenize_only``'s: how near the host runs to its
tokenizer once under way, as on a long job that pays its launch once; and its end, from the
last part tokenized to the job finished (the parts still to embed and write then).

Three more run ``host_only`` with one or both of its background steps taken away, to show
what each adds to the wall (the bundle's own Python, packing rows, dispatching batches and
gathering results, is what is left):

* ``host_only_pretokenized``: every part's token ids computed before the clock; the
  tokenize step's calls return them (``tokenizer_calls`` and ``pretokenized_misses``, the
  calls that found none and tokenized, are recorded).
* ``host_only_no_vectors``: each part's Parquet written with its ids only, not its
  embeddings (the writer's encoding of 384 floats per row taken away).
* ``host_only_neither``: both.

``host_only_*`` against ``tokenize_only`` is printed for each of them.

* ``tokenize_only``: the host's floor: the same Parquet read row group by row group and
  each row group's texts tokenized with the flagship's tokenizer call and settings
  (``Tokenizer.encode_arrow`` on the column: printable-ASCII texts with numpy, the others
  by the Rust tokenizer on all ``--threads`` cores; truncation at the model's window),
  nothing else. ``host_only / tokenize_only`` is printed when both ran.
* ``tokenize_only_rust``: ``tokenize_only`` with every text given to the Rust tokenizer
  (``encode_batch_fast``, the ids without offsets), the floor before printable ASCII was
  tokenized with numpy. ``host_only / tokenize_only_rust`` is printed when both ran.
* ``tokenize_in_beam``: the floor of any Beam job that reads and tokenizes this data: the
  flagship's own read and tokenize steps (``ReadParts``, ``TokenizeParts``) in a pipeline
  on the same runner, their rows and tokens counted, nothing else (no plan, kernel or
  writer). The model is loaded before the clock, as ``tokenize_only``'s tokenizer is; the
  pipeline is built and run on it, and its launch is timed as the host's is.
  ``tokenize_in_beam / tokenize_only`` and ``host_only / tokenize_in_beam`` are printed
  when they ran: what Beam's launch and bundles cost before the host does any of its own
  work, and how near the host comes to that.

* ``write_only``: the host's other floor, what the job writes, written alone: the same
  Parquet's ids read in the job's parts (runs of row groups up to ``--rows_per_part``
  rows), and each part's file written as the job writes it (``write.write_embeddings``:
  the job's schema, 384 float32 per row, staged and renamed), on one thread, nothing
  else. With ``host_only`` and ``tokenize_only``, ``host_only_vs_tokenize_then_write`` is
  printed: the host's rate over that of tokenizing and then writing, one after the other
  (``1 / (1/tokenize + 1/write)``, the serial bound the Arrow benchmark uses for reading
  and computing).

Three more run the flagship with its batching or its matmuls chosen (side by side with
``pipeline``, which lets the flagship choose both), each with a compilation cache of its
own (round 1 cold):

* ``pipeline_packed``: ``--batching packed`` (several texts per row, a few row lengths).
* ``pipeline_buckets``: ``--batching buckets`` (each text padded to its length bucket).
* ``pipeline_float32``: ``--matmuls float32`` (where ``auto`` takes bfloat16's).

For every model variant the table gives the executed FLOPs per real token (``FLOP/tok``,
in MFLOP: attention included, at the lengths the kernel actually ran, padding and empty
rows included; per layer ``8h² + 4h·i`` for the dense parts and ``4·L·h`` for attention
at padded row length ``L``). The flagship's come from its per-bucket metrics
(``_metrics.json``), ``runinference``'s from its batches, sentence-transformers' from its
batching rule (texts sorted by length, batches of 64 padded to their longest).
``pipeline_packed / pipeline_buckets`` is printed cold against cold and warm against warm.

Their rate is texts/s over the whole run, Beam's start-up included; give them many texts
(``--texts 100000``) so the start-up weighs little.

Each variant runs in a fresh process pinned to the same ``--threads`` CPUs (CPU affinity,
torch's and the tokenizer's thread counts). The CPUs here may be shared with other work, so
the variants take turns over ``--rounds`` rounds (order rotated each round) and the table
shows each variant's median time; ``pipeline``'s embeddings are checked against
sentence-transformers' (cosine). ``MFU`` is the encoder's useful FLOPs (real tokens only)
over the whole run's time, divided by the machine's matmul peak (``bench/peak.py``) in the
dtype of the variant's dense matmuls: fp32, or bf16 (bfloat16 inputs, float32 sums) where
the flagship's ``--matmuls`` chose bfloat16, which the table's last lines name.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import harness  # noqa: E402

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
)
HOST_ONLY = {"host_only": [], "host_only_buckets": ["--batching", "buckets"]}
# host_only with background steps taken away (see _taken_away).
HOST_WITHOUT = {
    "host_only_pretokenized": ("tokenize",),
    "host_only_no_vectors": ("vectors",),
    "host_only_neither": ("tokenize", "vectors"),
}
# The Beam jobs whose CPU and launch are reported beside their rate (_cpu_bounds,
# _after_launch): the host's, and the one that only reads and tokenizes.
TIMED_JOBS = (*HOST_ONLY, *HOST_WITHOUT, "tokenize_in_beam")
# The flagship with its batching chosen; "pipeline" lets it choose.
FLAGSHIPS = {
    "pipeline": [],
    "pipeline_packed": ["--batching", "packed"],
    "pipeline_buckets": ["--batching", "buckets"],
    "pipeline_float32": ["--matmuls", "float32"],
}
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
DIM = 384
DEFAULT_ST_PYTHON = "/tmp/refvenv/bin/python"
BATCH_SIZE = 64

# Runs in the interpreter that has sentence-transformers (and torch); needs no jax.
_ST_SCRIPT = r"""
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


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        env[name] = str(threads)
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _model_dir() -> str | None:
    """``--model_dir`` (handed to the children in the environment); None: the packaged model."""
    return os.environ.get("BEAM_JAX_BENCH_MODEL_DIR") or None


def _write_data(workdir: Path, n: int) -> dict:
    """The first ``n`` built-in texts (cycled if more) as Parquet and as a JSON list."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_jax.text import SentenceEncoder, builtin_corpus, packaged_model_dir

    texts = [t for _, t in builtin_corpus()]
    texts = [texts[i % len(texts)] for i in range(n)]
    table = pa.table({"id": pa.array(range(n), pa.int64()), "text": pa.array(texts)})
    pq.write_table(table, workdir / "texts.parquet", row_group_size=1024)
    (workdir / "texts.json").write_text(json.dumps(texts))
    lengths = [
        len(ids) for ids in SentenceEncoder.from_dir(_model_dir()).tokenizer().encode_batch(texts)
    ]
    tokens = sum(lengths)
    return {
        "flops": model_flops(lengths),
        "st_slots_by_length": st_slots_by_length(texts, lengths, BATCH_SIZE),
        "parquet": str(workdir / "texts.parquet"),
        "texts": str(workdir / "texts.json"),
        "model_dir": str(_model_dir() or packaged_model_dir()),
        "n": n,
        "tokens": tokens,
    }


# ---- variants, each run in its own child process --------------------------------------


def _matmuls(cfg: dict) -> str:
    """The dtype the flagship's dense matmuls ran in, in this (its only worker's) process:
    ``--matmuls`` resolved as its worker resolved it (measured once per process)."""
    from beam_jax.text import SentenceEncoder
    from pipelines.embed.flags import parse_args

    args, _ = parse_args(["--runner=FnApiRunner", *cfg["pipeline_args"]])
    return SentenceEncoder.from_dir(cfg["model_dir"], matmuls=args.matmuls).resolved_matmuls()


class _Collections:
    """The garbage collector's passes while installed (in ``gc.callbacks``, for the ``with``
    block): full passes (generation 2) counted and timed, younger ones timed."""

    def __init__(self):
        self.full, self.full_s, self.young_s, self._started = 0, 0.0, 0.0, 0.0

    def __enter__(self):
        import gc

        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        import gc

        gc.callbacks.remove(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        if info["generation"] == 2:
            self.full, self.full_s = self.full + 1, self.full_s + seconds
        else:
            self.young_s += seconds


def _in_tokenize_step() -> bool:
    """Whether this thread is the job's tokenize step's (``TokenizeParts``' ``WorkAhead``),
    not the launch plan's, which tokenizes its sample with the same call."""
    from pipelines.embed.tokenize import THREADS

    return threading.current_thread().name.startswith(THREADS)


class _FirstPart:
    """When the job first hands a part to its tokenizer (``Tokenizer.encode_arrow`` called
    in the tokenize step's thread, ``beam_jax-tokenize``; the launch plan counts its
    sample's tokens with the same call in the launching thread), while installed: the end
    of the job's launch (flags, model, plan, pipeline built, runner started, first part
    read); and when its tokenizer last returned (``last``): what follows is the parts
    still to embed and write, and the job's end."""

    def __init__(self):
        self.at: float | None = None
        self.at_epoch: float | None = None  # the same moment, for the parent's clock
        self.last: float | None = None

    def __enter__(self):
        from beam_jax.text import Tokenizer

        self._encode = encode = Tokenizer.encode_arrow

        def encode_arrow(tokenizer, texts):
            if not _in_tokenize_step():
                return encode(tokenizer, texts)
            if self.at is None:
                self.at, self.at_epoch = time.perf_counter(), time.time()
            out = encode(tokenizer, texts)
            self.last = time.perf_counter()
            return out

        Tokenizer.encode_arrow = encode_arrow
        return self

    def __exit__(self, *exc):
        from beam_jax.text import Tokenizer

        Tokenizer.encode_arrow = self._encode


def _pipeline(cfg: dict, encoder=None) -> dict:
    from pipelines.embed import job

    out = Path(cfg["out"])
    with _Collections() as collections, _FirstPart() as first_part:
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


def _host_only_kernel(params, element, lengths):
    """384 floats from a text's token ids, at no cost: the sum of its real token ids,
    repeated (the encoder's output shape, no model)."""
    import jax.numpy as jnp

    del params
    ids = element["input_ids"]
    real = jnp.arange(ids.shape[0]) < lengths["L"]
    total = jnp.sum(jnp.where(real, ids, 0)).astype(jnp.float32)
    return jnp.broadcast_to(total, (DIM,))


def _host_only_packed_kernel(params, row, segments):
    """``_host_only_kernel`` for a packed row: each segment's sum of token ids, repeated."""
    import jax.numpy as jnp

    del params
    ids, segment = row["input_ids"], segments.ids  # segment 0: an empty slot
    n = segments.lengths.shape[-1]
    # A one-hot product, not a scatter (slow on CPU): exact, as every sum is below 2**24.
    one_hot = (segment[:, None] == jnp.arange(1, n + 1)[None, :]).astype(jnp.float32)
    totals = ids.astype(jnp.float32) @ one_hot
    return jnp.broadcast_to(totals[:, None], (n, DIM))


def host_only_expected(texts: list[str]):
    """What the host-only variants must write for ``texts``: float32 ``[n, 384]``."""
    import numpy as np

    from beam_jax.text import SentenceEncoder

    sums = [
        int(ids.sum())
        for ids in SentenceEncoder.from_dir(_model_dir()).tokenizer().encode_batch(texts)
    ]
    return np.repeat(np.asarray(sums, np.float32)[:, None], DIM, axis=1)


def model_flops(token_lengths) -> float:
    """all-MiniLM-L6-v2's useful FLOPs for texts of these token lengths (matmuls only):
    per layer, 24 H^2 per token (Q, K, V, output: 4 x 2 H^2; MLP: 2 x 2 H x 4H) and
    4 H L^2 per text (scores and weighted values)."""
    import numpy as np

    from beam_jax.text import SentenceEncoder

    config = SentenceEncoder.from_dir(_model_dir()).config
    h, layers = config.hidden_size, config.num_hidden_layers
    n = np.asarray(token_lengths, np.float64)
    return float(layers * np.sum(24 * h * h * n + 4 * h * n * n))


def _host_only(cfg: dict, flags: list[str], without: tuple[str, ...] = ()) -> dict:
    """``_pipeline`` with the encoder (and its parameters) swapped for a trivial kernel, and
    the steps ``without`` names taken away (``_taken_away``)."""
    from pipelines.embed.job import Encoder

    encoder = Encoder(_host_only_kernel, _host_only_packed_kernel, _no_params)
    cfg = dict(cfg, pipeline_args=cfg["pipeline_args"] + flags)
    counts = _taken_away(cfg, without)
    return {**_pipeline(cfg, encoder), **counts}


def _taken_away(cfg: dict, steps: tuple[str, ...]) -> dict:
    """Takes the host's background ``steps`` away, in this (the variant's own) process.

    ``"tokenize"``: the job's parts (runs of row groups up to ``--rows_per_part`` rows, as
    ``ReadArrowBatches`` reads them) are tokenized now, before the clock, and
    ``Tokenizer.encode_arrow``, called by the tokenize step, returns a part's ids when
    given its texts (checked equal); texts it was not given are tokenized then, counted in
    ``pretokenized_misses`` (the launch plan's sample is tokenized as before).
    ``"vectors"``: each part's Parquet is written with its ``id`` column only.

    Returns the counters, filled in as the job runs.
    """
    counts: dict = {}
    if "tokenize" in steps:
        from beam_jax.text import SentenceEncoder, Tokenizer

        tokenizer = SentenceEncoder.from_dir(cfg["model_dir"]).tokenizer()
        parquet, parts = _job_parts(cfg)
        given: dict = {}
        for groups in parts:
            texts = parquet.read_row_groups(groups, columns=["text"]).column("text")
            texts = texts.combine_chunks()
            given[(len(texts), texts[0].as_py(), texts[-1].as_py())] = (
                texts, tokenizer.encode_arrow(texts),
            )  # fmt: skip
        encode = Tokenizer.encode_arrow
        counts.update(tokenizer_calls=0, pretokenized_misses=0)

        def encode_given(self, texts):
            if not _in_tokenize_step():
                return encode(self, texts)  # the launch plan's sample, not a part
            counts["tokenizer_calls"] += 1
            if len(texts):
                hit = given.get((len(texts), texts[0].as_py(), texts[-1].as_py()))
                if hit is not None and hit[0].equals(texts):
                    return hit[1]
            counts["pretokenized_misses"] += 1
            return encode(self, texts)

        Tokenizer.encode_arrow = encode_given
    if "vectors" in steps:
        import types

        import pyarrow.parquet as pq

        from pipelines.embed import write

        def write_ids(table, where, **kwargs):
            pq.write_table(table.select(["id"]), where, **kwargs)

        write.pq = types.SimpleNamespace(**{**vars(pq), "write_table": write_ids})
    return counts


def _no_params():
    return {}


def _flagship(cfg: dict, flags: list[str]) -> dict:
    """``_pipeline`` with ``flags`` (the batching chosen), plus the slots the kernel ran at
    each row length, from the job's per-bucket metrics (``OUTPUT/_metrics.json``)."""
    out = _pipeline(dict(cfg, pipeline_args=cfg["pipeline_args"] + flags))
    record = json.loads((Path(cfg["out"]) / "_metrics.json").read_text())
    out["slots_by_length"] = {
        label: totals["padded_size"] for label, totals in record["buckets"].items()
    }
    return out


def _tokenize_only_rust(cfg: dict) -> dict:
    """``_tokenize_only`` with the Rust tokenizer for every text."""
    return _tokenize_only(cfg, rust=True)


def _tokenize_only(cfg: dict, rust: bool = False) -> dict:
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


def _job_parts(cfg: dict):
    """The data's Parquet file and the job's parts in it: runs of row groups up to
    ``--rows_per_part`` rows, as ``ReadArrowBatches`` reads them."""
    import pyarrow.parquet as pq

    from beam_jax._src.arrow.io import _runs
    from pipelines.embed.flags import parse_args

    args, _ = parse_args(["--runner=FnApiRunner", "--input", cfg["parquet"]] + cfg["pipeline_args"])
    parquet = pq.ParquetFile(cfg["parquet"])
    counts = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
    return parquet, list(_runs(counts, args.rows_per_part))


def _write_only(cfg: dict) -> dict:
    """What the job writes, written alone (see the module's docstring); every id is
    counted against the data's."""
    import numpy as np
    import pyarrow as pa

    from pipelines.embed import write

    schema = write.embeddings_schema(pa.int64())
    out = Path(cfg["out"])
    start, cpu_start = time.perf_counter(), time.process_time()
    parquet, parts = _job_parts(cfg)
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


def _tokenize_in_beam(cfg: dict) -> dict:
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

    with _FirstPart() as first_part:
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


def flops_per_token(length: int) -> float:
    """Executed FLOPs per token slot of all-MiniLM-L6-v2 at padded row length ``length``:
    ``SentenceEncoder.flops_per_token`` (matmuls: per layer ``8h²`` for query, key, value
    and output, ``4h·i`` for the feed-forward layer, ``4·length·h`` for attention)."""
    return float(_encoder().flops_per_token(int(length)))


@functools.cache
def _encoder():
    from beam_jax.text import SentenceEncoder

    return SentenceEncoder.from_dir(_model_dir())


def executed_flops(slots_by_length: dict) -> float:
    """FLOPs the encoder executed over batches of ``{row length: token slots}`` (padding
    and empty rows included: the slots the kernel ran)."""
    return sum(float(slots) * flops_per_token(int(L)) for L, slots in slots_by_length.items())


def st_slots_by_length(texts: list[str], lengths: list[int], batch_size: int) -> dict:
    """The slots sentence-transformers' ``encode`` runs: texts sorted by length in
    characters, longest first, batches of ``batch_size`` padded to their longest text's
    token count. Returns ``{row length: slots}``."""
    import numpy as np

    order = np.argsort([-len(t) for t in texts], kind="stable")
    tokens = np.asarray(lengths, np.int64)[order]
    slots: dict[str, int] = {}
    for lo in range(0, len(tokens), batch_size):
        chunk = tokens[lo : lo + batch_size]
        width = int(chunk.max())
        slots[str(width)] = slots.get(str(width), 0) + len(chunk) * width
    return slots


def _runinference(cfg: dict) -> dict:
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
            encoder = SentenceEncoder.from_dir(_model_dir())
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
            self.tokenizer = SentenceEncoder.from_dir(_model_dir()).tokenizer()

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


def _child(variant: str, cfg_path: str) -> None:
    cfg = json.loads(Path(cfg_path).read_text())
    harness.pin(cfg["threads"])
    if variant in HOST_ONLY:
        out = _host_only(cfg, HOST_ONLY[variant])
    elif variant in HOST_WITHOUT:
        out = _host_only(cfg, [], HOST_WITHOUT[variant])
    elif variant in FLAGSHIPS:
        out = _flagship(cfg, FLAGSHIPS[variant])
    else:
        out = {
            "runinference": _runinference,
            "tokenize_only": _tokenize_only,
            "tokenize_only_rust": _tokenize_only_rust,
            "tokenize_in_beam": _tokenize_in_beam,
            "write_only": _write_only,
        }[variant](cfg)
    print("RESULT " + json.dumps(out), flush=True)


# ---- driver ----------------------------------------------------------------------------


def _run(variant: str, data: dict, args, tmp: Path, round_: int) -> dict:
    out = tmp / f"{variant}-{round_}"
    out.mkdir()
    cfg = dict(
        data,
        threads=args.threads,
        batch_size=BATCH_SIZE,
        st_device=args.st_device,
        out=str(out),
        pipeline_args=shlex.split(args.pipeline_args),
    )
    # Each variant its own cache, fresh for this benchmark: its first round compiles
    # everything (cold), later rounds load from the cache as a rerun of the job does (warm).
    cache_dir = tmp / f"jax-cache-{variant}"
    if variant in FLAGSHIPS and "--compilation_cache_dir" in args.pipeline_args:
        given = cfg["pipeline_args"]
        cache_dir = Path(given[given.index("--compilation_cache_dir") + 1])
    elif variant in (*FLAGSHIPS, *HOST_ONLY, *HOST_WITHOUT):
        cfg["pipeline_args"] += ["--compilation_cache_dir", str(cache_dir)]
    cfg["cache_dir"] = str(cache_dir)
    cache_entries = sum(1 for _ in cache_dir.rglob("*")) if cache_dir.is_dir() else 0
    if variant in ST_VARIANTS:
        cfg["out"] = str(out / "vectors.npy")
        cfg["st_dtype"] = ST_VARIANTS[variant]
    cfg_path = tmp / f"{variant}-{round_}.json"
    cfg_path.write_text(json.dumps(cfg))
    if variant in ST_VARIANTS:
        command = [
            "taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[: args.threads])),
            args.st_python, "-c", _ST_SCRIPT, str(cfg_path),
        ]  # fmt: skip
    else:
        command = [sys.executable, __file__, "--child", variant, str(cfg_path)]
    env = _env(args.threads)
    env["PYTHONFAULTHANDLER"] = "1"  # a run stopped past --timeout prints its threads' stacks
    # Earlier runs' outputs still waiting to reach the disk slow the next run's writes
    # once the kernel flushes them (measured: the same write-only run took 0.50 s, then
    # 0.78 s and 0.99 s as ~2 GB were left unwritten). Each run starts as on an idle
    # machine, with nothing left to write (see also _drop_outputs).
    os.sync()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched, launched_epoch = time.perf_counter(), time.time()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
        top = stderr.rfind("Fatal Python error")  # the stacks, from their top
        dump = stderr[top:][:12000] if top >= 0 else stderr[-8000:]
        raise RuntimeError(
            f"{variant} (round {round_ + 1}) ran past --timeout {args.timeout:g} s and was "
            f"stopped; where its threads were:\n{dump}"
        ) from None
    process_s = time.perf_counter() - launched  # the whole process, start to exit
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{variant} failed (exit {proc.returncode}):\n{stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    result["out"] = str(out)
    result["process_s"] = process_s
    # From the process started to the first part tokenized: the launch with the imports.
    first = result.pop("first_part_epoch", None)
    result["process_launch_s"] = None if first is None else first - launched_epoch
    result["cache_entries_before"] = cache_entries
    # CPU seconds of the whole child process, start-up included: less sensitive than wall
    # time to other work on shared CPUs.
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def _drop_outputs(runs: list[dict], compared: bool) -> None:
    """Deletes what the variant's runs wrote once nothing reads it: all but the latest
    run's output if ``compared`` (the flagships' and sentence-transformers', for the
    cosine), else every run's. Five rounds of three variants at 200,000 texts would
    otherwise leave ~4.5 GB on the disk and in the page cache beside later runs."""
    for r in runs[:-1] if compared else runs:
        shutil.rmtree(r["out"], ignore_errors=True)


def _min_cosine(pipeline_out: str, st_vectors: str) -> float:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(Path(pipeline_out).glob("embeddings-*.parquet"))
    table = pa.concat_tables(pq.read_table(f, columns=["id", "embedding"]) for f in files)
    ids = table.column("id").to_numpy()
    ours = np.stack(table.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float64)
    ref = np.load(st_vectors).astype(np.float64)[ids]
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    return float(cos.min())


def _has_st(python: str) -> bool:
    if not Path(python).exists():
        return False
    probe = subprocess.run([python, "-c", "import sentence_transformers"], capture_output=True)
    return probe.returncode == 0


def _flagship_cosines(runs: dict) -> dict:
    """Each flagship variant's least cosine against sentence-transformers (last rounds)."""
    if "sentence_transformers" not in runs:
        return {}
    st = str(Path(runs["sentence_transformers"][-1]["out"]) / "vectors.npy")
    return {v: _min_cosine(runs[v][-1]["out"], st) for v in FLAGSHIPS if v in runs}


def same_precision_ratios(results: dict) -> dict:
    """The flagship over sentence-transformers at the same precision (``SAME_PRECISION``):
    ``process`` as whole processes (start to exit, imports and model load included),
    ``steady`` the flagship's job time (median round) against ``encode`` after a warm-up."""
    out = {}
    for ours, theirs in SAME_PRECISION:
        if ours in results and theirs in results:
            a, b = results[ours], results[theirs]
            out[f"{ours}_vs_{theirs}"] = {
                "precision": ST_VARIANTS[theirs],
                "process": b["process_s_median"] / a["process_s_median"],
                "steady": b["seconds_median"] / a["seconds_median"],
            }
            r = out[f"{ours}_vs_{theirs}"]
            print(
                f"same precision ({r['precision']}): {ours} {r['process']:.2f}x {theirs} as "
                f"whole processes, {r['steady']:.2f}x steady"
            )
    return out


def _side_by_side_ratios(results: dict, ratios: dict, ratios_best: dict) -> None:
    """Adds ``host_only / tokenize_only``, ``host_only / tokenize_only_rust``, each
    ``HOST_WITHOUT`` variant and ``tokenize_in_beam`` over ``tokenize_only`` (rates: how
    close the host, or a Beam job that only tokenizes, runs to its tokenizer alone),
    ``host_only / tokenize_in_beam``, ``pipeline_packed / pipeline_buckets`` and
    ``host_only_vs_tokenize_then_write`` (the host's rate over tokenizing then writing, one
    after the other) (medians and best runs)."""
    pairs = (
        ("host_only", "tokenize_only"),
        ("host_only", "tokenize_only_rust"),
        *((variant, "tokenize_only") for variant in HOST_WITHOUT),
        ("tokenize_in_beam", "tokenize_only"),
        ("host_only", "tokenize_in_beam"),
        ("pipeline_packed", "pipeline_buckets"),
    )
    for ours, theirs in pairs:
        if ours in results and theirs in results:
            name = f"{ours}_vs_{theirs}"
            a, b = results[ours], results[theirs]
            ratios[name] = b["seconds_median"] / a["seconds_median"]
            ratios_best[name] = b["seconds_best"] / a["seconds_best"]
    if {"host_only", "tokenize_only", "write_only"} <= results.keys():
        host, floors = results["host_only"], (results["tokenize_only"], results["write_only"])
        for stat, out in (("seconds_median", ratios), ("seconds_best", ratios_best)):
            out["host_only_vs_tokenize_then_write"] = sum(f[stat] for f in floors) / host[stat]


def _cpu_bounds(results: dict, cores: int) -> dict:
    """For each host-only variant and ``tokenize_in_beam``: the CPU its run used
    (``run_cpu_s``: every thread of the process, from the job's start to its summary), how
    many of ``cores`` that kept busy on average, and the shortest the run could be if its
    work kept every core busy throughout (``all_cores_s``), also as a rate over
    ``tokenize_only``'s (``vs_tokenize_only``): how near the host could come to its
    tokenizer by overlap alone, without less work."""
    bounds = {}
    for variant in TIMED_JOBS:
        r = results.get(variant)
        if r is None or "run_cpu_s_median" not in r:
            continue
        cpu = r["run_cpu_s_median"]
        bound = {
            "run_cpu_s": cpu,
            "cores_busy": cpu / r["seconds_median"],
            "all_cores_s": cpu / cores,
        }
        if "tokenize_only" in results:
            bound["vs_tokenize_only"] = (
                results["tokenize_only"]["seconds_median"] / bound["all_cores_s"]
            )
        bounds[variant] = bound
    return bounds


def _after_launch(results: dict, texts: int) -> dict:
    """For each host-only variant and ``tokenize_in_beam``: its launch (``launch_s``,
    median), the share of the run it takes, and the rate of the rest of the run (every text
    over the median run less the median launch), also over ``tokenize_only``'s rate: how
    near the host runs to its tokenizer once the job is under way, as on a long job whose
    launch is paid once."""
    after = {}
    for variant in TIMED_JOBS:
        r = results.get(variant)
        if r is None or "launch_s_median" not in r:
            continue
        launch, seconds = r["launch_s_median"], r["seconds_median"]
        entry = {
            "launch_s": launch,
            "launch_share": launch / seconds,
            "sentences_per_s": texts / (seconds - launch),
            "end_s": r.get("end_s_median"),
            # From the process started (imports included) to the first part tokenized.
            "process_launch_s": r.get("process_launch_s_median"),
        }
        if "tokenize_only" in results:
            entry["vs_tokenize_only"] = (
                entry["sentences_per_s"] / results["tokenize_only"]["sentences_per_s"]
            )
        after[variant] = entry
    return after


def _flop_fields(variant: str, r: dict, data: dict, peaks: dict) -> None:
    """Sets ``mfu`` (useful FLOPs over the median time, against the matmul peak of the
    dtype the variant's dense matmuls ran in: bf16's for ``matmuls`` bfloat16, else fp32's)
    and ``flops_per_real_token`` (executed) for a model variant; ``None`` for the others."""
    peak = peaks.get("bf16" if r.get("matmuls") == "bfloat16" else "fp32")
    model = variant in MODEL_VARIANTS
    r["mfu"] = data["flops"] / r["seconds_median"] / (peak * 1e9) if model and peak else None
    slots = data["st_slots_by_length"] if variant == "sentence_transformers" else None
    slots = r.get("slots_by_length", slots) if model else None
    r["flops_per_real_token"] = executed_flops(slots) / data["tokens"] if slots else None


def _flagship_cold_warm(cold_warm: dict, results: dict) -> None:
    """Cold against cold and warm against warm: packed against buckets, and each flagship
    variant other than ``pipeline`` against runinference and sentence-transformers."""
    pairs = [("pipeline_packed", "pipeline_buckets")]
    pairs += [
        (v, other)
        for v in FLAGSHIPS
        if v != "pipeline"
        for other in ("runinference", "sentence_transformers")
    ]
    for ours, other in pairs:
        if f"{ours}_cold_s" not in cold_warm or other not in results:
            continue
        name = f"{ours}_vs_{other}"
        for phase in ("cold", "warm"):
            theirs = cold_warm.get(f"{other}_{phase}_s", results[other]["seconds_median"])
            cold_warm[f"{name}_{phase}"] = theirs / cold_warm[f"{ours}_{phase}_s"]
        print(
            f"{name}: {cold_warm[f'{name}_cold']:.2f}x cold, {cold_warm[f'{name}_warm']:.2f}x warm"
        )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=2000, help="texts (default 2,000)")
    parser.add_argument("--quick", action="store_true", help="300 texts, one round")
    parser.add_argument("--rounds", type=int, default=3, help="turns per variant (median)")
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="CPUs every variant is pinned to (default: all this process may use)",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--st-python",
        default=sys.executable if _has_st(sys.executable) else DEFAULT_ST_PYTHON,
        help="a Python with sentence-transformers and torch (default: this one if it has "
        f"them, else {DEFAULT_ST_PYTHON})",
    )
    parser.add_argument(
        "--st-device",
        default="cpu",
        help="the torch device sentence-transformers runs on (default cpu; 'cuda' on a GPU, "
        "where the flagship runs on the accelerator JAX finds)",
    )
    parser.add_argument(
        "--pipeline-args",
        default="",
        help="extra flags for the pipeline variant, e.g. '--buckets 16,32,64,128,256'",
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--keep-outputs",
        help="write each run's output here (<variant>-<round>/) instead of a temp dir",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800,
        help="seconds per run; a run past it is stopped and its threads' stacks printed",
    )
    parser.add_argument(
        "--model_dir",
        help="a sentence-transformers model directory for every variant (the flagship's "
        "--model_dir, sentence-transformers' model); default the packaged all-MiniLM-L6-v2",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model_dir:
        os.environ["BEAM_JAX_BENCH_MODEL_DIR"] = os.path.abspath(args.model_dir)
        args.pipeline_args = f"{args.pipeline_args} --model_dir {shlex.quote(args.model_dir)}"
    if args.child:
        _child(*args.child)
        return {}
    if args.quick:
        args.texts, args.rounds = 300, 1
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}; choose from {VARIANTS}")
    wanted_st = [v for v in variants if v in ST_VARIANTS]
    if wanted_st and not _has_st(args.st_python):
        print(f"note: {args.st_python} has no sentence-transformers; skipping {wanted_st}")
        variants = [v for v in variants if v not in ST_VARIANTS]

    started = time.perf_counter()
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    cosine = None
    with tempfile.TemporaryDirectory(prefix="bench_embed_text_") as tmp:
        tmp = Path(args.keep_outputs or tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        data = _write_data(tmp, args.texts)
        print(
            f"data: {data['n']} built-in texts, {data['tokens']} tokens after truncation "
            f"(mean {data['tokens'] / data['n']:.1f}); {args.threads} threads; "
            f"{args.rounds} rounds",
            flush=True,
        )
        for round_ in range(args.rounds):
            for variant in harness.rotated(variants, round_):
                r = _run(variant, data, args, tmp, round_)
                runs[variant].append(r)
                if not args.keep_outputs:
                    _drop_outputs(runs[variant], compared=variant in COMPARED)
                print(
                    f"  round {round_ + 1} {variant}: {data['n'] / r['seconds']:.1f} "
                    f"sentences/s ({r['seconds']:.1f} s)",
                    flush=True,
                )
        if "pipeline" in runs and "sentence_transformers" in runs:
            cosine = _min_cosine(
                runs["pipeline"][-1]["out"],
                str(Path(runs["sentence_transformers"][-1]["out"]) / "vectors.npy"),
            )
        cosines = _flagship_cosines(runs)

    results = {}
    for variant, rs in runs.items():
        seconds = statistics.median(r["seconds"] for r in rs)
        results[variant] = {
            "sentences_per_s": data["n"] / seconds,
            "seconds_median": seconds,
            "seconds_all": [round(r["seconds"], 2) for r in rs],
            "seconds_best": min(r["seconds"] for r in rs),
            "spread": (max(r["seconds"] for r in rs) - min(r["seconds"] for r in rs)) / seconds,
            "cpu_s_median": statistics.median(r["cpu_s"] for r in rs),
            "cpu_s_all": [round(r["cpu_s"], 1) for r in rs],
            **{
                k: v for k, v in rs[-1].items() if k not in ("seconds", "out", "cpu_s", "run_cpu_s")
            },
        }
        if all("run_cpu_s" in r for r in rs):
            results[variant]["run_cpu_s_median"] = statistics.median(r["run_cpu_s"] for r in rs)
        results[variant]["process_s_median"] = statistics.median(r["process_s"] for r in rs)
        for key in ("launch_s", "end_s", "process_launch_s"):
            if all(r.get(key) is not None for r in rs):
                results[variant][f"{key}_all"] = [round(r[key], 3) for r in rs]
                results[variant][f"{key}_median"] = statistics.median(r[key] for r in rs)
    ratios, ratios_best = {}, {}
    if "host_only" in results and "host_only_buckets" in results:
        ours, theirs = results["host_only"], results["host_only_buckets"]
        name = "host_only_vs_host_only_buckets"
        ratios[name] = theirs["seconds_median"] / ours["seconds_median"]
        ratios_best[name] = theirs["seconds_best"] / ours["seconds_best"]
    if "pipeline" in results:
        ours = results["pipeline"]
        for other in ("sentence_transformers", "runinference"):
            if other in results:
                ratios[f"pipeline_vs_{other}"] = (
                    results[other]["seconds_median"] / ours["seconds_median"]
                )
                ratios_best[f"pipeline_vs_{other}"] = (
                    results[other]["seconds_best"] / ours["seconds_best"]
                )
    _side_by_side_ratios(results, ratios, ratios_best)
    cpu_bounds = _cpu_bounds(results, args.threads)
    after_launch = _after_launch(results, data["n"])
    from fingerprint import fingerprint, format_fingerprint

    machine = fingerprint()
    for variant, r in results.items():
        _flop_fields(variant, r, data, machine["peak_gflops"])
    print()
    print(
        f"{'variant':22} {'sentences/s':>11} {'median s':>9} {'spread':>7} {'CPU s':>7} "
        f"{'MFU %':>6} {'FLOP/tok':>8} {'compiles':>11} {'padding':>7}  runs (s)"
    )
    for variant, r in results.items():
        compiles = r.get("compiles", "-")
        if "compile_seconds" in r:
            compiles = f"{compiles} ({r['compile_seconds']:.1f}s)"
        padding = f"{r['padding_ratio']:.2f}" if "padding_ratio" in r else "-"
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}"
        executed = r.get("flops_per_real_token")
        executed = "-" if executed is None else f"{executed / 1e6:.1f}"
        print(
            f"{variant:22} {r['sentences_per_s']:11.1f} {r['seconds_median']:9.1f} "
            f"{100 * r['spread']:6.0f}% {r['cpu_s_median']:7.1f} {mfu:>6} {executed:>8} "
            f"{compiles:>11} {padding:>7}  {r['seconds_all']}"
        )
    useful = data["flops"] / data["tokens"] / 1e6
    print(
        f"FLOP/tok: executed MFLOP per real token (useful: {useful:.1f}, real tokens only, "
        "attention over each text's own length)"
    )
    print(f"medians of {args.rounds} rounds each; {format_fingerprint(machine)}")
    matmuls = {v: r["matmuls"] for v, r in results.items() if r.get("matmuls")}
    if matmuls:
        print(
            "dense matmuls (MFU against that dtype's peak): "
            + ", ".join(f"{v} {m}" for v, m in matmuls.items())
        )
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x (medians), {ratios_best[name]:.2f}x (best runs)")
    for variant, bound in cpu_bounds.items():
        print(
            f"{variant}: {bound['run_cpu_s']:.2f} CPU s during the run, {bound['cores_busy']:.2f} "
            f"of {args.threads} cores busy on average; with every core busy throughout it "
            f"would take {bound['all_cores_s']:.2f} s"
            + (
                f", {bound['vs_tokenize_only']:.2f}x tokenize_only"
                if "vs_tokenize_only" in bound
                else ""
            )
        )
    for variant, after in after_launch.items():
        print(
            f"{variant}: launch (the clock started to the first part tokenized) "
            f"{after['launch_s']:.2f} s, {100 * after['launch_share']:.0f}% of the run; "
            f"after it {after['sentences_per_s']:.0f} sentences/s"
            + (
                f", {after['vs_tokenize_only']:.2f}x tokenize_only"
                if "vs_tokenize_only" in after
                else ""
            )
            + (
                f"; from the last part tokenized to the end {after['end_s']:.2f} s"
                if after.get("end_s") is not None
                else ""
            )
            + (
                f"; from the process started to the first part tokenized "
                f"{after['process_launch_s']:.2f} s"
                if after.get("process_launch_s") is not None
                else ""
            )
        )
    for variant, rs in runs.items():
        if all("gc_full_passes" in r for r in rs):
            print(
                f"{variant}: garbage collector during the run (per round): "
                + ", ".join(
                    f"{r['gc_full_passes']} full passes {r['gc_full_s']:.3f} s, "
                    f"younger {r['gc_young_s']:.3f} s"
                    for r in rs
                )
            )
    cold_warm = {}
    for variant, i, r in ((v, i, r) for v in FLAGSHIPS for i, r in enumerate(runs.get(v, []))):
        if "compile_wait_seconds" in r:
            print(f"{variant} round {i + 1}: {r['compiles']} compiles, "
                  f"{r['compile_seconds']:.1f} s compiling, {r['compile_wait_seconds']:.2f} s of "
                  f"it on the critical path "
                  f"(waited for), {max(0.0, r['compile_seconds'] - r['compile_wait_seconds']):.1f}"
                  f" s overlapped; padding {r['padding_ratio']:.3f}")  # fmt: skip
    for variant in (*FLAGSHIPS, "runinference"):
        rs = runs.get(variant, [])
        if len(rs) < 2:
            continue
        cold = rs[0]["seconds"]
        warm = statistics.median(r["seconds"] for r in rs[1:])
        cold_warm[f"{variant}_cold_s"], cold_warm[f"{variant}_warm_s"] = cold, warm
        entries = rs[0]["cache_entries_before"]
        first = (
            "an empty compilation cache"
            if entries == 0
            else f"a compilation cache already holding {entries} files"
        )
        print(
            f"{variant}: {cold:.1f} s with {first} (round 1), {warm:.1f} s with it warm "
            f"(later rounds, median)"
        )
    if "pipeline_warm_s" in cold_warm:
        for other in ("runinference", "sentence_transformers"):
            if other not in results:
                continue
            # Cold against cold, warm against warm (sentence-transformers compiles nothing).
            cold = cold_warm.get(f"{other}_cold_s", results[other]["seconds_median"])
            warm = cold_warm.get(f"{other}_warm_s", results[other]["seconds_median"])
            cold_warm[f"pipeline_vs_{other}_cold"] = cold / cold_warm["pipeline_cold_s"]
            cold_warm[f"pipeline_vs_{other}_warm"] = warm / cold_warm["pipeline_warm_s"]
            print(
                f"pipeline_vs_{other}: {cold_warm[f'pipeline_vs_{other}_cold']:.2f}x cold, "
                f"{cold_warm[f'pipeline_vs_{other}_warm']:.2f}x warm"
            )
    _flagship_cold_warm(cold_warm, results)
    same_precision = same_precision_ratios(results)
    if cosine is not None:
        print(f"min cosine, pipeline vs sentence-transformers: {cosine:.6f}")
    for variant, value in cosines.items():
        if variant != "pipeline":
            print(f"min cosine, {variant} vs sentence-transformers: {value:.6f}")
    print(
        f"total {time.perf_counter() - started:.0f} s; load average now "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (other work on the machine)"
    )
    report = {
        "texts": data["n"],
        "tokens": data["tokens"],
        "threads": args.threads,
        "rounds": args.rounds,
        "variants": results,
        "ratios": ratios,
        "same_precision": same_precision,
        "ratios_best": ratios_best,
        "cold_warm": cold_warm,
        "cpu_bounds": cpu_bounds,
        "after_launch": after_launch,
        "pipeline_runs": runs.get("pipeline", []),
        "load_average": os.getloadavg(),
        "min_cosine_pipeline_vs_sentence_transformers": cosine,
        "min_cosine_vs_sentence_transformers": cosines,
        "fingerprint": machine,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
