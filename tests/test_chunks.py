"""A batch run as chunks inside one kernel call (``KernelOptions.chunk_units``): the same
results as the batch run whole, chunks of the planned size, and through real pipelines
(packed Arrow rows in chunks, with per-record dead letters: tests/test_packed_kernel.py)."""

from __future__ import annotations

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax import ArraySpec, Packing, RunKernel, SpecError
from beam_jax._src.engine.options import chunk_rows_for, make_plan
from beam_jax._src.kernel.compiled import in_chunks
from beam_jax.internal import Kernel, Plan
from beam_jax.testing import assert_conserved
from tests import kernels
from tests.beam_helpers import pipeline, run

SPEC = {"x": ArraySpec(("L", kernels.D), np.float32)}
BUCKETING = bj.Bucketing(boundaries={"L": (4, 16, 32)}, batch_size=32)


def _rowwise(params, element, lengths):
    """A batched function with two outputs per row (a pytree), masked by each row's length."""
    x = element["x"]
    real = jnp.arange(x.shape[1])[None, :] < lengths["L"][:, None]
    total = jnp.sum(jnp.where(real[:, :, None], x, 0.0), axis=1)
    return {"total": total * params, "length": jnp.where(lengths.valid, lengths["L"], -1)}


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 24), st.integers(1, 10), st.integers(0, 2**31 - 1))
def test_property_chunked_equals_whole_for_any_batch_and_chunk(size, rows, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, 5, 2)).astype(np.float32)
    lengths = bj.BatchLengths(
        {"L": rng.integers(0, 6, size).astype(np.int32)}, np.arange(size) < size - 1
    )
    whole = _rowwise(np.float32(2.0), {"x": x}, lengths)
    chunked = jax.jit(in_chunks(_rowwise, lambda shapes: rows))(np.float32(2.0), {"x": x}, lengths)
    np.testing.assert_allclose(chunked["total"], whole["total"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(chunked["length"], whole["length"])


def test_the_kernel_runs_chunks_of_the_rows_chunk_rows_gives_it():
    seen = []

    def batched(params, element, lengths):
        seen.append(element["x"].shape[0])  # traced once per shape: the rows fn runs at once
        return _rowwise(params, element, lengths)

    plan = Plan(SPEC, BUCKETING)
    rows = chunk_rows_for(plan, 64)  # 64 padded units: 16 rows of 4, 4 of 16, 2 of 32
    chunked = Kernel(batched, batched=True, devices=[0], chunk_rows=rows)
    whole = Kernel(_rowwise, batched=True, devices=[0])
    rng = np.random.default_rng(0)
    tree = plan.layout.treedef
    # A size the chunks do not divide is made up to whole chunks when that adds at most an
    # eighth of its rows (30 -> 32, 11 -> 12), else it runs whole (18 -> 32 would add 14).
    cases = [((4,), 32, 16), ((16,), 32, 4), ((32,), 16, 2), ((32,), 2, 2),
             ((4,), 30, 16), ((16,), 11, 4), ((4,), 18, 18)]  # fmt: skip
    for bucket, size, want in cases:
        seen.clear()
        x = rng.standard_normal((size, bucket[0], kernels.D)).astype(np.float32)
        lengths = {"L": rng.integers(0, bucket[0] + 1, size).astype(np.int32)}
        got = chunked.call(np.float32(3.0), [x], lengths, treedef=tree, num_real=size - 1)
        ref = whole.call(np.float32(3.0), [x], lengths, treedef=tree, num_real=size - 1)
        assert seen == [want]
        np.testing.assert_allclose(got["total"], ref["total"], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got["length"], ref["length"])


@pytest.mark.parametrize("batched", [False, True])
def test_chunks_made_up_to_whole_ones_on_every_device(batched):
    """On all of the process's devices (4 here): per element, each device's shard is made
    up to whole chunks of its own; batched, the whole batch is. Either way, as run whole."""
    assert len(jax.devices()) == 4

    def per_element(params, element, lengths):
        x = element["x"]
        real = jnp.arange(x.shape[0])[:, None] < lengths["L"]
        return {"total": jnp.sum(jnp.where(real, x, 0.0), axis=0) * params}

    fn = _rowwise if batched else per_element
    tree = Plan(SPEC, BUCKETING).layout.treedef
    whole = Kernel(fn, batched=batched)
    rng = np.random.default_rng(3)
    for size, rows in [(68, 2), (20, 3), (12, 2), (8, 5)]:  # 17, 5, 3 and 2 rows per device
        chunked = Kernel(fn, batched=batched, chunk_rows=lambda shapes, rows=rows: rows)
        x = rng.standard_normal((size, 4, kernels.D)).astype(np.float32)
        lengths = {"L": rng.integers(0, 5, size).astype(np.int32)}
        got = chunked.call(np.float32(2.0), [x], lengths, treedef=tree, num_real=size - 1)
        ref = whole.call(np.float32(2.0), [x], lengths, treedef=tree, num_real=size - 1)
        np.testing.assert_allclose(got["total"], ref["total"], rtol=1e-5, atol=1e-5)


def test_chunk_rows_follow_each_shape_of_the_plan():
    plan = Plan(SPEC, BUCKETING)
    rows = chunk_rows_for(plan, 64)
    assert [rows([(b, kernels.D)]) for b in (4, 16, 32)] == [16, 4, 2]
    assert rows([(8, kernels.D)]) is None  # a shape the plan does not list runs whole
    assert chunk_rows_for(plan, 1)([(32, kernels.D)]) == 1  # never fewer than one row
    assert chunk_rows_for(plan, None) is None
    packed = make_plan(
        {"x": ArraySpec(("L", 3), np.float32), "w": ArraySpec((), np.float32)},
        bj.KernelOptions(packing=Packing(row_lengths=(8, 16), rows_per_batch=8, max_segments=4)),
    )
    by_length = chunk_rows_for(packed, 32)
    shapes = {n: [s[1:] for s, _ in packed.leaf_shapes((n,), 1)] for n in (8, 16)}
    assert by_length(shapes[8]) == 4 and by_length(shapes[16]) == 2


@pytest.mark.parametrize("bad", [0, -4, 1.5, True, "64"])
def test_chunk_units_must_be_a_positive_int(bad):
    with pytest.raises(SpecError, match="chunk_units must be a positive int"):
        bj.KernelOptions(chunk_units=bad)


def test_reduce_kernel_refuses_chunks_it_would_not_sum_over():
    with pytest.raises(SpecError, match="ReduceKernel sums each batch whole"):
        bj.ReduceKernel(_rowwise, spec=SPEC, bucketing=BUCKETING, batched=True, chunk_units=64)


def test_run_kernel_in_chunks_equals_whole_batches_through_a_pipeline():
    rng = np.random.default_rng(3)
    data = [
        {"x": rng.standard_normal((int(n), kernels.D)).astype(np.float32)}
        for n in rng.integers(1, 33, 90)
    ]
    params = kernels.attention_params(2)
    want = {i: kernels.reference_attention_pool(params, e["x"]) for i, e in enumerate(data)}

    def near_reference(got):
        got = dict(got)
        assert sorted(got) == sorted(want)
        for i, v in got.items():
            np.testing.assert_allclose(v, want[i], rtol=1e-4, atol=1e-5)

    p = pipeline()
    created = p | beam.Create(list(enumerate(data)))
    for name, units in (("Whole", None), ("Chunked", 64)):
        out = created | name >> RunKernel(
            kernels.masked_attention_pool,
            spec=SPEC,
            keyed=True,
            bucketing=BUCKETING,
            load_params=lambda: params,
            chunk_units=units,
            metrics_namespace=f"chunks_{name.lower()}",
        )
        assert_that(out, near_reference, label=f"Check{name}")
    result = run(p)
    for name in ("whole", "chunked"):
        assert_conserved(result, namespace=f"chunks_{name}")


_TRACED: list[int] = []


def _recording(params, element, lengths):
    _TRACED.append(element["x"].shape[0])  # at trace time: the rows one chunk holds
    return jnp.sum(element["x"], axis=(1, 2))


def test_a_pipeline_worker_runs_its_batches_in_the_planned_chunks():
    _TRACED.clear()
    p = pipeline()
    out = (
        p
        | beam.Create([{"x": np.ones((n, kernels.D), np.float32)} for n in range(1, 33)])
        | RunKernel(
            _recording,
            spec=SPEC,
            batched=True,
            bucketing=bj.Bucketing(boundaries={"L": (32,)}, batch_size=32),
            chunk_units=64,  # 2 rows of 32 at a time
        )
    )
    assert_that(out, equal_to([float(n * kernels.D) for n in range(1, 33)]))
    run(p)
    # Batches of 32 rows over the devices, each device's rows 2 at a time.
    assert _TRACED and set(_TRACED) == {2}
