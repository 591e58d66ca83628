"""Batch sizes fitted to memory: the search, XLA's analysis on CPU, and the engine with it."""

import math

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax._src.bucketing.fit import ShapeBytes, search_limits
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.engine.fit import fit_batch_limits
from beam_jax._src.kernel.memory import analyse_shape, hidden_fusion_bytes
from beam_jax.internal import Kernel, Plan, fit_plan
from beam_jax.testing import assert_conserved
from tests import packed_kernels as pk
from tests import reliability_kernels as rk
from tests.beam_helpers import pipeline, run

POWERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def attention(params, element, lengths):
    """Masked softmax self-attention, pooled: its temporaries grow with length squared."""
    x = element
    mask = bj.length_mask(lengths["L"], x.shape[0])
    scores = jnp.where(mask[None, :], x @ x.T, jnp.float32(-1e9))
    return jnp.sum(jax.nn.softmax(scores, axis=-1) @ x, axis=0) * params["scale"]


def distance_attention(params, element, lengths):
    """Softmax attention over negative L1 distances: an (L, L, D) intermediate, no matmul.

    XLA:CPU hands matmul attention to XNNPACK fusions whose buffers its analysis partly
    misses; this kernel's temporaries it counts whole, so lengths compare exactly.
    """
    x = element
    mask = bj.length_mask(lengths["L"], x.shape[0])
    scores = -jnp.sum(jnp.abs(x[:, None, :] - x[None, :, :]), axis=-1)
    w = jax.nn.softmax(jnp.where(mask[None, :], scores, jnp.float32(-1e9)), axis=-1)
    return jnp.sum(jnp.sum(w[:, :, None] * x[None, :, :], axis=1), axis=0) * params["scale"]


def pooled_mlp(params, element, lengths):
    """A per-position MLP, pooled: its temporaries grow linearly with length."""
    mask = bj.length_mask(lengths["L"], element.shape[0]).astype(jnp.float32)
    h = jax.nn.gelu(element @ params["w"])
    return jnp.sum(h * mask[:, None], axis=0)


def attention_params():
    return {"scale": np.float32(0.5)}


def mlp_params():
    return {"w": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}


SPEC = bj.ArraySpec(("L", 4), np.float32)


def fitted(fn, load, boundaries, budgets, *, devices=(0,), batch_size=1024):
    """``fit_batch_limits`` for each budget, sharing one kernel (compiles are cached)."""
    kernel = Kernel(fn, devices=list(devices))
    plan = Plan(
        SPEC,
        bj.Bucketing(boundaries={"L": boundaries}, batch_size=batch_size, batch_sizes=POWERS),
        num_devices=kernel.num_devices,
    )
    params = kernel.put_params(load())
    reports = [
        fit_batch_limits(kernel, params, plan, bj.FitToMemory(budget_bytes=b)) for b in budgets
    ]
    return plan, kernel, reports


# --- the policy and the pure search ---------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"budget_bytes": 0}, "budget_bytes must be a positive int"),
        ({"budget_bytes": 1.5e9}, "budget_bytes must be a positive int"),
        ({"device_fraction": 1.5}, r"device_fraction must be within \(0, 1\]"),
        ({"device_fraction": 0}, r"device_fraction must be within \(0, 1\]"),
        ({"one_size": 1}, "one_size must be a bool"),
    ],
)
def test_policy_is_validated_with_the_received_value(kwargs, match):
    with pytest.raises(bj.SpecError, match=match):
        bj.FitToMemory(**kwargs)
    with pytest.raises(bj.SpecError, match="fit_to_memory must be a FitToMemory"):
        bj.KernelOptions(fit_to_memory=1 << 20)


def test_search_bisects_within_log2_analyses_per_bucket():
    calls = []

    def analyse(bucket, size):
        calls.append((bucket, size))
        return ShapeBytes(argument=100, output=0, temp=size * bucket[0])

    sizes = {(4,): POWERS, (16,): POWERS, (64,): POWERS}
    limits, rows = search_limits(list(sizes), sizes, analyse, budget=100 + 1000)
    assert limits == {(4,): 128, (16,): 32, (64,): 8}
    assert len(calls) == len(set(calls))  # each shape analysed once
    for bucket in sizes:
        assert sum(b == bucket for b, _ in calls) <= math.ceil(math.log2(len(POWERS))) + 1
    assert all(r.analysed.trusted for r in rows)


def test_smallest_size_that_does_not_fit_is_kept_and_reported():
    limits, rows = search_limits(
        [(8,)], {(8,): (2, 4)}, lambda b, s: ShapeBytes(argument=s * 1000, output=0, temp=0), 10
    )
    assert limits == {(8,): 2}
    assert [(r.size, r.fits, r.limit) for r in rows] == [(2, False, 2)]


def test_a_shape_that_fails_to_compile_counts_as_not_fitting():
    limits, rows = search_limits(
        [(8,)],
        {(8,): (1, 2, 4)},
        lambda b, s: None if s == 4 else ShapeBytes(argument=s, output=0, temp=0),
        10**6,
    )
    assert limits == {(8,): 2}
    assert [(r.size, r.compiled, r.fits) for r in rows] == [
        (1, True, True),
        (2, True, True),
        (4, False, False),
    ]


def test_hidden_bytes_count_towards_the_total_and_untrust_the_row():
    def analyse(bucket, size):
        return ShapeBytes(argument=10, output=10, temp=size, hidden=size if size > 2 else 0)

    limits, rows = search_limits([(8,)], {(8,): (1, 2, 4, 8)}, analyse, budget=30)
    assert limits == {(8,): 4}
    assert [(r.size, r.total, r.analysed.trusted, r.fits) for r in rows] == [
        (1, 21, True, True),
        (4, 28, False, True),
        (8, 36, False, False),
    ]


# --- XLA's analysis of real programs on CPU -------------------------------------------------


def test_each_bucket_gets_the_largest_size_whose_analysis_fits_and_the_next_does_not():
    budget = 4 << 20
    plan, _, (report,) = fitted(attention, attention_params, (32, 64, 128), [budget])
    by = {(r.bucket, r.size): r for r in report.rows}
    for bucket in plan.buckets:
        limit = report.limits[bucket]
        chosen = by[bucket, limit]
        assert chosen.fits and chosen.total <= budget
        assert chosen.analysed.argument + chosen.analysed.output + chosen.analysed.temp > 0
        sizes = plan.batch_sizes(bucket)
        following = sizes[sizes.index(limit) + 1]
        assert by[bucket, following].total > budget
    table = report.table()
    assert {"argument_bytes", "output_bytes", "temp_bytes", "limit", "chosen"} <= set(table[0])
    assert sum(row["chosen"] for row in table) == len(plan.buckets)


def test_sizes_grow_with_the_budget_and_shrink_with_length_quadratically_for_attention():
    budgets = [1 << 20, 4 << 20, 16 << 20]
    plan, kernel, reports = fitted(distance_attention, attention_params, (32, 64, 128), budgets)
    compiles_after_first = kernel.compiles - reports[0].compiles
    for smaller, larger in zip(reports, reports[1:], strict=False):
        assert all(larger.limits[b] >= smaller.limits[b] for b in plan.buckets)
    assert reports[-1].limits != reports[0].limits
    for report in reports:
        limits = [report.limits[b] for b in plan.buckets]
        # Twice the length, four times the score matrix: a quarter of the batch.
        assert limits[0] == 4 * limits[1] == 16 * limits[2], limits
    # Later searches reuse the cached compiles of earlier ones.
    assert sum(r.compiles for r in reports[1:]) == compiles_after_first
    assert len(kernel.compiled_shapes()) == kernel.compiles <= len(plan.shapes())


def test_a_linear_kernel_shrinks_linearly_with_length():
    plan, _, (report,) = fitted(pooled_mlp, mlp_params, (32, 64, 128), [8 << 20])
    limits = [report.limits[b] for b in plan.buckets]
    assert limits[0] == 2 * limits[1] == 4 * limits[2], limits


def test_per_device_batch_and_replicated_parameters_on_four_devices():
    budget = 4 << 20
    _, _, (one,) = fitted(pooled_mlp, mlp_params, (32, 64, 128), [budget])
    plan, kernel, (four,) = fitted(
        pooled_mlp, mlp_params, (32, 64, 128), [budget], devices=(0, 1, 2, 3)
    )
    assert kernel.num_devices == 4 and four.num_devices == 4
    for bucket in plan.buckets:
        # Each device holds a quarter of the batch, so the whole batch is four times larger.
        assert four.limits[bucket] == 4 * one.limits[bucket]
    for row in four.table():
        assert row["per_device_batch"] * 4 == row["batch_size"]
        # Every device holds a whole copy of the parameters among its arguments.
        assert row["argument_bytes"] >= row["params_bytes"] == 4 * 64 * 4


def test_cpu_analysis_misses_xnnpack_fusions_and_their_intermediates_are_estimated():
    # jax 0.10 on CPU: at 1,024 positions, 4 rows and more go to one XNNPACK fusion and
    # XLA's temporaries read 0, though the 4 score matrices alone take 16 MiB.
    kernel = Kernel(lambda p, x, lengths: jax.nn.softmax(x @ x.T, axis=-1) @ x, devices=[0])
    scores = 1024 * 1024 * 4
    one, four = (
        analyse_shape(kernel, None, [((s, 1024, 64), np.float32)], ("L",), None) for s in (1, 4)
    )
    assert one.temp >= scores and four.temp == 0
    assert not four.trusted and four.hidden >= 4 * scores
    assert four.total >= 4 * scores + four.argument + four.output
    # A kernel without XNNPACK fusions is XLA's own figure.
    plain = Kernel(lambda p, x, lengths: jnp.sum(jnp.abs(x)), devices=[0])
    assert analyse_shape(plain, None, [((4, 8), np.float32)], (), None).trusted


def test_hidden_fusion_bytes_reads_the_two_largest_intermediates_of_a_library_fusion():
    hlo = """
%fc (param_0: f32[8,16]) -> f32[8,16] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  %dot.1 = f32[8,16,16]{2,1,0} dot(%param_0, %param_0)
  %exp.1 = f32[8,16,16]{2,1,0} exponential(%dot.1)
  %reduce.1 = f32[8,16]{1,0} reduce(%exp.1, %c)
  ROOT %out = f32[8,16]{1,0} divide(%reduce.1, %reduce.1)
}

%loop_computation (param_0: f32[8,16]) -> f32[8,16] {
  %big = f32[1024,1024]{1,0} broadcast(%param_0)
  ROOT %o = f32[8,16]{1,0} copy(%param_0)
}

ENTRY %main.3 (x.1: f32[8,16]) -> f32[8,16] {
  %x.1 = f32[8,16]{1,0} parameter(0)
  %loop = f32[8,16]{1,0} fusion(%x.1), kind=kLoop, calls=%loop_computation
  ROOT %y = f32[8,16]{1,0} fusion(%loop), kind=kCustom, calls=%fc, backend_config={"__ynn_fusion"}
}
"""
    assert hidden_fusion_bytes(hlo) == 2 * 8 * 16 * 16 * 4


def test_cpu_without_a_stated_budget_is_refused_with_the_fix():
    options = bj.KernelOptions(
        bucketing=bj.Bucketing(boundaries={"L": (8,)}, batch_size=4),
        fit_to_memory=bj.FitToMemory(),
        devices=[0],
    )
    with pytest.raises(bj.SpecError, match=r"do not report their memory.*budget_bytes="):
        fit_plan(attention, SPEC, options)


# --- through a real pipeline ----------------------------------------------------------------


def _elements(n, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 129, n)
    return [(i, rng.standard_normal((int(k), 4)).astype(np.float32)) for i, k in enumerate(lengths)]


def _save(outdir):
    def save(kv):
        np.save(outdir / f"{kv[0]}.npy", kv[1])

    return save


def _run(elements, outdir=None, **kw):
    p = pipeline()
    results, dead = (
        p
        | beam.Create(elements)
        | bj.RunKernel(
            attention, spec=SPEC, keyed=True, load_params=attention_params, **kw
        ).with_exception_handling()
    )
    if outdir is not None:
        outdir.mkdir()
        _ = results | beam.Map(_save(outdir))
    assert_that(dead, equal_to([]), label="NoDeadLetters")
    return run(p)


def _load(outdir):
    return {int(f.stem): np.load(f) for f in outdir.glob("*.npy")}


def test_results_equal_those_with_fixed_batch_sizes_through_run_kernel(tmp_path):
    elements = _elements(150)
    bucketing = bj.Bucketing(boundaries={"L": (32, 64, 128)}, batch_size=256)
    budget = 1 << 20
    report = fit_plan(
        attention,
        SPEC,
        bj.KernelOptions(
            bucketing=bucketing,
            load_params=attention_params,
            fit_to_memory=bj.FitToMemory(budget_bytes=budget),
        ),
    )
    assert report.num_devices == 4  # conftest's CPU devices
    fixed = {b: report.limits[b] for b in report.limits}
    assert len(set(fixed.values())) > 1  # different sizes per bucket
    fit_result = _run(
        elements,
        tmp_path / "fit",
        bucketing=bucketing,
        fit_to_memory=bj.FitToMemory(budget_bytes=budget),
    )
    _run(
        elements,
        tmp_path / "fixed",
        bucketing=bj.Bucketing(boundaries={"L": (32, 64, 128)}, batch_size=fixed),
    )
    fit_out, fixed_out = _load(tmp_path / "fit"), _load(tmp_path / "fixed")
    assert sorted(fit_out) == sorted(fixed_out) == list(range(150))
    for key, value in fixed_out.items():
        np.testing.assert_allclose(fit_out[key], value, rtol=1e-5, atol=1e-6)
    summary = assert_conserved(fit_result)
    # Batches of each bucket hold at most its fitted size, and the search's compiles are
    # reported with the run's (every compile in the listed shape set).
    per_bucket = {}
    for _, x in elements:
        bucket = next(b for b in (32, 64, 128) if len(x) <= b)
        per_bucket[bucket] = per_bucket.get(bucket, 0) + 1
    assert summary.batches >= sum(math.ceil(n / fixed[(b,)]) for b, n in per_bucket.items())
    assert summary.out_of_memory == 0
    assert report.compiles <= summary.compiles <= len(Plan(SPEC, bucketing, num_devices=4).shapes())


def test_one_size_pads_every_batch_of_a_bucket_to_its_fitted_size():
    elements = _elements(40, seed=3)
    result = _run(
        elements,
        bucketing=bj.Bucketing(boundaries={"L": (32, 64, 128)}, batch_size=256),
        fit_to_memory=bj.FitToMemory(budget_bytes=1 << 20, one_size=True),
    )
    summary = assert_conserved(result)
    # The search analysed each bucket's sizes; the run added no shape of its own: every
    # batch was padded up to an analysed (fitted) size.
    report = fit_plan(
        attention,
        SPEC,
        bj.KernelOptions(
            bucketing=bj.Bucketing(boundaries={"L": (32, 64, 128)}, batch_size=256),
            load_params=attention_params,
            fit_to_memory=bj.FitToMemory(budget_bytes=1 << 20, one_size=True),
        ),
    )
    assert summary.compiles == report.compiles
    assert summary.padding_ratio > 1


def test_out_of_memory_after_a_fitted_choice_says_how_far_the_analysis_was_off():
    # The analysis sees a small program; running it, more than 4 rows "do not fit".
    rng = np.random.default_rng(8)
    elements = [(i, {"x": rng.random((3, 2), dtype=np.float32)}) for i in range(24)]
    p = pipeline()
    results, _ = (
        p
        | beam.Create(elements)
        | bj.RunKernel(
            rk.memory_hungry,
            spec={"x": bj.ArraySpec(("L", 2))},
            keyed=True,
            bucketing=bj.Bucketing(boundaries={"L": (4,)}, batch_size=8),
            fit_to_memory=bj.FitToMemory(budget_bytes=1 << 20),
            devices=[0],
        ).with_exception_handling()
    )
    assert_that(results | beam.Keys(), equal_to(list(range(24))))
    result = run(p)
    summary = assert_conserved(result)
    assert summary.out_of_memory >= 1 and summary.batch_limit_lowered == 1
    assert summary.fit_out_of_memory == summary.out_of_memory
    missed = result.metrics().query(MetricsFilter().with_name("fit_missed_by_pct"))
    dist = missed["distributions"][0]
    value = dist.committed if dist.committed is not None else dist.attempted
    assert value.count == summary.out_of_memory
    # The batch of 8 was analysed at a few KiB against a 1 MiB budget: off by >> 100x.
    assert summary.fit_missed_by_pct == value.min > 10_000


def test_plan_with_batch_limits_cuts_each_bucket_at_its_limit():
    plan = Plan(SPEC, bj.Bucketing(boundaries={"L": (8, 16)}, batch_size=8))
    cut = plan.with_batch_limits({(8,): 4, (16,): 2})
    assert cut.batch_sizes((8,)) == (1, 2, 4) and cut.batch_sizes((16,)) == (1, 2)
    one = plan.with_batch_limits({(8,): 4}, one_size=True)
    assert one.batch_sizes((8,)) == (4,) and one.padded_batch_size((8,), 1) == 4
    assert one.batch_sizes((16,)) == (8,) and plan.batch_sizes((8,)) == (1, 2, 4, 8)
    with pytest.raises(bj.SpecError, match=r"batch limit 3 of bucket \(8,\) is not one of"):
        plan.with_batch_limits({(8,): 3})


def test_packed_plan_with_batch_limits_cuts_each_row_length_as_plan_does():
    packing = bj.Packing(row_lengths=(8, 16), rows_per_batch={8: (2, 4, 8), 16: (1, 2)})
    plan = PackedPlan(bj.ArraySpec(("L",), np.int32), packing)
    cut = plan.with_batch_limits({(8,): 4})
    assert cut.batch_sizes((8,)) == (2, 4) and cut.batch_sizes((16,)) == (1, 2)
    assert cut.shapes() == [((8,), 2), ((8,), 4), ((16,), 1), ((16,), 2)]
    one = plan.with_batch_limits({(16,): 1}, one_size=True)
    assert one.batch_sizes((8,)) == (8,) and one.batch_sizes((16,)) == (1,)
    assert plan.batch_sizes((8,)) == (2, 4, 8)
    with pytest.raises(bj.SpecError, match=r"batch limit 3 of row length 8 is not one of"):
        plan.with_batch_limits({(8,): 3})


# --- packing: rows per batch fitted to memory ------------------------------------------------

PACKED_SPEC = {"x": bj.ArraySpec(("L", 4), np.float32), "w": bj.ArraySpec((), np.float32)}


def _packed_records(n, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            i,
            {
                "x": rng.standard_normal((int(rng.integers(1, 60)), 4)).astype(np.float32),
                "w": np.float32(rng.uniform(0.5, 2.0)),
            },
        )
        for i in range(n)
    ]


def _packed_options(rows_per_batch, fit=None):
    return bj.KernelOptions(
        packing=bj.Packing(row_lengths=(64, 128), rows_per_batch=rows_per_batch, max_segments=8),
        fit_to_memory=fit,
        devices=[0],
    )


def test_packed_rows_per_batch_shrink_with_the_row_length_squared_for_attention():
    report = fit_plan(
        pk.segment_attention, PACKED_SPEC, _packed_options(POWERS, bj.FitToMemory(2 << 20))
    )
    short, long = report.limits[(64,)], report.limits[(128,)]
    # Twice the row length, four times the [n, n, D] intermediate: a quarter of the rows.
    assert short == 4 * long, report.limits
    assert all(r.total <= report.budget for r in report.rows if r.size == r.limit)


def test_packed_run_with_fitted_rows_equals_the_unpacked_kernel():
    records = _packed_records(80, seed=5)
    fit = bj.FitToMemory(budget_bytes=2 << 20)
    report = fit_plan(pk.segment_attention, PACKED_SPEC, _packed_options(POWERS, fit))
    p = pipeline()
    created = p | beam.Create(records)
    packed, dead = (
        created
        | "Packed"
        >> bj.RunKernel(
            pk.segment_attention,
            spec=PACKED_SPEC,
            keyed=True,
            options=_packed_options(POWERS, fit),
        ).with_exception_handling()
    )
    bucketed = created | "Bucketed" >> bj.RunKernel(
        pk.bucketed_attention,
        spec=PACKED_SPEC,
        keyed=True,
        bucketing=bj.Bucketing(boundaries={"L": (16, 32, 64)}),
        devices=[0],
    )

    def close(pairs):
        got, want = dict(pairs["packed"]), dict(pairs["bucketed"])
        assert sorted(got) == sorted(want) == list(range(80))
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5)
        return True

    both = (
        (
            packed | "TagP" >> beam.Map(lambda kv: ("all", ("packed", kv))),
            bucketed | "TagB" >> beam.Map(lambda kv: ("all", ("bucketed", kv))),
        )
        | beam.Flatten()
        | beam.GroupByKey()  # one key: the two result sets side by side
        | beam.MapTuple(
            lambda _, tagged: close(
                {
                    "packed": [kv for t, kv in tagged if t == "packed"],
                    "bucketed": [kv for t, kv in tagged if t == "bucketed"],
                }
            )
        )
    )
    assert_that(both, equal_to([True]), label="Same")
    assert_that(dead, equal_to([]), label="NoDeadLetters")
    summary = assert_conserved(run(p))
    # No batch held more rows than its row length's fitted limit; the fit's compiles are
    # the run's (packing lists its shapes: rows per batch up to the limit, per row length).
    assert summary.out_of_memory == 0
    assert report.limits[(64,)] > report.limits[(128,)]
