"""The machine's matmul peak under JAX: the ceiling that model FLOP utilisation divides by.

    python bench/peak.py                     # fp32 and bf16, at the device's default size
    python bench/peak.py --sizes 2048,4096,8192 --repeat 7 --json peak.json

A square ``n x n`` matmul does ``2 n^3`` floating-point operations. Each timed run queues
``--calls`` products back to back and waits for the last (pipelined: an accelerator never
idles between calls, as it does when each call is waited for), so the figure is the best
size's median over ``--repeat`` runs of the time per product (the compile and one warm-up
run are not timed). Accelerators reach their peak only with large products: the default
size is 8,192 on a GPU or TPU (a TPU v5e chip: 161.6 bf16 TFLOP/s at 8,192^2, against
26.7 from single 2,048^2 products); on a CPU 2,048 already reaches it (8,192 would take
about half a minute per product). The size is printed with the figure.
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


def default_size() -> int:
    """8,192 on an accelerator (smaller products leave it idle), 2,048 on a CPU."""
    import jax

    return 2048 if jax.default_backend() == "cpu" else 8192


def matmul_gflops(n: int, dtype: str = "float32", repeat: int = 5, calls: int = 0) -> float:
    """Median GFLOP/s of ``n x n`` by ``n x n`` matmuls, ``calls`` queued per timed run.

    bfloat16 is multiplied as models multiply it: bfloat16 inputs, float32 sums and output
    (``preferred_element_type``; with a bfloat16 output XLA's CPU backend takes a slower
    path that does not use Intel AMX). ``calls`` 0: 2 on a CPU, 20 on an accelerator.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    if calls <= 0:
        calls = 2 if jax.default_backend() == "cpu" else 20
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32), dtype=dtype)
    b = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32), dtype=dtype)
    fn = functools.partial(jnp.matmul, preferred_element_type=jnp.float32)
    exe = jax.jit(fn).lower(a, b).compile()
    exe(a, b).block_until_ready()  # warm-up: first-touch of the output buffer
    times = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        outs = [exe(a, b) for _ in range(calls)]  # queued; the device runs them in turn
        jax.block_until_ready(outs)
        times.append((time.perf_counter() - start) / calls)
        del outs
    return 2 * n**3 / statistics.median(times) / 1e9


def dtypes() -> dict[str, str]:
    """The dtypes measured: fp32, and bf16 where :func:`has_bf16` says it runs natively."""
    return {"fp32": "float32", **({"bf16": "bfloat16"} if has_bf16() else {})}


def measure(sizes=None, repeat: int = 5) -> dict[str, float]:
    """``{"fp32": GFLOP/s, "bf16": GFLOP/s}``: the best size's median per dtype, at
    :func:`default_size` unless ``sizes`` are given."""
    sizes = sizes or (default_size(),)
    return {
        name: round(max(matmul_gflops(n, dtype, repeat) for n in sizes), 1)
        for name, dtype in dtypes().items()
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="", help="matrix sizes, comma-separated (default: the device's)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per size")
    parser.add_argument(
        "--calls", type=int, default=0, help="products queued per run (0: 2 on CPU, 20 else)"
    )
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s] or [default_size()]
    from fingerprint import fingerprint, format_fingerprint

    rows = {
        name: {n: round(matmul_gflops(n, dtype, args.repeat, args.calls), 1) for n in sizes}
        for name, dtype in dtypes().items()
    }
    peak = {name: max(by_size.values()) for name, by_size in rows.items()}
    print(
        f"{'dtype':6} " + " ".join(f"{f'n={n}':>10}" for n in sizes)
        + "   (GFLOP/s, median time per product, products queued back to back)"
    )  # fmt: skip
    for name, by_size in rows.items():
        print(f"{name:6} " + " ".join(f"{by_size[n]:10.1f}" for n in sizes))
    best = {name: max(by_size, key=by_size.get) for name, by_size in rows.items()}
    info = fingerprint(peak=peak, peak_size=max(best.values()))
    print(format_fingerprint(info))
    out = {"peak_gflops": peak, "by_size": rows, "sizes": sizes, "fingerprint": info}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
