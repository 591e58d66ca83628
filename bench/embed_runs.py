"""How bench/embed_text.py runs its variants: the data they all read, each run in a fresh
process pinned to the benchmark's CPUs and timed from outside (wall, the whole process, its
CPU), stopped past ``--timeout`` with its threads' stacks, and its output dropped once
nothing reads it."""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import embed_report
import harness
from embed_host import model_dir
from embed_variants import BATCH_SIZE, FLAGSHIPS, HOST_ONLY, HOST_WITHOUT, ST_SCRIPT, ST_VARIANTS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# The children run the benchmark's own command line (``--child VARIANT CONFIG``).
MAIN = HERE / "embed_text.py"


def _env(threads: int) -> dict[str, str]:
    """This environment with the repository importable and ``threads`` for every pool."""
    env = harness.child_env(str(ROOT))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        env[name] = str(threads)
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def write_builtin_texts(path: Path, n: int) -> list[str]:
    """The first ``n`` built-in texts (cycled if more), written to ``path`` as Parquet
    (``id``, ``text``; row groups of 1,024); returns them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_jax.text import builtin_corpus

    texts = [t for _, t in builtin_corpus()]
    texts = [texts[i % len(texts)] for i in range(n)]
    table = pa.table({"id": pa.array(range(n), pa.int64()), "text": pa.array(texts)})
    pq.write_table(table, path, row_group_size=1024)
    return texts


def write_data(workdir: Path, n: int) -> dict:
    """The first ``n`` built-in texts (cycled if more) as Parquet and as a JSON list."""
    from beam_jax.text import SentenceEncoder, packaged_model_dir

    texts = write_builtin_texts(workdir / "texts.parquet", n)
    (workdir / "texts.json").write_text(json.dumps(texts))
    lengths = [
        len(ids) for ids in SentenceEncoder.from_dir(model_dir()).tokenizer().encode_batch(texts)
    ]
    tokens = sum(lengths)
    return {
        "flops": embed_report.model_flops(lengths),
        "st_slots_by_length": embed_report.st_slots_by_length(texts, lengths, BATCH_SIZE),
        "parquet": str(workdir / "texts.parquet"),
        "texts": str(workdir / "texts.json"),
        "model_dir": str(model_dir() or packaged_model_dir()),
        "n": n,
        "tokens": tokens,
    }


def run(variant: str, data: dict, args, tmp: Path, round_: int) -> dict:
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
            args.st_python, "-c", ST_SCRIPT, str(cfg_path),
        ]  # fmt: skip
    else:
        command = [sys.executable, str(MAIN), "--child", variant, str(cfg_path)]
    env = _env(args.threads)
    env["PYTHONFAULTHANDLER"] = "1"  # a run stopped past --timeout prints its threads' stacks
    # Earlier runs' outputs still waiting to reach the disk slow the next run's writes
    # once the kernel flushes them (measured: the same write-only run took 0.50 s, then
    # 0.78 s and 0.99 s as ~2 GB were left unwritten). Each run starts as on an idle
    # machine, with nothing left to write (see also drop_outputs).
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
    lines = [ln for ln in stdout.splitlines() if ln.startswith(harness.RESULT)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{variant} failed (exit {proc.returncode}):\n{stderr[-4000:]}")
    result = json.loads(lines[-1][len(harness.RESULT) :])
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


def drop_outputs(runs: list[dict], compared: bool) -> None:
    """Deletes what the variant's runs wrote once nothing reads it: all but the latest
    run's output if ``compared`` (the flagships' and sentence-transformers', for the
    cosine), else every run's. Five rounds of three variants at 200,000 texts would
    otherwise leave ~4.5 GB on the disk and in the page cache beside later runs."""
    for r in runs[:-1] if compared else runs:
        shutil.rmtree(r["out"], ignore_errors=True)


def has_st(python: str) -> bool:
    if not Path(python).exists():
        return False
    probe = subprocess.run([python, "-c", "import sentence_transformers"], capture_output=True)
    return probe.returncode == 0
