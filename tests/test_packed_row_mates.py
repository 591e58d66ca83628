"""A packed record whose output fails its check takes none of its row-mates with it: the
failing records run again apart, so only the record that fails alone is a dead letter."""

from __future__ import annotations

import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax import ArraySpec, Packing, RunKernel
from beam_jax.testing import assert_conserved
from tests import packed_kernels as pk
from tests.beam_helpers import pipeline, run

N, BAD = 300, 137
PACKING = Packing(row_lengths=16, rows_per_batch=8, max_segments=6)
FINITE = bj.Validation(check_outputs_finite=True)


def _values() -> list[np.ndarray]:
    """Small integers (sums exact in float32), one record holding an Inf."""
    rng = np.random.default_rng(5)
    values = [rng.integers(-4, 5, int(rng.integers(1, 6))).astype(np.float32) for _ in range(N)]
    values[BAD][0] = np.inf
    return values


def _exact(values):
    def check(got):
        got = dict(got)
        assert sorted(got) == [i for i in range(N) if i != BAD]
        for i, total in got.items():
            assert total == float(values[i].sum()), (i, total)  # exact, not close

    return check


def test_the_mixing_kernel_spoils_row_mates_without_the_check():
    """Why the engine reruns: without the check, the Inf record's row-mates come out NaN."""
    values = _values()
    p = pipeline()
    results = (
        p
        | beam.Create(list(enumerate(values)))
        | RunKernel(pk.mixing_sum, spec=ArraySpec(("L",), np.float32), keyed=True, packing=PACKING)
    )
    nan = results | beam.Filter(lambda kv: np.isnan(kv[1])) | beam.combiners.Count.Globally()
    assert_that(nan, lambda n: n[0] >= 1 or pytest.fail(f"{n} NaN row-mates"))
    run(p)


@pytest.mark.parametrize("cross_bundle", [False, True])
def test_one_inf_record_among_hundreds_is_the_one_dead_letter(cross_bundle):
    values = _values()
    run_kernel = RunKernel(
        pk.mixing_sum,
        spec=ArraySpec(("L",), np.float32),
        keyed=True,
        packing=PACKING,
        validation=FINITE,
    )
    if cross_bundle:
        run_kernel = run_kernel.with_cross_bundle_batching(max_wait_s=3600, shards=2)
    p = pipeline()
    results, dead = p | beam.Create(list(enumerate(values))) | run_kernel.with_exception_handling()
    assert_that(results | beam.MapTuple(lambda k, v: (k, float(v))), _exact(values))
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage)), equal_to([(BAD, "output")]), label="Dead"
    )
    summary = assert_conserved(run(p))
    if not cross_bundle:  # one packed batch's failing records rerun within the bound
        batches = math.ceil(N / 16)  # at least this many calls without the Inf
        assert summary.kernel_calls <= 2 * batches + 2 * PACKING.max_segments * math.ceil(
            math.log2(N)
        ), summary.kernel_calls


def test_the_same_with_arrow_input():
    values = _values()
    batches = [
        pa.record_batch(
            {
                "id": pa.array(range(lo, min(lo + 50, N)), pa.int64()),
                "x": pa.array([v.tolist() for v in values[lo : lo + 50]], pa.list_(pa.float32())),
            }
        )
        for lo in range(0, N, 50)
    ]
    p = pipeline()
    results, dead = (
        p
        | beam.Create(batches)
        | bj.RunKernelOnArrow(
            pk.mixing_sum,
            spec={"x": ArraySpec(("L",), np.float32)},
            columns=bj.ArrowColumns(leaves={"x": "x"}, id="id"),
            packing=PACKING,
            validation=FINITE,
            metrics_namespace="row_mates",
        ).with_exception_handling()
    )
    rows = results | beam.FlatMap(
        lambda b: zip(b.column("id").to_pylist(), b.column("output").to_pylist(), strict=True)
    )
    assert_that(rows, _exact(values))
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage)), equal_to([(BAD, "output")]), label="Dead"
    )
    assert_conserved(run(p), namespace="row_mates")
