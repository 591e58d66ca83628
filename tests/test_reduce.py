"""ReduceKernel: full-dataset sums (a full-batch gradient) through real pipelines."""

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

import beam_jax as bj
from beam_jax import ArraySpec, Bucketing, ReduceKernel, Validation
from beam_jax.testing import assert_conserved
from tests import kernels
from tests.beam_helpers import pipeline, run

D = kernels.D
SPEC = {"x": ArraySpec(("L", D)), "y": ArraySpec(("L",))}


def examples(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(1, 30))
        out.append(
            {
                "x": rng.standard_normal((length, D)).astype(np.float32),
                "y": rng.standard_normal(length).astype(np.float32),
            }
        )
    return out


def reference(elements):
    w = kernels.regression_params()["w"].astype(np.float64)
    grad, loss = np.zeros(D), 0.0
    for e in elements:
        x, y = e["x"].astype(np.float64), e["y"].astype(np.float64)
        err = x @ w - y
        grad += 2 * x.T @ err
        loss += float(err @ err)
    return grad, loss


def reduce_transform(**kw):
    return ReduceKernel(
        kernels.squared_error_grad,
        spec=SPEC,
        bucketing=Bucketing(boundaries={"L": (8, 16, 32)}, batch_size=8),
        load_params=kernels.regression_params,
        **kw,
    )


def test_full_batch_gradient_equals_the_sum_over_every_element():
    elements = examples(200)
    want_grad, want_loss = reference(elements)
    p = pipeline()
    total = p | beam.Create(elements) | reduce_transform()

    def check(reductions):
        (r,) = reductions
        assert r.count == 200
        assert r.total["grad"]["w"].dtype == np.float32
        np.testing.assert_allclose(r.total["grad"]["w"], want_grad, rtol=1e-4)
        np.testing.assert_allclose(r.total["loss"], want_loss, rtol=1e-4)
        np.testing.assert_allclose(r.mean()["loss"], want_loss / 200, rtol=1e-4)

    assert_that(total, check)
    summary = assert_conserved(run(p))
    assert summary.results == 200
    # Memory stays bounded: 200 elements went through batches of at most 8.
    assert summary.batches >= 200 / 8


def test_bad_elements_are_left_out_of_the_sum_and_dead_lettered():
    good = examples(40, seed=1)
    nan = examples(1, seed=2)[0]
    nan["x"][0, 0] = np.nan
    bad = [
        ("bad_dim", {"x": np.ones((3, D + 1), np.float32), "y": np.ones(3, np.float32)}),
        ("nan", nan),
    ]
    keyed = [(f"g{i}", e) for i, e in enumerate(good)] + bad
    p = pipeline()
    total, dead = (
        p
        | beam.Create(keyed)
        | reduce_transform(
            keyed=True, validation=Validation(check_outputs_finite=True)
        ).with_exception_handling()
    )
    want_grad, _ = reference(good)

    def check(reductions):
        (r,) = reductions
        assert r.count == 40
        np.testing.assert_allclose(r.total["grad"]["w"], want_grad, rtol=1e-4)

    assert_that(total, check)
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage)),
        equal_to([("bad_dim", "validation"), ("nan", "output")]),
        label="Dead",
    )
    assert_conserved(run(p))


def test_one_reduction_per_window():
    elements = examples(60, seed=3)
    p = pipeline()
    totals = (
        p
        | beam.Create(list(enumerate(elements)))
        | beam.Map(lambda ie: window.TimestampedValue(ie[1], ie[0]))
        | beam.WindowInto(window.FixedWindows(20))
        | reduce_transform()
        | beam.Map(lambda r: (r.count, round(float(r.total["loss"]), 1)))
    )
    want = [(20, round(reference(elements[i : i + 20])[1], 1)) for i in (0, 20, 40)]
    assert_that(totals, equal_to(want))
    run(p)


def test_public_names_include_reductions():
    assert bj.ReduceKernel is ReduceKernel and bj.Reduction


def test_a_kernel_that_returns_none_is_summed_over_no_element():
    """A gradient function without its `return` gave Reduction(total=None, count=n), as if
    n elements had been summed."""
    keyed = [(f"g{i}", e) for i, e in enumerate(examples(5, seed=4))]
    p = pipeline()
    total, dead = (
        p
        | beam.Create(keyed)
        | ReduceKernel(
            lambda params, element, lengths: None,
            spec=SPEC,
            keyed=True,
            bucketing=Bucketing(boundaries={"L": (32,)}, batch_size=8),
        ).with_exception_handling()
    )
    assert_that(total | beam.Map(lambda r: (r.total, r.count)), equal_to([(None, 0)]))
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage, "holds no array" in r.message)),
        equal_to([(k, "output", True) for k, _ in keyed]),
        label="Dead",
    )
    assert_conserved(run(p))


def test_bfloat16_outputs_are_summed_in_float64():
    """bfloat16 partial sums were added in bfloat16: 5,000 ones summed to 2,048, where a
    further 8 rounds back to 2,048. Now the total is 5,000 rounded once to bfloat16."""
    import jax.numpy as jnp

    p = pipeline()
    total = (
        p
        | beam.Create([np.ones(3, np.float32)] * 5_000)
        | ReduceKernel(
            lambda params, element, lengths: element[0].astype(jnp.bfloat16),
            spec=ArraySpec(("L",)),
            bucketing=Bucketing(boundaries={"L": (4,)}, batch_size=8),
        )
    )
    want = float(np.asarray(5_000.0, jnp.bfloat16))  # 4,992: bfloat16's nearest
    assert_that(
        total | beam.Map(lambda r: (str(r.total.dtype), float(r.total))),
        equal_to([("bfloat16", want)]),
    )
    run(p)


@pytest.mark.parametrize("boundaries", [(8, 16), (1, 16)])
def test_outputs_whose_shape_follows_the_bucket_fail_the_job_saying_why(boundaries):
    """An output per padded position has one shape per bucket: numpy failed to add (8,) to
    (16,) without saying why, and added (1,) to (16,) by broadcasting, a wrong sum."""
    p = pipeline()
    _ = (
        p
        | beam.Create([np.ones(1, np.float32), np.ones(12, np.float32)])
        | ReduceKernel(
            lambda params, element, lengths: element,
            spec=ArraySpec(("L",)),
            bucketing=Bucketing(boundaries={"L": boundaries}, batch_size=4),
        )
    )
    with pytest.raises(Exception, match="ReduceKernel sums outputs of one shape"):
        run(p)
