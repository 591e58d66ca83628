"""The dtype of the encoder's dense matmuls: float32, or bfloat16 inputs with float32 sums.

Where a device multiplies bfloat16 much faster than float32 (Intel AMX, AMD's AVX-512
bfloat16, GPU tensor cores, TPUs), the dense layers' weights and inputs can be rounded to
bfloat16 and multiplied with float32 accumulation, as TPUs do for float32 matmuls by
default. Everything else (the attention scores, softmax, layer norms, residuals, pooling)
stays float32. On
all-MiniLM-L6-v2 the embeddings keep a cosine of at least 0.99997 with sentence-transformers'
float32 ones (the reference corpora, ``tests/test_text_model.py``).

``"auto"`` takes bfloat16 where the process's default device has bfloat16 matrix units
(:func:`has_bfloat16_units`) and float32 elsewhere. It is decided from what the device is,
never timed, so every process on one kind of machine decides alike: the workers of a job,
and a rerun that resumes it, write embeddings of one precision.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np

from beam_jax._src.cores import CPUINFO, cpuinfo_field
from beam_jax._src.probe import local_platform

__all__ = ["MATMULS", "cast_dense", "has_bfloat16_units", "resolve"]

MATMULS = ("float32", "bfloat16", "auto")
"""The choices: exact float32; bfloat16 inputs with float32 sums; bfloat16 where the device
has bfloat16 matrix units, else float32 (:func:`has_bfloat16_units`)."""
_DENSE = ("query", "key", "value", "attention_out", "intermediate", "output")
_CPUINFO = CPUINFO  # a test points it at a file of its own
_log = logging.getLogger(__name__)


def resolve(matmuls: str, device: Any = None) -> str:
    """``"float32"`` or ``"bfloat16"``: ``matmuls`` itself, or for ``"auto"`` bfloat16 where
    ``device`` (default: this process's first) has bfloat16 matrix units."""
    if matmuls not in MATMULS:
        raise ValueError(f"matmuls must be one of {MATMULS}, got {matmuls!r}")
    if matmuls != "auto":
        return matmuls
    units, what = _bfloat16_units(device)
    chosen = "bfloat16" if units else "float32"
    _log.info("matmuls='auto': %s; using %s", what, chosen)
    return chosen


def has_bfloat16_units(device: Any = None) -> bool:
    """Whether ``device`` (default: this process's first JAX device) multiplies bfloat16 in
    hardware at several times its float32 rate.

    True for a TPU, an NVIDIA GPU of compute capability 8.0 or later (bfloat16 tensor
    cores: A100, L4, H100 and later), a CPU with Intel AMX (the ``amx_bf16`` flag) and an
    AMD CPU with AVX-512 bfloat16 dot products (``avx512_bf16``: Zen 4 and later). False
    elsewhere: CPUs with neither, where XLA's bfloat16 runs slower than its float32 (AVX2,
    and Intel's ``avx512_bf16`` without AMX), older GPUs, and devices this does not know
    (pass ``matmuls="bfloat16"`` to use it there). ``bench/RESULTS.md`` ("bfloat16 on
    CPUs, by feature") holds the matmul peaks each rule rests on.
    """
    return _bfloat16_units(device)[0]


def _bfloat16_units(device: Any) -> tuple[bool, str]:
    if device is None:
        # Every TPU has bfloat16 units: known without opening one (opening takes seconds).
        local = local_platform()
        if local.platform == "tpu":
            return True, f"{local.kind}: a TPU (bfloat16 matrix units)"
        import jax

        device = jax.devices()[0]
    platform = str(getattr(device, "platform", "unknown")).lower()
    kind = getattr(device, "device_kind", platform)
    if platform == "tpu":
        return True, f"{kind}: a TPU (bfloat16 matrix units)"
    if platform in ("gpu", "cuda"):
        capability = str(getattr(device, "compute_capability", "") or "")
        major = capability.split(".")[0]
        if major.isdigit() and int(major) >= 8:
            return True, f"{kind}: compute capability {capability} (bfloat16 tensor cores)"
        return False, f"{kind}: compute capability {capability or 'unknown'} (< 8.0)"
    if platform == "cpu":
        return _cpu_bfloat16_units(_cpu_flags(), _cpu_vendor())
    return False, f"{kind}: bfloat16 matrix units not known"


def _cpu_bfloat16_units(flags: frozenset[str], vendor: str) -> tuple[bool, str]:
    # By feature, never by timing. XLA's bfloat16 matmuls ran 3.5-5x its float32 with AMX
    # and about 1.9x on AMD's AVX-512 bfloat16 (Zen 4), but about 0.6x on an Intel CPU
    # with avx512_bf16 and no AMX, so the vendor decides for avx512_bf16.
    if "amx_bf16" in flags:
        return True, "CPU with Intel AMX (amx_bf16)"
    if "avx512_bf16" in flags and vendor == "AuthenticAMD":
        return True, "AMD CPU with AVX-512 bfloat16 (avx512_bf16)"
    if "avx512_bf16" in flags:
        return False, f"CPU with avx512_bf16 but no AMX ({vendor or 'vendor unknown'})"
    return False, "CPU without bfloat16 matrix units (no amx_bf16 or avx512_bf16)"


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """This machine's CPU feature flags (Linux; empty where ``/proc/cpuinfo`` is not)."""
    return frozenset(cpuinfo_field("flags", _CPUINFO).split())


@functools.cache
def _cpu_vendor() -> str:
    """This machine's CPU vendor (``GenuineIntel``, ``AuthenticAMD``; "" where unknown)."""
    return cpuinfo_field("vendor_id", _CPUINFO)


def cast_dense(params: dict[str, Any], matmuls: str) -> dict[str, Any]:
    """``params`` with every dense layer's weight matrix in bfloat16 when ``matmuls`` is
    ``"bfloat16"`` (the encoder multiplies in the weights' dtype); unchanged for float32."""
    if matmuls == "float32":
        return params
    if matmuls != "bfloat16":
        raise ValueError(f"cast_dense takes 'float32' or 'bfloat16', got {matmuls!r}")
    import ml_dtypes

    def layer(p: dict[str, Any]) -> dict[str, Any]:
        return {
            name: dict(value, w=np.asarray(value["w"]).astype(ml_dtypes.bfloat16))
            if name in _DENSE
            else value
            for name, value in p.items()
        }

    return dict(params, layers=[layer(p) for p in params["layers"]])
