"""The limit's roofline (``bench/_lib/limit.py``): XLA's FLOPs and bytes of a compiled
program, the least bytes, and the MFU bound a traffic leaves on a device."""

import jax
import jax.numpy as jnp
import numpy as np

from bench._lib import limit


def test_costs_of_a_compiled_matmul_are_xlas_and_scale_with_the_batches():
    a, b = jnp.ones((64, 32), jnp.float32), jnp.ones((32, 16), jnp.float32)
    compiled = jax.jit(lambda x, y: jnp.tanh(x @ y)).lower(a, b).compile()
    one, three = limit.costs(compiled, 1), limit.costs(compiled, 3)
    assert one["flops"] >= 2 * 64 * 32 * 16
    assert one["bytes"] >= (64 * 32 + 32 * 16 + 64 * 16) * 4  # read and written at least once
    assert three["flops"] == 3 * one["flops"] and three["bytes"] == 3 * one["bytes"]
    both = limit.costs(compiled, 3, limit.costs(compiled, 1))
    assert both["flops"] == 4 * one["flops"]
    assert both["bytes"] == 4 * one["bytes"]


def test_the_least_traffic_is_a_layers_rows_in_and_out_and_its_weights_once_a_batch():
    got = limit.least_bytes(1000, hidden=4, item=4, tokens=10, batches=2, layers=3)
    assert got == 3 * (2 * 4 * 4 * 10 + 1000 * 2)


def _roof(flops, nbytes, least):
    return {"flops": flops, "bytes": nbytes, "least_bytes": least, "tokens": 100, "layers": 2}


def test_the_bound_is_the_slower_of_compute_and_traffic():
    # 1e12 FLOP at 100 TFLOP/s takes 10 ms; 4e9 B at 1,000 GB/s 4 ms; 2e10 B 20 ms.
    compute_bound = limit.report(_roof(1e12, 4e9, 1e9), 0.8e12, 100_000, 1000)
    assert compute_bound[2] == "MFU bound at XLA's traffic 80.0%, at the least 80.0%"
    memory_bound = limit.report(_roof(1e12, 2e10, 1e9), 0.8e12, 100_000, 1000)
    assert memory_bound[2] == "MFU bound at XLA's traffic 40.0%, at the least 80.0%"
    assert memory_bound[0].startswith("per token slot and layer: 5000.00 MFLOP (XLA), 100000.0 KB")
    assert "ridge 100 (100.0 TFLOP/s over 1000 GB/s)" in memory_bound[1]


def test_a_program_whose_kernels_xla_cannot_see_gets_no_roofline():
    lines = limit.report(_roof(1e9, 4e9, 1e9), 0.8e12, 100_000, 1000)
    assert len(lines) == 1 and "does not see inside" in lines[0]


def test_the_memory_bandwidth_is_measured_and_positive():
    from bench._lib.machine import memory_gbps

    gbps = memory_gbps(4, repeat=2)
    assert np.isfinite(gbps) and gbps > 0
