"""How far XLA's memory analysis is from the memory a CPU run actually uses.

    python bench/memory_check.py

For a few (kernel, length, batch) shapes, each in a fresh process: compile through
``beam_jax``'s kernel, read the analysis (``analyse_shape``), run one batch and measure the
growth of peak RSS over the run. Prints XLA's own figure (arguments + outputs +
temporaries), the figure with the XNNPACK estimate added (what ``FitToMemory`` judges by on
CPU), the measured growth, and each figure's ratio to it.
"""

from __future__ import annotations

import json
import os
import resource
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


def _child(name: str, length: int, batch: int) -> None:
    import numpy as np

    from beam_jax.internal import Kernel, analyse_shape

    fn, params, dim = _kernels()[name]
    kernel = Kernel(fn, devices=[0])
    placed = kernel.put_params(params)
    a = analyse_shape(kernel, placed, [((batch, length, dim), np.float32)], ("L",), None)
    x = np.random.default_rng(0).standard_normal((batch, length, dim)).astype(np.float32)
    lengths = {"L": np.full(batch, length, np.int32)}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kernel.call(placed, [x], lengths, treedef=None)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    xla = a.argument + a.output + a.temp
    print("RESULT " + json.dumps({"xla": xla, "fit": a.total, "measured": grown}), flush=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    print(
        f"{'kernel':9} {'L':>5} {'batch':>5} {'XLA MiB':>8} {'+XNNPACK':>8} {'measured':>8}"
        f" {'XLA/meas':>8} {'fit/meas':>8}"
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
            f"{mib['measured']:8.1f} {r['xla'] / r['measured']:8.2f} "
            f"{r['fit'] / r['measured']:8.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
