"""The machine's matmul peak under JAX: the ceiling that model FLOP utilisation divides by.

    python bench/peak.py                     # fp32 (and bf16 where the CPU has it), n=2048
    python bench/peak.py --sizes 1024,2048,4096 --repeat 7 --json peak.json

A square ``n x n`` matmul does ``2 n^3`` floating-point operations; the figure is the best
size's median over ``--repeat`` timed runs (the compile and one warm-up run are not timed).
On a CPU the matmul is the fastest thing XLA does, so a model's FLOP rate divided by this
peak is an honest utilisation, and absolute figures from two machines can be compared.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def has_bf16() -> bool:
    """Whether bf16 matmuls run natively: a GPU/TPU, or a CPU with AVX-512 BF16 or AMX."""
    import jax

    if jax.default_backend() != "cpu":
        return True
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def matmul_gflops(n: int, dtype: str = "float32", repeat: int = 5) -> float:
    """Median GFLOP/s of an ``n x n`` by ``n x n`` matmul over ``repeat`` timed runs.

    bfloat16 is multiplied as models multiply it: bfloat16 inputs, float32 sums and output
    (``preferred_element_type``; with a bfloat16 output XLA's CPU backend takes a slower
    path that does not use Intel AMX)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32), dtype=dtype)
    b = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32), dtype=dtype)
    fn = functools.partial(jnp.matmul, preferred_element_type=jnp.float32)
    exe = jax.jit(fn).lower(a, b).compile()
    exe(a, b).block_until_ready()  # warm-up: first-touch of the output buffer
    times = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        exe(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


def measure(sizes=(2048,), repeat: int = 5) -> dict[str, float]:
    """``{"fp32": GFLOP/s, "bf16": GFLOP/s}``: the best size's median per dtype.

    bf16 is measured only where :func:`has_bf16` says it runs natively.
    """
    dtypes = {"fp32": "float32"}
    if has_bf16():
        dtypes["bf16"] = "bfloat16"
    return {
        name: round(max(matmul_gflops(n, dtype, repeat) for n in sizes), 1)
        for name, dtype in dtypes.items()
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sizes", default="2048", help="matrix sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per size")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    from fingerprint import fingerprint, format_fingerprint

    dtypes = {"fp32": "float32", **({"bf16": "bfloat16"} if has_bf16() else {})}
    rows = {
        name: {n: round(matmul_gflops(n, dtype, args.repeat), 1) for n in sizes}
        for name, dtype in dtypes.items()
    }
    peak = {name: max(by_size.values()) for name, by_size in rows.items()}
    print(f"{'dtype':6} " + " ".join(f"{f'n={n}':>10}" for n in sizes) + "   (GFLOP/s, median)")
    for name, by_size in rows.items():
        print(f"{name:6} " + " ".join(f"{by_size[n]:10.1f}" for n in sizes))
    info = fingerprint(peak=peak)
    print(format_fingerprint(info))
    out = {"peak_gflops": peak, "by_size": rows, "fingerprint": info}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
