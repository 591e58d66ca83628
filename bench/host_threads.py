"""Can the host's steps run beside Python? Each step alone, then beside a Python-busy thread.

    python bench/host_threads.py                 # 50,000 built-in texts, 3 rounds
    python bench/host_threads.py --texts 200000 --json out.json

The flagship hands its heavy steps to background threads (``beam_jax.WorkAhead``) so that
they overlap the bundle's Python (packing rows, dispatching batches). That overlap exists
only for work done without the GIL. This benchmark runs each step in a thread of its own,
first alone and then while another thread runs pure Python (as the bundle's thread does),
and prints the wall time, the step thread's own CPU time and the slowdown (wall beside
Python over wall alone; 1.0: the step does not need the GIL). The steps:

* ``tokenize_numpy``: ``Tokenizer.encode_arrow`` on batches of 1,024 texts (the
  flagship's tokenizer: printable-ASCII texts tokenized with numpy).
* ``tokenize_rust``: the same batches through the Rust tokenizer (``encode_batch_fast``).
* ``write_filesystems``: parts of 8,192 x 384 float32 embeddings written as Parquet
  through ``beam_jax.jobs.open_atomically`` (Beam's ``FileSystems``, a Python file object),
  as the flagship writes them.
* ``write_native``: the same parts written by pyarrow to a local path.

Beside Python, each step is timed with CPython's default GIL switch interval (5 ms) and
with 0.5 ms. Rounds alternate the settings; medians are printed with the machine's
fingerprint.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

BATCH = 1024  # texts per tokenizer call (the benchmark's row groups)
PART, DIM = 8192, 384  # rows and floats per written part
SETTINGS = (("alone", None), ("beside Python, 5 ms", 0.005), ("beside Python, 0.5 ms", 0.0005))


class _PythonBusy:
    """A thread that runs pure Python (holding the GIL whenever it runs) until stopped."""

    def __enter__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, name="python-busy", daemon=True)
        self._thread.start()
        return self

    def _spin(self):
        n = 0
        while not self._stop.is_set():
            for _ in range(1000):
                n += 1

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _timed_in_thread(step) -> tuple[float, float]:
    """Runs ``step`` in a thread of its own: (wall seconds, that thread's CPU seconds)."""
    out = {}

    def run():
        wall, cpu = time.perf_counter(), time.thread_time()
        step()
        out["t"] = (time.perf_counter() - wall, time.thread_time() - cpu)

    thread = threading.Thread(target=run, name="step")
    thread.start()
    thread.join()
    return out["t"]


def _steps(texts: int, tmp: Path) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_jax.jobs import open_atomically
    from beam_jax.text import SentenceEncoder, builtin_corpus

    corpus = [t for _, t in builtin_corpus()]
    column = pa.array([corpus[i % len(corpus)] for i in range(texts)], pa.string())
    batches = [column.slice(i, BATCH) for i in range(0, texts, BATCH)]
    tokenizer = SentenceEncoder.from_dir().tokenizer()
    parts = max(1, texts // PART)
    vectors = np.random.default_rng(0).random((PART, DIM), np.float32)
    offsets = pa.array(np.arange(0, (PART + 1) * DIM, DIM, dtype=np.int32))
    table = pa.table({
        "id": pa.array(np.arange(PART)),
        "embedding": pa.ListArray.from_arrays(offsets, pa.array(vectors.reshape(-1))),
    })  # fmt: skip
    options = {"use_dictionary": ["id"], "compression": "none", "write_statistics": ["id"]}

    def tokenize(encode):
        def step():
            for batch in batches:
                encode(batch)

        return step

    def write_filesystems():
        for i in range(parts):
            with open_atomically(str(tmp / f"fs-{i}.parquet")) as f:
                pq.write_table(table, f, **options)

    def write_native():
        for i in range(parts):
            pq.write_table(table, str(tmp / f"native-{i}.parquet"), **options)

    return {
        "tokenize_numpy": (tokenize(tokenizer.encode_arrow), texts),
        "tokenize_rust": (tokenize(tokenizer._encode_arrow_rust), texts),
        "write_filesystems": (write_filesystems, parts * PART),
        "write_native": (write_native, parts * PART),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=50_000, help="texts (default 50,000)")
    parser.add_argument("--rounds", type=int, default=3, help="turns per setting (median)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.texts < 1 or args.rounds < 1:
        parser.error(f"--texts and --rounds must be >= 1, got {args.texts} and {args.rounds}")

    from fingerprint import fingerprint, format_fingerprint

    before = sys.getswitchinterval()
    runs: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_host_threads_") as tmp:
        steps = _steps(args.texts, Path(tmp))
        for name, (step, _) in steps.items():
            step()  # warm: caches, allocator, first files
            for round_ in range(args.rounds):
                order = SETTINGS[round_ % 3 :] + SETTINGS[: round_ % 3]
                for setting, interval in order:
                    if interval is None:
                        timed = _timed_in_thread(step)
                    else:
                        sys.setswitchinterval(interval)
                        try:
                            with _PythonBusy():
                                timed = _timed_in_thread(step)
                        finally:
                            sys.setswitchinterval(before)
                    runs.setdefault(name, {}).setdefault(setting, []).append(timed)
    results = {}
    for name, by_setting in runs.items():
        alone = statistics.median(w for w, _ in by_setting["alone"])
        results[name] = {
            "items": steps[name][1],
            **{
                setting: {
                    "wall_s": statistics.median(w for w, _ in timed),
                    "thread_cpu_s": statistics.median(c for _, c in timed),
                    "slowdown": statistics.median(w for w, _ in timed) / alone,
                }
                for setting, timed in by_setting.items()
            },
        }
    machine = fingerprint()
    print(f"{'step':18} {'items':>7}  " + "  ".join(f"{s:>30}" for s, _ in SETTINGS))
    for name, r in results.items():
        cells = [
            f"{r[s]['wall_s']:6.2f} s ({r[s]['thread_cpu_s']:5.2f} CPU) {r[s]['slowdown']:5.2f}x"
            for s, _ in SETTINGS
        ]
        print(f"{name:18} {r['items']:7d}  " + "  ".join(f"{c:>30}" for c in cells))
    print(
        "wall s (the step thread's CPU s) and slowdown against alone; medians of "
        f"{args.rounds} rounds; {format_fingerprint(machine)}"
    )
    report = {"texts": args.texts, "rounds": args.rounds, "steps": results, "fingerprint": machine}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
