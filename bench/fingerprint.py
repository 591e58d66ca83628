"""The machine fingerprint every benchmark prints with its table.

Absolute rates move 2-3x between machines of the same name (AVX-512 or not, a shared or an
idle host), so a figure means little without the CPU model, the flags that decide matmul
speed, the cores this process may use, the load while it ran, and the measured matmul
peak (:mod:`peak`). Ratios measured side by side in one run are what travel.
"""

from __future__ import annotations

import os
import platform

# The flags that decide how fast XLA's CPU matmuls and vector loops run.
_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "amx_bf16",
    "amx_tile",
    "neon",
    "asimd",
    "sve",
)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(
    peak: dict[str, float] | None = None, measure_peak: bool = True, peak_size: int | None = None
) -> dict:
    """CPU model and flags, usable cores, load, JAX backend and devices, matmul peak.

    Args:
        peak: GFLOP/s per dtype already measured (``peak.measure()``); measured here
            (about a second) when None and ``measure_peak``.
        measure_peak: measure the peak when ``peak`` is None.
        peak_size: the matrix size ``peak`` was measured at (default: the device's).
    """
    import jax
    from peak import cpu_flags, default_size, measure

    flags = cpu_flags()
    if peak is None and measure_peak:
        peak = measure()
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
        "flags": [f for f in _FLAGS if f in flags],
        "cores": cores,
        "load_avg": load,
        "backend": jax.default_backend(),
        "devices": [d.device_kind for d in jax.devices()],
        "jax": jax.__version__,
        "peak_gflops": peak or {},
        "peak_size": peak_size or default_size(),
    }


def format_fingerprint(info: dict) -> str:
    """One line: ``machine: AMD EPYC (avx2 fma avx512f ...), 2 cores, load 1.2, ...``."""
    peak = ", ".join(f"{k} {v:.0f}" for k, v in info["peak_gflops"].items()) or "not measured"
    devices = info["devices"]
    device = f"{len(devices)} x {devices[0]}" if devices else "none"
    load = info["load_avg"][0] if info["load_avg"] else "n/a"
    return (
        f"machine: {info['cpu']} ({' '.join(info['flags']) or 'no vector flags'}), "
        f"{info['cores']} cores, load {load}; jax {info['jax']} {info['backend']} ({device}); "
        f"matmul peak GFLOP/s at {info.get('peak_size', '?')}^2: {peak}"
    )
