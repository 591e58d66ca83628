"""How long a process takes to open its devices, and to move arrays to them, by the size
of the host buffer a TPU maps as it opens.

    python bench/tpu_open.py                       # libtpu's 4 GiB, beam_jax's 256 MiB, 64 MiB
    python bench/tpu_open.py --buffers libtpu,1GiB,256MiB,64MiB,16MiB --rounds 2

As a TPU opens, its runtime (libtpu) maps a host buffer for the transfers to and from the
chip, 4 GiB unless ``TPU_PREMAPPED_BUFFER_SIZE`` says otherwise, and unmaps it at exit;
without transparent hugepages that mapping is most of the opening. A transfer larger than
the buffer runs outside it, slower. beam_jax sizes the buffer before it opens devices
(``beam_jax.jobs.size_tpu_host_buffer``, 256 MiB unless the environment sets it); this
measures what each size costs and saves.

Each round runs, for each buffer size (the order rotated between rounds), a fresh process
with ``TPU_PREMAPPED_BUFFER_SIZE`` and ``TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES`` set
to it (``libtpu``: neither set) that imports JAX, opens its devices (``jax.devices()``),
runs one small program, then moves a float32 array of each ``--transfer_mb`` size to the
first device and back (the median of three after one untimed); the parent times the whole
process, its exit included. Elsewhere than on a TPU the variables change nothing: the rows
show that platform's own opening. The machine's fingerprint and matmul peak are printed
after the runs (only one process may hold a TPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import harness  # noqa: E402

SIZE = "TPU_PREMAPPED_BUFFER_SIZE"
THRESHOLD = "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"
_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_buffer(text: str) -> int | None:
    """``"256MiB"`` -> 268435456, ``"1048576"`` -> 1048576, ``"libtpu"`` -> ``None`` (unset).

    Raises:
        ValueError: not ``libtpu`` nor a whole number of B, KiB, MiB or GiB of at least 1 MiB.
    """
    if text.strip().lower() == "libtpu":
        return None
    match = re.fullmatch(r"\s*(\d+)\s*([kmg]?i?b)?\s*", text.lower())
    unit = match and _UNITS.get(match.group(2) or "")
    if not unit or int(match.group(1)) * unit < 2**20:
        raise ValueError(
            f"a buffer size is 'libtpu' (its default) or bytes of at least 1 MiB, such as "
            f"'256MiB', '1GiB' or '1048576'; got {text!r}"
        )
    return int(match.group(1)) * unit


def _child(transfer_mb: list[int]) -> None:
    """One process: import JAX, open its devices, one small program, the transfers."""
    import numpy as np

    t0 = time.perf_counter()
    import jax

    imported = time.perf_counter()
    device = jax.devices()[0]
    opened = time.perf_counter()
    jax.numpy.ones(3).block_until_ready()
    first = time.perf_counter()
    moves = {}
    for mb in transfer_mb:
        host = np.ones(mb * 2**18, np.float32)
        jax.device_put(host, device).block_until_ready()
        put, get = [], []
        for _ in range(3):
            start = time.perf_counter()
            x = jax.device_put(host, device)
            x.block_until_ready()
            put.append(time.perf_counter() - start)
            start = time.perf_counter()
            np.asarray(x)
            get.append(time.perf_counter() - start)
            del x
        gb = mb / 1024
        moves[str(mb)] = [gb / statistics.median(put), gb / statistics.median(get)]
    harness.emit(
        {
            "platform": device.platform,
            "buffer_env": os.environ.get(SIZE),
            "import_s": imported - t0,
            "open_s": opened - imported,
            "first_program_s": first - opened,
            "gb_s": moves,
        }
    )


def _label(nbytes: int | None) -> str:
    if nbytes is None:
        return "libtpu"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buffers", default="libtpu,256MiB,64MiB", help="sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the order rotated")
    parser.add_argument("--transfer_mb", default="1,32,128,512", help="array sizes moved (MB)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per process")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    try:
        buffers = {_label(b): b for b in map(parse_buffer, args.buffers.split(","))}
        transfer_mb = [int(mb) for mb in args.transfer_mb.split(",") if mb.strip()]
    except ValueError as e:
        parser.error(str(e))
    if args.rounds < 1 or any(mb < 1 for mb in transfer_mb):
        parser.error(f"--rounds and --transfer_mb must be >= 1, got {args.rounds}, {transfer_mb}")
    runs: dict[str, list[dict]] = {label: [] for label in buffers}
    for r in range(args.rounds):
        for label in harness.rotated(list(buffers), r):
            env = harness.child_env(str(ROOT))
            for name in (SIZE, THRESHOLD):
                env.pop(name, None)
                if buffers[label] is not None:
                    env[name] = str(buffers[label])
            argv_child = [sys.executable, __file__, "--child", json.dumps(transfer_mb)]
            start = time.perf_counter()
            out = harness.run_child(argv_child, timeout=args.timeout, env=env, what=label)
            out["process_s"] = time.perf_counter() - start
            runs[label].append(out)
    from fingerprint import fingerprint, format_fingerprint

    info = fingerprint()
    print(format_fingerprint(info))
    cols = "".join(f" | {mb} MB put / get GB/s" for mb in transfer_mb)
    print(f"| buffer | opening (s) | whole process (s){cols} |")
    print("|---|---|---|" + "---|" * len(transfer_mb))
    for label, done in runs.items():
        opens = ", ".join(f"{d['open_s']:.2f}" for d in done)
        procs = ", ".join(f"{d['process_s']:.2f}" for d in done)
        moves = "".join(
            " | {:.2f} / {:.2f}".format(
                *(statistics.median(d["gb_s"][str(mb)][i] for d in done) for i in (0, 1))
            )
            for mb in transfer_mb
        )
        print(f"| {label} | {opens} | {procs}{moves} |")
    report = {"buffers": {k: v for k, v in buffers.items()}, "runs": runs, "fingerprint": info}
    harness.write_json(args.json, report)
    return report


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]))
    else:
        main()
