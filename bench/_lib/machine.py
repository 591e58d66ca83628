"""The machine fingerprint every benchmark prints with its table, and its matmul peak.

A figure means little without the CPU model and the flags that decide matmul speed, the
cores this process may use, the load, the device JAX computes on, the environment's XLA
settings, and the measured matmul peak: the ceiling model FLOP utilisation (MFU) divides
by. A ``n x n`` matmul does ``2 n^3`` FLOPs; each timed run queues ``calls`` products and
waits for the last; the peak is the best size's median. Accelerators reach it only with
large products: 8,192 on a GPU or TPU by default, 2,048 on a CPU. ``memory_gbps``: the
roofline's other side (``bench/_lib/limit.py``).

    python -m bench._lib.machine --sizes 2048,8192 --repeat 5 --json peak.json
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import time
from pathlib import Path

# The flags that decide how fast XLA's CPU matmuls and vector loops run.
FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile",
         "neon", "asimd", "sve")  # fmt: skip
# The environment's settings of XLA and of a TPU's runtime, printed with every table.
XLA_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "TPU_PREMAPPED_BUFFER_SIZE", "JAX_PLATFORMS")


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


def _cpu_model() -> str:
    with_model = ("model name", "Hardware", "cpu model")
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(with_model):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def default_size() -> int:
    """8,192 on an accelerator (smaller products leave it idle), 2,048 on a CPU."""
    import jax

    return 2048 if jax.default_backend() == "cpu" else 8192


def dtypes() -> dict[str, str]:
    """fp32, and bf16 where it runs natively: a GPU or TPU, or a CPU with AVX-512 BF16 or AMX."""
    import jax

    bf16 = jax.default_backend() != "cpu" or bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    return {"fp32": "float32", **({"bf16": "bfloat16"} if bf16 else {})}


def matmul_gflops(n: int, dtype: str = "float32", repeat: int = 5, calls: int = 0) -> float:
    """Median GFLOP/s of ``n x n`` by ``n x n`` matmuls, ``calls`` queued per timed run
    (0: 2 on a CPU, 20 on an accelerator). bfloat16 is multiplied as models multiply it:
    bfloat16 inputs, float32 sums and output (``preferred_element_type``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    calls = calls if calls > 0 else (2 if jax.default_backend() == "cpu" else 20)
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32), dtype=dtype)
    b = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32), dtype=dtype)
    fn = functools.partial(jnp.matmul, preferred_element_type=jnp.float32)
    exe = jax.jit(fn).lower(a, b).compile()
    exe(a, b).block_until_ready()  # warm-up: first-touch of the output buffer
    times = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        jax.block_until_ready([exe(a, b) for _ in range(calls)])
        times.append((time.perf_counter() - start) / calls)
    return 2 * n**3 / statistics.median(times) / 1e9


def memory_gbps(mib: int = 0, repeat: int = 5) -> float:
    """Memory bandwidth: GB/s read and written by ``x * 0.5 + 1`` over ``mib`` MiB of float32
    (0: 1,024 on an accelerator, 256 on a CPU), its input donated (no new pages to touch)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones(((mib or (256 if jax.default_backend() == "cpu" else 1024)) * 2**18,))
    exe = jax.jit(lambda a: a * 0.5 + 1, donate_argnums=0).lower(x).compile()
    times = []
    for _ in range(max(1, repeat) + 1):  # the first run warms up
        start = time.perf_counter()
        x = exe(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * x.nbytes / statistics.median(times[1:]) / 1e9


def measure(sizes=None, repeat: int = 5, calls: int = 0) -> dict[str, dict[int, float]]:
    """``{"fp32": {size: GFLOP/s}, "bf16": ...}`` at ``sizes`` (default: the device's)."""
    return {
        name: {
            n: round(matmul_gflops(n, dtype, repeat, calls), 1) for n in sizes or (default_size(),)
        }
        for name, dtype in dtypes().items()
    }


def fingerprint(by_size: dict[str, dict[int, float]] | None = None) -> dict:
    """CPU model and flags, usable cores, load, JAX's backend and devices, the XLA settings
    of the environment, the matmul peak per dtype (measured here, about a second on a CPU,
    unless ``by_size`` gives :func:`measure`'s answer) and the memory bandwidth."""
    import jax

    by_size = by_size or measure()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    try:
        load = [round(x, 1) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": _cpu_model(),
        "flags": [f for f in FLAGS if f in cpu_flags()],
        "cores": cores,
        "load_avg": load,
        "backend": jax.default_backend(),
        "devices": [d.device_kind for d in jax.devices()],
        "jax": jax.__version__,
        "xla_env": {k: os.environ[k] for k in XLA_ENV if os.environ.get(k)},
        "peak_gflops": {k: max(v.values()) for k, v in by_size.items()},
        "peak_size": max(max(v, key=v.get) for v in by_size.values()),
        "memory_gbps": round(memory_gbps(), 1),
    }


def format_fingerprint(info: dict) -> str:
    """One line: ``machine: AMD EPYC (avx2 fma avx512f ...), 2 cores, load 1.2, ...``."""
    peak = ", ".join(f"{k} {v:.0f}" for k, v in info["peak_gflops"].items()) or "not measured"
    devices = info["devices"]
    device = f"{len(devices)} x {devices[0]}" if devices else "none"
    load = info["load_avg"][0] if info["load_avg"] else "n/a"
    env = "; ".join(f"{k}={v}" for k, v in info.get("xla_env", {}).items()) or "none set"
    return (
        f"machine: {info['cpu']} ({' '.join(info['flags']) or 'no vector flags'}), "
        f"{info['cores']} cores, load {load}; jax {info['jax']} {info['backend']} ({device}); "
        f"matmul peak GFLOP/s at {info['peak_size']}^2: {peak}; memory "
        f"{info.get('memory_gbps', 0):.0f} GB/s; XLA environment: {env}"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="", help="matrix sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per size")
    parser.add_argument("--calls", type=int, default=0, help="products queued per run")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s] or [default_size()]
    by_size = measure(sizes, args.repeat, args.calls)
    print(f"{'dtype':6} " + " ".join(f"{f'n={n}':>10}" for n in sizes) + "   (GFLOP/s)")
    for name, rates in by_size.items():
        print(f"{name:6} " + " ".join(f"{rates[n]:10.1f}" for n in sizes))
    info = fingerprint(by_size)
    print(format_fingerprint(info))
    out = {
        "peak_gflops": info["peak_gflops"],
        "by_size": by_size,
        "sizes": sizes,
        "fingerprint": info,
        "summary": ", ".join(
            f"{k} {v / 1000:.1f} TFLOP/s" if v >= 1000 else f"{k} {v:.0f} GFLOP/s"
            for k, v in info["peak_gflops"].items()
        ),
    }
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
