"""The sentence encoder alone: beam_jax.text's kernels against sentence-transformers.

    python bench/encoder.py                               # 2,000 built-in texts, 3 rounds
    python bench/encoder.py --texts 2000 --rounds 5 --row_lengths 128,256 --rows 8,16,32
    python bench/encoder.py --parquet texts.parquet --column text --skip_torch
    python bench/encoder.py --flagship --texts 200000 --skip_torch --json limit.json
    python bench/encoder.py --flagship --busy_host 2 --texts 200000 --skip_torch

No Beam, no reading or writing: the same tokenized texts go through

* ``packed R xN``: ``SentenceEncoder.packed_fn`` under ``jax.vmap``, texts packed
  first-fit-decreasing with length classes ``R`` and the model's ``max_length`` (as
  ``Packing(pack_lengths=(R, max_length))`` packs them: texts longer than ``R`` open rows
  of ``max_length``, shorter ones fill those rows' room, then rows of ``R``), ``N`` rows
  per batch, the last batch padded with empty rows;
* ``bucketed``: ``SentenceEncoder.element_fn`` under ``jax.vmap`` at the flagship's length
  buckets (16, 24, ..., 256), ``min(64, 2048 // L)`` rows per batch (its
  ``--max_tokens_per_batch``), the last batch of a bucket padded with empty rows;
* ``flagship``: with ``--flagship``, alone: the batches the flagship (``pipelines.embed``)
  would run for these texts on this machine: its launch plan (``plan_for``: the packed row
  lengths, rows per batch and segments per row it chooses here, ``--matmuls auto``),
  texts packed as its parts pack them (``--rows_per_part`` at a time), the last batch of a
  row length in the smallest size that holds it, under ``jax.jit(jax.vmap(packed_fn))``
  with two batches in flight (the engine's default off the CPU). Compiled first, timed warm,
  no Beam, no reading or writing: the flagship's limit on this device, which
  ``bench/embed_text.py --limit_json`` sets the flagship against (``flagship_limit`` in the
  JSON; MFU against the peak of the matmuls' dtype);
* ``flagship, tokenizing`` and ``flagship, writing``: with ``--flagship --busy_host N``,
  the same batches while ``N`` threads of the same process tokenize the texts over and
  over (``Tokenizer.encode_arrow``, the job's tokenize step) or write Parquet files of
  embeddings (the job's write step): the chip's rate when the host works beside it, as it
  does in the job, against ``flagship`` alone;
* ``sentence_transformers``: ``SentenceTransformer.encode(texts, batch_size=64)`` with
  torch, in a child process of ``--st_python`` (torch is never imported here).

Each JAX shape is compiled once; compile time is its first call minus a steady call,
measured twice: in a process with an empty persistent compilation cache (a first run) and
in a second process reading that cache (a rerun). Steady-state rounds then alternate
between the JAX process and the torch process, both pinned to the same CPUs with the same
thread count, and each figure is the median over rounds. Columns: ``tokens/s`` and
``texts/s`` over real tokens; ``exec FLOP/tok``, the executed FLOPs (padding and empty
slots included, ``SentenceEncoder.flops_per_token`` at the row or bucket length) per real
token; ``MFU``, the useful FLOPs (each text at its own length) per second over the
machine's fp32 matmul peak (:mod:`peak`); ``HFU``, the executed FLOPs per second over
that peak; ``vs ST``, speed against sentence-transformers measured in the same rounds.
Every JAX result is checked against sentence-transformers' vectors (least cosine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from flagship_batches import (
    flagship_batches,
    flagship_packing,
    host_busy,
    packed_arrays,
    rows_of,
)

ROOT = Path(__file__).resolve().parent.parent
BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256)  # the flagship's fixed buckets
MAX_TOKENS = 2048  # the flagship's --max_tokens_per_batch
BATCH_SIZE = 64
# The flagship's batches beside --busy_host threads doing the job's tokenizing or writing.
BUSY = {"flagship, tokenizing": "tokenize", "flagship, writing": "write"}
DEFAULT_ST_PYTHON = next(
    (p for p in ("/tmp/refvenv/bin/python", "/tmp/stvenv/bin/python") if Path(p).exists()),
    sys.executable,
)

# Runs in the interpreter that has sentence-transformers (and torch); needs no jax.
_ST_WORKER = r"""
import json, sys, time
import numpy as np, torch
cfg = json.load(open(sys.argv[1]))
torch.set_num_threads(cfg["threads"])
torch.set_num_interop_threads(1)
from sentence_transformers import SentenceTransformer
texts = json.load(open(cfg["texts"]))
model = SentenceTransformer(cfg["model_dir"], device="cpu")
model.max_seq_length = cfg["max_length"]
model.encode(texts[:BATCH], batch_size=BATCH)  # warm-up, not timed
print("READY " + json.dumps({"torch": torch.__version__}), flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    vectors = model.encode(texts, batch_size=BATCH, convert_to_numpy=True)
    seconds = time.perf_counter() - start
    np.save(cfg["out"], vectors.astype(np.float32))
    print("RESULT " + json.dumps({"seconds": seconds}), flush=True)
""".replace("BATCH", str(BATCH_SIZE))


# ---- shapes: packed rows and length buckets, pure numpy ---------------------------------


def pack_rows(lengths: np.ndarray, row_length: int, max_length: int) -> list[tuple[int, list]]:
    """``[(row length, [text indices])]`` per row, packed as the library packs them
    (``assign_rows``, first-fit-decreasing) with length classes ``row_length`` and
    ``max_length``: texts up to ``row_length`` tokens fill the room left in rows of
    ``max_length`` (opened by the longer texts), then rows of ``row_length``."""
    from beam_jax import Packing
    from beam_jax._src.bucketing.packing import assign_rows

    widths = sorted({row_length, max_length})
    return rows_of(assign_rows(lengths, Packing(row_lengths=widths, pack_lengths=widths)))


def packed_batches(ids: list, row_length: int, rows_per_batch: int, max_length: int) -> list:
    """``[(ids[N, R], seg[N, R], pos[N, R], counts[N], seg_lengths[N, S], texts)]``."""
    lengths = np.array([len(x) for x in ids])
    rows = pack_rows(lengths, row_length, max_length)
    out = []
    for width in sorted({w for w, _ in rows}):
        mine = [members for w, members in rows if w == width]
        segments = max(len(m) for m in mine)
        segments = -(-segments // 4) * 4  # a few fixed counts: fewer shapes to compile
        for start in range(0, len(mine), rows_per_batch):
            chunk = mine[start : start + rows_per_batch]
            out.append(packed_arrays(ids, chunk, rows_per_batch, width, segments))
    return out


def bucket_batches(ids: list) -> list:
    """``[(ids[N, L], lengths[N], texts)]`` at the flagship's buckets, sorted by length."""
    out = []
    by_bucket: dict[int, list[int]] = {}
    for i, x in enumerate(ids):
        by_bucket.setdefault(next(b for b in BUCKETS if b >= len(x)), []).append(i)
    for width, members in sorted(by_bucket.items()):
        rows = max(1, min(BATCH_SIZE, MAX_TOKENS // width))
        for start in range(0, len(members), rows):
            chunk = members[start : start + rows]
            tok = np.zeros((rows, width), np.int32)
            lengths = np.zeros(rows, np.int32)
            for r, i in enumerate(chunk):
                tok[r, : len(ids[i])] = ids[i]
                lengths[r] = len(ids[i])
            out.append((tok, lengths, chunk))
    return out


def st_executed_tokens(lengths: np.ndarray) -> list[tuple[int, int]]:
    """sentence-transformers' batches: ``[(rows, padded length)]`` (it sorts by length, then
    pads each batch of 64 to its longest text)."""
    order = np.sort(lengths)[::-1]
    return [
        (len(order[s : s + BATCH_SIZE]), int(order[s])) for s in range(0, len(order), BATCH_SIZE)
    ]


# ---- the JAX worker ------------------------------------------------------------------------


class JaxVariants:
    """Every JAX variant's batches, kernels and vectors, in one process."""

    def __init__(self, ids: list, row_lengths, rows_list, encoder, flagship=None, busy=(0, None)):
        import jax

        from beam_jax._src.core.packed_batch import SegmentInfo

        self.encoder = encoder
        self.params = jax.device_put(encoder.load_params())
        self.n = len(ids)
        self.in_flight = 1
        self.variants: dict[str, tuple] = {}
        self.busy_threads, self.busy_texts = busy  # for BUSY: threads, and the texts
        packed = jax.jit(jax.vmap(encoder.packed_fn, in_axes=(None, 0, 0)))
        if flagship is not None:  # the flagship's batches alone, two in flight
            self.in_flight = 2
            calls = [
                ({"input_ids": tok}, SegmentInfo(seg, pos, counts, seg_lengths), texts)
                for tok, seg, pos, counts, seg_lengths, texts in flagship_batches(ids, flagship)
            ]
            self.variants["flagship"] = ("packed", packed, calls)
            for name in BUSY if self.busy_threads else ():
                self.variants[name] = ("packed", packed, calls)
            return
        for r in row_lengths:
            for rows in rows_list:
                batches = packed_batches(ids, r, rows, encoder.max_length)
                calls = [
                    (
                        {"input_ids": tok},
                        SegmentInfo(seg, pos, counts, seg_lengths),
                        texts,
                    )
                    for tok, seg, pos, counts, seg_lengths, texts in batches
                ]
                self.variants[f"packed {r} x{rows}"] = ("packed", packed, calls)
        bucketed = jax.jit(jax.vmap(encoder.element_fn, in_axes=(None, 0, 0)))
        calls = [
            ({"input_ids": tok}, {"L": lengths}, chunk)
            for tok, lengths, chunk in bucket_batches(ids)
        ]
        self.variants["bucketed"] = ("bucketed", bucketed, calls)

    def executed_slots(self, name: str) -> list[tuple[int, int]]:
        """``[(slots, row length)]`` per batch."""
        _, _, calls = self.variants[name]
        return [(int(np.prod(e["input_ids"].shape)), e["input_ids"].shape[1]) for e, _, _ in calls]

    def compile_all(self) -> dict[str, dict]:
        """Per variant: shapes, and the seconds its first calls took beyond a steady call."""
        out = {}
        for name, (_, fn, calls) in self.variants.items():
            if name in BUSY:  # the flagship's own program and shapes, compiled with it
                continue
            seen: dict[tuple, float] = {}
            for element, second, _ in calls:
                shape = (
                    element["input_ids"].shape,
                    np.shape(second[-1]) if name != "bucketed" else (),
                )
                if shape in seen:
                    continue
                start = time.perf_counter()
                fn(self.params, element, second).block_until_ready()
                first = time.perf_counter() - start
                start = time.perf_counter()
                fn(self.params, element, second).block_until_ready()
                seen[shape] = first - (time.perf_counter() - start)
            out[name] = {"shapes": len(seen), "compile_s": sum(seen.values())}
        return out

    def run(self, name: str) -> tuple[float, np.ndarray]:
        threads = self.busy_threads if name in BUSY else 0
        with host_busy(BUSY.get(name), self.encoder.tokenizer(), self.busy_texts, threads):
            return self._run(name)

    def _run(self, name: str) -> tuple[float, np.ndarray]:
        kind, fn, calls = self.variants[name]
        vectors = np.zeros((self.n, self.encoder.dim), np.float32)
        start = time.perf_counter()
        if self.in_flight == 1:  # every call queued, then every result fetched
            results = [fn(self.params, element, second) for element, second, _ in calls]
            results = [np.asarray(r) for r in results]
        else:  # the engine's way: the next batch dispatched before the last is fetched
            results, pending = [], []
            for element, second, _ in calls:
                pending.append(fn(self.params, element, second))
                if len(pending) == self.in_flight:
                    results.append(np.asarray(pending.pop(0)))
            results += [np.asarray(r) for r in pending]
        seconds = time.perf_counter() - start
        for (_, _, texts), got in zip(calls, results, strict=True):
            if kind == "bucketed":
                vectors[texts] = got[: len(texts)]
            else:
                for r, members in enumerate(texts):
                    vectors[members] = got[r, : len(members)]
        return seconds, vectors


def _jax_worker(cfg: dict) -> None:
    """Compiles every shape, reports, then runs one round per line read on stdin."""
    import jax

    from beam_jax.text import SentenceEncoder

    jax.config.update("jax_compilation_cache_dir", cfg["cache"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    flagship = cfg.get("flagship")
    matmuls = flagship["matmuls"] if flagship else "float32"
    encoder = SentenceEncoder.from_dir(cfg["model_dir"], matmuls=matmuls)
    ids = [np.asarray(x, np.int32) for x in json.load(open(cfg["ids"]))]
    threads = cfg.get("busy_host", 0)
    busy = (threads, json.loads(Path(cfg["texts"]).read_text()) if threads else None)
    jv = JaxVariants(ids, cfg["row_lengths"], cfg["rows"], encoder, flagship, busy)
    compiled = jv.compile_all()
    slots = {name: jv.executed_slots(name) for name in jv.variants}
    print("READY " + json.dumps({"compile": compiled, "slots": slots}), flush=True)
    for _ in sys.stdin:
        seconds = {}
        for name in jv.variants:
            seconds[name], vectors = jv.run(name)
            np.save(Path(cfg["out"]) / f"{name.replace(' ', '_')}.npy", vectors)
        print("RESULT " + json.dumps({"seconds": seconds}), flush=True)


# ---- the driver ----------------------------------------------------------------------------


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        env[name] = str(threads)
    env.setdefault("JAX_PLATFORMS", "cpu")
    # XLA's CPU client sizes its thread pool from the affinity mask set below.
    return env


class _Child:
    """A worker process speaking ``READY``/``RESULT`` lines."""

    def __init__(self, argv: list[str], threads: int, cpus: list[int]):
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(threads),
            preexec_fn=lambda: os.sched_setaffinity(0, cpus),
        )
        self.ready = self._read("READY")

    def _read(self, tag: str) -> dict:
        for line in self.proc.stdout:
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1 :])
        raise RuntimeError(f"worker {self.proc.args[:3]} exited ({self.proc.wait()}) before {tag}")

    def round(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._read("RESULT")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def _texts(args) -> list[str]:
    if args.parquet:
        import pyarrow.parquet as pq

        texts = pq.read_table(args.parquet, columns=[args.column]).column(0).to_pylist()
    else:
        from beam_jax.text import builtin_corpus

        texts = [t for _, t in builtin_corpus()]
    return [texts[i % len(texts)] for i in range(args.texts)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=2000, help="texts (cycled if fewer)")
    parser.add_argument("--parquet", help="read texts from this Parquet file (default: built-in)")
    parser.add_argument("--column", default="text", help="the Parquet file's text column")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds")
    parser.add_argument("--row_lengths", default="128,256", help="packed row lengths")
    parser.add_argument("--rows", default="8,16", help="packed rows per batch")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--st_python", default=DEFAULT_ST_PYTHON, help="Python with torch")
    parser.add_argument("--skip_torch", action="store_true", help="JAX variants only")
    parser.add_argument(
        "--flagship",
        action="store_true",
        help="the flagship's own packed batches alone, warm: its limit on this device",
    )
    parser.add_argument(
        "--busy_host",
        type=int,
        default=0,
        help="with --flagship: also its batches while this many threads tokenize beside them",
    )
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    if args.busy_host and not args.flagship:
        parser.error(f"--busy_host needs --flagship (got --busy_host {args.busy_host} alone)")

    sys.path.insert(0, str(ROOT / "bench"))
    from fingerprint import fingerprint, format_fingerprint

    from beam_jax.text import SentenceEncoder

    cpus = sorted(os.sched_getaffinity(0))[: args.threads]
    encoder = SentenceEncoder.from_dir()
    texts = _texts(args)
    ids = encoder.tokenizer().encode_batch(texts)
    lengths = np.array([len(x) for x in ids])
    useful = float(sum(encoder.flops_per_token(int(n)) * int(n) for n in lengths))
    tokens = int(lengths.sum())

    work = Path(tempfile.mkdtemp(prefix="bench_encoder_"))
    (work / "texts.json").write_text(json.dumps(texts))
    (work / "ids.json").write_text(json.dumps([x.tolist() for x in ids]))
    cfg = {
        "model_dir": str(encoder.model_dir()),
        "ids": str(work / "ids.json"),
        "texts": str(work / "texts.json"),
        "cache": str(work / "xla_cache"),
        "out": str(work),
        "row_lengths": [int(x) for x in args.row_lengths.split(",") if x],
        "rows": [int(x) for x in args.rows.split(",") if x],
        "threads": args.threads,
        "max_length": encoder.max_length,
        "flagship": flagship_packing(texts) if args.flagship else None,
        "busy_host": args.busy_host,
    }
    (work / "cfg.json").write_text(json.dumps(cfg))
    jax_argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_jax_worker",
        str(work / "cfg.json"),
    ]

    # A first run: the persistent cache is empty. A rerun: a new process reads it. (The
    # flagship's limit is a warm rate: its compiles, once, are not what it measures.)
    cold = None
    if not args.flagship:
        cold = _Child(jax_argv, args.threads, cpus)
        cold.close()
    jax_child = _Child(jax_argv, args.threads, cpus)
    st_child = None
    if not args.skip_torch:
        (work / "st.py").write_text(_ST_WORKER)
        st_cfg = {**cfg, "out": str(work / "st.npy")}
        (work / "st_cfg.json").write_text(json.dumps(st_cfg))
        st_child = _Child(
            [args.st_python, str(work / "st.py"), str(work / "st_cfg.json")], args.threads, cpus
        )

    import harness

    # Rounds rotate between the two processes (harness.run_rounds): neither always first.
    children = {"jax": jax_child, **({"sentence_transformers": st_child} if st_child else {})}
    runs, _ = harness.run_rounds(list(children), args.rounds, lambda c, _r: children[c].round())
    seconds: dict[str, list[float]] = {}
    for r in runs["jax"]:
        for name, s in r["seconds"].items():
            seconds.setdefault(name, []).append(s)
    if st_child is not None:
        seconds["sentence_transformers"] = [r["seconds"] for r in runs["sentence_transformers"]]
    jax_child.close()
    if st_child is not None:
        st_child.close()

    info = fingerprint()
    dtype = "bf16" if (cfg["flagship"] or {}).get("matmuls") == "bfloat16" else "fp32"
    peak = info["peak_gflops"][dtype] * 1e9
    slots = dict(jax_child.ready["slots"])
    if st_child is not None:
        slots["sentence_transformers"] = [(r * n, n) for r, n in st_executed_tokens(lengths)]
    reference = np.load(work / "st.npy") if st_child is not None else None
    st_median = harness.median(seconds["sentence_transformers"]) if st_child else None
    rows = {}
    for name, ts in seconds.items():
        median = harness.median(ts)
        executed = float(sum(s * encoder.flops_per_token(n) for s, n in slots[name]))
        row = {
            "seconds": median,
            "tokens_per_s": tokens / median,
            "texts_per_s": len(texts) / median,
            "executed_flops_per_token": executed / tokens,
            "mfu": useful / median / peak,
            "hfu": executed / median / peak,
            "vs_st": st_median / median if st_median else None,
            "rounds": ts,
        }
        if name in jax_child.ready["compile"]:
            row["shapes"] = jax_child.ready["compile"][name]["shapes"]
            row["compile_first_s"] = cold.ready["compile"][name]["compile_s"] if cold else None
            row["compile_cached_s"] = jax_child.ready["compile"][name]["compile_s"]
            if reference is not None:
                got = np.load(work / f"{name.replace(' ', '_')}.npy")
                row["min_cosine_vs_st"] = float(np.min(np.sum(got * reference, axis=1)))
        rows[name] = row

    print(
        f"{len(texts)} texts, {tokens} tokens (mean {lengths.mean():.1f}, max {lengths.max()}), "
        f"{args.threads} threads on CPUs {cpus}, {args.rounds} alternating rounds"
    )
    print(
        f"{'variant':22} {'tokens/s':>9} {'texts/s':>8} {'exec FLOP/tok':>13} {'MFU':>6} "
        f"{'HFU':>6} {'vs ST':>6} {'shapes':>6} {'compile':>8} {'cached':>7} {'cos vs ST':>10}"
    )
    for name, r in rows.items():
        vs = f"{r['vs_st']:.2f}x" if r["vs_st"] else "-"
        first = f"{r['compile_first_s']:7.1f}s" if r.get("compile_first_s") is not None else "-"
        comp = (
            f"{r['shapes']:>6} {first:>8} {r['compile_cached_s']:6.1f}s"
            if "shapes" in r
            else f"{'-':>6} {'-':>8} {'-':>7}"
        )
        cos = f"{r['min_cosine_vs_st']:.6f}" if "min_cosine_vs_st" in r else "-"
        print(
            f"{name:22} {r['tokens_per_s']:9.0f} {r['texts_per_s']:8.0f} "
            f"{r['executed_flops_per_token'] / 1e6:11.1f} M {r['mfu']:6.1%} {r['hfu']:6.1%} "
            f"{vs:>6} {comp} {cos:>10}"
        )
    print(format_fingerprint(info))
    result = {"rows": rows, "fingerprint": info, "tokens": tokens, "texts": len(texts)}
    if args.flagship:
        f, r = cfg["flagship"], rows["flagship"]
        widths = ", ".join(f"{w}: {'/'.join(map(str, f['rows_per_batch'][str(w)]))}"
                           for w in f["row_lengths"])  # fmt: skip
        print(
            f"flagship limit: {r['texts_per_s']:,.0f} texts/s, MFU {r['mfu']:.1%} against the "
            f"{dtype} peak; its packed batches (rows per batch by row length {widths}; "
            f"{f['max_segments']} texts a row at most; {f['matmuls']} matmuls), warm, two in flight"
        )
        result["flagship_limit"] = {**r, "texts": len(texts), "plan": f, "peak_dtype": dtype}
        for name in (b for b in BUSY if b in rows):
            busy = rows[name]["texts_per_s"] / r["texts_per_s"]
            print(f"{name} ({args.busy_host} threads beside): {busy:.2f}x its batches alone")
            result[f"{BUSY[name]}_beside_vs_alone"] = busy
    harness.write_json(args.json, result)
    return result


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_jax_worker":
        _jax_worker(json.loads(Path(sys.argv[2]).read_text()))
    else:
        main()
