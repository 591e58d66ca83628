"""How far XLA's memory analysis is from the memory a CPU run actually uses.

    python bench/memory_check.py

For a few (kernel, length, batch) shapes, each in a fresh process: note the resident
memory (``VmRSS``) and reset the peak (``VmHWM``, via ``/proc/self/clear_refs``), then
compile through ``beam_jax``'s kernel, read the analysis (``analyse_shape``), allocate the
input and run one batch. ``measured`` is the peak minus that baseline: everything the shape
cost, compile and input included. ``run`` is the same from a baseline taken after the
compile, right before the input is allocated (the peak reset again): the batch alone.
Prints XLA's own figure (arguments + outputs + temporaries), the figure with the XNNPACK
estimate added (what ``FitToMemory`` judges by on CPU), both measurements, and the ratios.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

CASES = [
    ("heavy", 128, 32),
    ("heavy", 512, 64),
    ("heavy", 512, 256),
    ("attention", 512, 256),
    ("attention", 1024, 64),
    ("mlp", 512, 256),
]


def _kernels():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from kernels import heavy, load_params

    import beam_jax as bj

    def attention(params, x, lengths):
        mask = bj.length_mask(lengths["L"], x.shape[0])
        scores = jnp.where(mask[None, :], x @ x.T, jnp.float32(-1e9))
        return jnp.sum(jax.nn.softmax(scores, axis=-1) @ x, axis=0)

    def mlp(params, x, lengths):
        mask = bj.length_mask(lengths["L"], x.shape[0]).astype(jnp.float32)
        return jnp.sum(jax.nn.gelu(x @ params["w"]) * mask[:, None], axis=0)

    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    return {
        "heavy": (lambda p, x, lengths: heavy(p, {"x": x}, lengths), load_params(), 64),
        "attention": (attention, None, 4),
        "mlp": (mlp, {"w": w}, 4),
    }


def _status_bytes(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _baseline() -> int:
    """Resets the peak to the current resident memory; returns it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: reset VmHWM to VmRSS
    return _status_bytes("VmRSS")


def _child(name: str, length: int, batch: int) -> None:
    import numpy as np

    from beam_jax._src.kernel.memory import analyse_shape
    from beam_jax.internal import Kernel

    fn, params, dim = _kernels()[name]
    kernel = Kernel(fn, devices=[0])
    placed = kernel.put_params(params)
    before = _baseline()  # before the compile and the input
    a = analyse_shape(kernel, placed, [((batch, length, dim), np.float32)], ("L",), None)
    compiled = _status_bytes("VmHWM")
    before_run = _baseline()  # after the compile, before the input
    x = np.random.default_rng(0).standard_normal((batch, length, dim)).astype(np.float32)
    lengths = {"L": np.full(batch, length, np.int32)}
    kernel.call(placed, [x], lengths, treedef=None)
    peak = _status_bytes("VmHWM")
    out = {
        "xla": a.argument + a.output + a.temp,
        "fit": a.total,
        "measured": max(peak, compiled) - before,
        "run": peak - before_run,
    }
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    print(
        f"{'kernel':9} {'L':>5} {'batch':>5} {'XLA MiB':>8} {'+XNNPACK':>8} {'measured':>8}"
        f" {'run':>8} {'XLA/meas':>8} {'fit/meas':>8} {'fit/run':>8}"
    )
    for name, length, batch in CASES:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", name, str(length), str(batch)],
            capture_output=True,
            text=True,
            env=env,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise RuntimeError(proc.stderr[-3000:])
        r = json.loads(lines[-1][len("RESULT ") :])
        mib = {k: v / 2**20 for k, v in r.items()}
        print(
            f"{name:9} {length:5d} {batch:5d} {mib['xla']:8.1f} {mib['fit']:8.1f} "
            f"{mib['measured']:8.1f} {mib['run']:8.1f} {r['xla'] / r['measured']:8.2f} "
            f"{r['fit'] / r['measured']:8.2f} {r['fit'] / r['run']:8.2f}",
            flush=True,
        )
    from fingerprint import fingerprint, format_fingerprint

    print(format_fingerprint(fingerprint()))


if __name__ == "__main__":
    main()
