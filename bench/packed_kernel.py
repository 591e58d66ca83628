"""The packed MiniLM kernel alone on this machine's device: compute, transfers, batches in flight.

    python bench/packed_kernel.py                          # the shapes the flagship runs
    python bench/packed_kernel.py --shapes 512x64x2,128x256x8 --calls 20 --matmuls bfloat16

For each ``ROWSxTOKENSxTEXTS`` shape (rows per batch, tokens per row, texts per row, each
text filling its share of the row), the packed kernel of all-MiniLM-L6-v2's shapes (random
weights: the arithmetic is the model's) runs ``--calls`` times:

* ``compute``: inputs already on the device, calls queued back to back: the kernel's rate;
* ``one in flight``: numpy inputs, each call's outputs fetched before the next starts;
* ``two in flight``: the next call started before the last one's outputs are fetched (the
  engine's default off the CPU);

with the time to send a batch's inputs and to fetch its outputs alone. Rates are executed
FLOPs (``SentenceEncoder.flops_per_token`` per slot) per second; the matmul peak of
``bench/peak.py`` is the yardstick.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from make_random_minilm import write_random_minilm  # noqa: E402

from beam_jax._src.text.packed import embed_packed  # noqa: E402
from beam_jax.text import SentenceEncoder  # noqa: E402

SHAPES = "512x64x2,2048x64x2,128x256x8,512x256x8"


def packed_batch(rows: int, length: int, texts: int, seed: int = 0):
    """``(input_ids, segment_ids, positions)``: each row holds ``texts`` texts of equal length."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (rows, length)).astype(np.int32)
    each = length // texts
    segment = np.repeat(np.arange(1, texts + 1, dtype=np.int32), each)
    position = np.tile(np.arange(each, dtype=np.int32), texts)
    pad = length - len(segment)
    segment = np.concatenate([segment, np.zeros(pad, np.int32)])
    position = np.concatenate([position, np.zeros(pad, np.int32)])
    return ids, np.tile(segment, (rows, 1)), np.tile(position, (rows, 1))


def _timed(run, calls: int) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) / calls


def measure(encoder, params, rows: int, length: int, texts: int, calls: int) -> dict:
    config = encoder.config
    fn = jax.jit(
        jax.vmap(
            lambda p, i, s, q: embed_packed(p, i, s, q, texts, config), in_axes=(None, 0, 0, 0)
        )
    )
    host = packed_batch(rows, length, texts)
    device = [jax.device_put(x) for x in host]
    out = fn(params, *device)
    out.block_until_ready()

    def compute():
        results = [fn(params, *device) for _ in range(calls)]
        results[-1].block_until_ready()

    def one_in_flight():
        for _ in range(calls):
            jax.device_get(fn(params, *host))

    def two_in_flight():
        pending = fn(params, *host)
        for _ in range(calls - 1):
            following = fn(params, *host)
            jax.device_get(pending)
            pending = following
        jax.device_get(pending)

    flops = encoder.flops_per_token(length) * rows * length
    times = {
        "compute": _timed(compute, calls),
        "one_in_flight": _timed(one_in_flight, calls),
        "two_in_flight": _timed(two_in_flight, calls),
        "send": _timed(lambda: [jax.device_put(x) for x in host][-1].block_until_ready(), 1),
        "fetch": _timed(lambda: jax.device_get(out), 1),
    }
    return {
        "shape": f"{rows}x{length}x{texts}",
        "out_mb": out.size * out.dtype.itemsize / 1e6,
        **{f"{k}_ms": v * 1e3 for k, v in times.items()},
        **{f"{k}_tflops": flops / times[k] / 1e12 for k in ("compute", "two_in_flight")},
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=SHAPES, help="ROWSxTOKENSxTEXTS, comma-separated")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--matmuls", default="auto", choices=("float32", "bfloat16", "auto"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_random_minilm(os.path.join(tmp, "minilm"))
        encoder = SentenceEncoder.from_dir(str(model), matmuls=args.matmuls)
        params = jax.device_put(encoder.load_params())
    print(f"{jax.devices()[0].device_kind}: matmuls {encoder.resolved_matmuls()}")
    rows = []
    for shape in args.shapes.split(","):
        r, length, texts = (int(v) for v in shape.split("x"))
        row = measure(encoder, params, r, length, texts, args.calls)
        rows.append(row)
        print(
            f"{row['shape']:>12}: compute {row['compute_ms']:7.2f} ms "
            f"({row['compute_tflops']:5.1f} TFLOP/s), one in flight {row['one_in_flight_ms']:7.2f}"
            f" ms, two {row['two_in_flight_ms']:7.2f} ms; send {row['send_ms']:.2f} ms, fetch "
            f"{row['fetch_ms']:.2f} ms ({row['out_mb']:.1f} MB)",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
