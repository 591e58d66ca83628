"""Smoke test on an accelerator: a RunKernel pipeline runs its kernel on the GPU/TPU.

Marked ``gpu``: skipped where JAX sees only CPUs. ``bench/device_check.sh`` runs it first
(with ``JAX_PLATFORMS`` unset, as ``tests/conftest.py`` otherwise pins JAX to the CPU).
"""

import apache_beam as beam
import jax
import numpy as np
import pytest
from apache_beam.testing.util import assert_that

import beam_jax as bj
from beam_jax.testing import assert_conserved
from tests.beam_helpers import pipeline, run

SPEC = {"x": bj.ArraySpec(("L", 8), np.float32)}


def _weighted_sum(params, element, lengths):
    """Per element: a (L, 8) @ (8, 8) matmul, masked to the real rows, summed."""
    x = element["x"] @ params
    mask = bj.length_mask(lengths["L"], x.shape[0])
    return jax.numpy.sum(jax.numpy.where(mask[:, None], x, 0.0))


def smoke_pipeline() -> bj.Summary:
    """Runs 40 ragged elements through RunKernel; checks every result against numpy."""
    params = (np.arange(64, dtype=np.float32).reshape(8, 8) / 64).astype(np.float32)
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((n, 8)).astype(np.float32) for n in range(1, 41)]
    expected = {i: float((v @ params).sum()) for i, v in enumerate(values)}

    def check(actual):
        got = {key: float(y) for key, y in actual}
        assert sorted(got) == sorted(expected)
        # A GPU may run fp32 matmuls in TF32: agree to about 1e-3 of the values' scale.
        for key, want in expected.items():
            assert abs(got[key] - want) <= 1e-2 * (1 + abs(want)), (key, got[key], want)

    p = pipeline()
    results = (
        p
        | beam.Create([(i, {"x": v}) for i, v in enumerate(values)])
        | bj.RunKernel(
            _weighted_sum,
            spec=SPEC,
            bucketing=bj.Bucketing(boundaries={"L": (8, 16, 40)}, batch_size=8),
            load_params=lambda: params,
            keyed=True,
        )
    )
    assert_that(results, check)
    summary = assert_conserved(run(p))
    assert summary.results == 40 and summary.compiles >= 3
    return summary


@pytest.mark.gpu
def test_a_pipeline_runs_its_kernel_on_the_accelerator():
    assert jax.default_backend() != "cpu", jax.devices()
    smoke_pipeline()
