"""ReduceKernel on several devices with a kernel that raises inside a host callback: the
failing element is a dead letter and the rest are summed, the process never aborts.

Each device sums its own shard of a batch (no collective between devices), so a callback
raising on one device leaves no other waiting for it. Run in a fresh interpreter with four
CPU devices: before, XLA ended the process after 40 s waiting in an all-reduce.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.processes import worker_env

_JOB = """
import json, sys
import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import beam_jax as bj
from tests import packed_kernels as pk


def _refuse(x):
    if np.any(x == pk.SENTINEL):
        raise ValueError("kernel refuses the value")
    return x


def failing_total(params, element, lengths):
    x = jax.pure_callback(
        _refuse, jax.ShapeDtypeStruct(element.shape, element.dtype), element,
        vmap_method="broadcast_all",
    )
    return jnp.sum(x)  # padding is zeros


assert len(jax.devices()) == 4, jax.devices()
mode = sys.argv[1]
rng = np.random.default_rng(3)
if mode == "packed":
    data = [rng.uniform(1, 2, int(rng.integers(1, 9))).astype(np.float32) for _ in range(60)]
    data[7][0] = pk.SENTINEL
    kernel = bj.ReduceKernel(
        pk.failing_sum, spec=bj.ArraySpec(("L",), np.float32), keyed=True,
        packing=bj.Packing(row_lengths=(8, 16), rows_per_batch=4, max_segments=4),
    )
    want = sum(float(x.sum()) for i, x in enumerate(data) if i != 7)
else:
    data = [rng.uniform(1, 2, int(rng.integers(1, 9))).astype(np.float32) for _ in range(60)]
    data[7][0] = pk.SENTINEL
    kernel = bj.ReduceKernel(
        failing_total, spec=bj.ArraySpec(("L",), np.float32), keyed=True,
        bucketing=bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=8),
    )
    want = sum(float(x.sum()) for i, x in enumerate(data) if i != 7)
with beam.Pipeline("FnApiRunner") as p:
    total, dead = p | beam.Create(list(enumerate(data))) | kernel.with_exception_handling()
    total | beam.Map(lambda r: print("TOTAL", json.dumps([r.count, float(np.sum(r.total))])))
    dead | beam.Map(lambda r: print("DEAD", json.dumps([r.key, r.stage])))
print("WANT", json.dumps(want))
"""


@pytest.mark.parametrize("mode", ["bucketed", "packed"])
def test_a_raising_callback_on_four_devices_is_one_dead_letter_not_an_abort(mode):
    env = worker_env()
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    proc = subprocess.run(
        [sys.executable, "-c", _JOB, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    lines = [line.split(" ", 1) for line in proc.stdout.splitlines()]
    out = {}
    for tag, value in (pair for pair in lines if len(pair) == 2):
        out.setdefault(tag, []).append(json.loads(value))
    assert out["DEAD"] == [[7, "kernel"]]
    ((count, total),) = out["TOTAL"]
    assert count == 59 and total == pytest.approx(out["WANT"][0], rel=1e-5)
