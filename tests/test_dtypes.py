"""bfloat16 (and JAX's other float types) as inputs: specs, casts, and every front end."""

import apache_beam as beam
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.ml.inference.base import RunInference
from apache_beam.testing.util import assert_that
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax import ArraySpec, ArrowColumns, Bucketing, Validation
from beam_jax.internal import Kernel, Plan
from tests.beam_helpers import pipeline, run

BF16 = np.dtype(jnp.bfloat16)
D = 4
SPEC = {"x": ArraySpec(("L", D), BF16)}
BUCKETING = Bucketing(boundaries={"L": (4, 8)}, batch_size=4)
OUTPUT_SPEC = {"sum": ArraySpec((D,), None), "scaled": ArraySpec(("L", D), None)}


def masked_sum(params, element, lengths):
    """The real positions' sum in float32, and the element times ``params`` in its dtype."""
    x = element["x"]
    mask = bj.length_mask(lengths["L"], x.shape[0])
    total = jnp.sum(jnp.where(mask[:, None], x.astype(jnp.float32), jnp.float32(0)), axis=0)
    return {"sum": total, "scaled": x * params.astype(x.dtype)}


def two():
    return np.float32(2.0)


def plan(dtype=BF16, **kw):
    spec = {"x": ArraySpec(("L",), dtype, valid_range=kw.pop("valid_range", None))}
    return Plan(spec, Bucketing(boundaries={"L": (8,)}), validation=Validation(**kw))


def records(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 9)), D)).astype(np.float32) for _ in range(n)]


def rounded_from_float32(xs, scaled_dtype=BF16):
    """A matcher of ``(key, {"sum", "scaled"})``: the float32 results of ``xs[key]``, the
    scaled element rounded to bfloat16 exactly, its sum within bfloat16's rounding."""

    def check(actual):
        assert sorted(k for k, _ in actual) == list(range(len(xs)))
        for key, out in actual:
            x = xs[key]
            assert np.asarray(out["scaled"]).dtype == scaled_dtype
            np.testing.assert_array_equal(
                np.asarray(out["scaled"], np.float32), (2 * x).astype(BF16).astype(np.float32)
            )
            tolerance = np.abs(x).sum(0) * 2.0**-8 + 1e-6
            assert (np.abs(np.asarray(out["sum"]) - x.astype(np.float64).sum(0)) <= tolerance).all()

    return check


def test_jax_float_types_are_spec_dtypes_with_pad_value_checks():
    assert ArraySpec(("L",), "bfloat16", pad_value=-np.inf).dtype == BF16  # as YAML names it
    assert ArraySpec(("L",), ml_dtypes.float8_e4m3fn, pad_value=0.1).pad_value == 0.1
    with pytest.raises(bj.SpecError, match="as bfloat16: it would pad with inf"):
        ArraySpec(("L",), jnp.bfloat16, pad_value=1e39)
    with pytest.raises(bj.SpecError, match="as float8_e4m3fn: it would pad with nan"):
        ArraySpec(("L",), ml_dtypes.float8_e4m3fn, pad_value=1e5)  # it has no infinity


@pytest.mark.parametrize(
    "dtype,received",
    [(np.str_, "<U0"), (object, "object"), (np.dtype([("a", np.float32)]), "\\[\\('a'")],
)
def test_a_dtype_that_is_not_numeric_is_refused_saying_what_was_received(dtype, received):
    with pytest.raises(bj.SpecError, match=f"must be numeric or bool .*, got {received}"):
        ArraySpec(("L",), dtype)


def test_bfloat16_casts_follow_numpy_s_float32_rules():
    x = np.array([1.0, 2.5, -3.0], BF16)
    assert plan().validate({"x": x}).leaves[0] is x  # untouched
    widened = plan(np.float32, casting="safe").validate({"x": x}).leaves[0]
    assert widened.dtype == np.float32 and widened.tolist() == [1.0, 2.5, -3.0]
    # float32 -> bfloat16 rounds under "same_kind", as float64 -> float32 does.
    narrowed = plan().validate({"x": np.array([1.01, 3.0], np.float32)}).leaves[0]
    assert narrowed.dtype == BF16 and narrowed.tolist() == [1.0078125, 3.0]
    with pytest.raises(bj.InvalidElementError, match="float32 cannot be cast to bfloat16 under"):
        plan(casting="safe").validate({"x": np.ones(2, np.float32)})
    with pytest.raises(bj.InvalidElementError, match="3.4e.38, outside bfloat16's range"):
        plan().validate({"x": np.array([1.0, 3.4e38], np.float32)})  # it would become inf
    with pytest.raises(bj.InvalidElementError, match="float8_e4m3fn would make it NaN"):
        plan(ml_dtypes.float8_e4m3fn).validate({"x": np.array([1.0, 1e5], np.float32)})
    refused = {
        "dtype complex64 cannot be cast to bfloat16": np.ones(2, np.complex64),
        "dtype <U1 cannot be cast to bfloat16": np.array(["a"]),
        "dtype bfloat16 cannot be cast to int32": x,
    }
    for message, value in refused.items():
        with pytest.raises(bj.InvalidElementError, match=message):
            plan(np.int32 if value is x else BF16).validate({"x": value})
    with pytest.raises(bj.InvalidElementError, match="NaN or Inf"):
        plan(nonfinite="reject").validate({"x": np.array([1.0, np.nan], BF16)})
    with pytest.raises(bj.InvalidElementError, match="values must lie in \\[0, 4\\)"):
        plan(valid_range=(0, 4)).validate({"x": np.array([1.0, 4.0], BF16)})


_KERNEL = []


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 8), min_size=1, max_size=6),
    pad=st.sampled_from([0.0, -1.5, 1e30]),
    seed=st.integers(0, 2**31 - 1),
)
def test_padding_never_changes_a_bfloat16_element_s_result(lengths, pad, seed):
    rng = np.random.default_rng(seed)
    spec = {"x": ArraySpec(("L", D), BF16, pad_value=pad)}
    if not _KERNEL:
        _KERNEL.append(Kernel(masked_sum))
    kernel = _KERNEL[0]
    p = Plan(spec, BUCKETING, num_devices=kernel.num_devices)
    elements = [{"x": rng.standard_normal((n, D)).astype(BF16)} for n in lengths]
    items = [p.validate(e) for e in elements]
    params = kernel.put_params(two())
    alone = jax.jit(masked_sum)
    for item, element in zip(items, elements, strict=True):
        batch = p.pad(p.bucket_for(item.lengths), [item])
        (got,) = p.unbatch(kernel.run(params, batch, p.layout.treedef), batch, [item])
        want = alone(two(), element, {"L": jnp.int32(len(element["x"]))})
        np.testing.assert_array_equal(got["scaled"][: len(element["x"])], want["scaled"])
        np.testing.assert_allclose(got["sum"], want["sum"], rtol=1e-6, atol=1e-6)


def test_run_kernel_takes_bfloat16_elements_and_specs():
    xs = records()
    given_as = [x.astype(BF16) if i % 2 else x for i, x in enumerate(xs)]  # both narrow right
    options = dict(bucketing=BUCKETING, load_params=two, output_spec=OUTPUT_SPEC, keyed=True)
    p = pipeline()
    elements = p | beam.Create([(i, {"x": x}) for i, x in enumerate(given_as)])
    bf16 = elements | "BF16" >> bj.RunKernel(masked_sum, spec=SPEC, **options)
    assert_that(bf16, rounded_from_float32(xs), label="BF16Spec")
    # bfloat16 elements for a float32 spec widen exactly: the float32 run of the rounded data.
    widened = (
        p
        | "Rounded" >> beam.Create([(i, {"x": x.astype(BF16)}) for i, x in enumerate(xs)])
        | "F32" >> bj.RunKernel(masked_sum, spec={"x": ArraySpec(("L", D), np.float32)}, **options)
    )
    assert_that(widened, rounded_from_float32(xs, np.float32), label="Float32Spec")
    run(p)


def test_run_kernel_on_arrow_decodes_float32_columns_and_bfloat16_bytes_into_bfloat16():
    xs = records(15, seed=1)
    nested = pa.array([x.tolist() for x in xs[:5]], pa.list_(pa.list_(pa.float32(), D)))
    flat = pa.array([x.reshape(-1) for x in xs[5:10]], pa.list_(pa.float32()))
    raw = pa.array([x.astype(BF16).tobytes() for x in xs[10:]], pa.binary())  # 2 bytes a value
    batches = [
        pa.record_batch({"id": pa.array(range(start, start + 5)), "x": column})
        for start, column in ((0, nested), (5, flat), (10, raw))
    ]
    p = pipeline()
    results = (
        p
        | beam.Create(batches)
        | bj.RunKernelOnArrow(
            masked_sum,
            spec=SPEC,
            columns=ArrowColumns(leaves={"x": "x"}, id="id"),
            bucketing=BUCKETING,
            load_params=two,
            output_spec=OUTPUT_SPEC,
        )
    )
    # Arrow has no bfloat16: the scaled rows come back as float32, holding bfloat16 values.
    assert_that(results | beam.FlatMap(_arrow_rows), rounded_from_float32(xs, np.float32))
    run(p)


def _arrow_rows(batch):
    ids, sums, scaled = (batch.column(n).to_pylist() for n in ("id", "sum", "scaled"))
    return [
        (i, {"sum": np.array(s, np.float32), "scaled": np.array(c, np.float32)})
        for i, s, c in zip(ids, sums, scaled, strict=True)
    ]


def test_raw_bytes_for_a_bfloat16_spec_are_2_bytes_a_value_or_the_row_fails():
    from tests.test_columnar import _decode

    good = np.arange(8, dtype=np.float32).reshape(2, D).astype(BF16)
    column = pa.array([good.tobytes(), good.astype(np.float32).tobytes()[:6]], pa.binary())
    decoded = _decode(pa.record_batch({"id": pa.array([0, 1]), "x": column}), spec=SPEC)
    assert decoded.failed.tolist() == [False, True]
    assert decoded.leaves[0].values.dtype == BF16
    assert decoded.leaves[0].values[:8].tolist() == good.reshape(-1).tolist()
    assert str(decoded.describe_failure(1)) == (
        "row 1 (id 1): column 'x' holds 6 bytes; as raw bfloat16 values of shape ('L', 4) it "
        "needs a multiple of 8 bytes."
    )


def test_jax_model_handler_takes_bfloat16_elements():
    xs = records(seed=2)
    handler = bj.KeyedJaxModelHandler(
        masked_sum, spec=SPEC, bucketing=BUCKETING, load_params=two, output_spec=OUTPUT_SPEC
    )
    p = pipeline()
    results = (
        p
        | beam.Create([(i, {"x": x.astype(BF16)}) for i, x in enumerate(xs)])
        | RunInference(handler)
        | beam.MapTuple(lambda key, result: (key, result.inference))
    )
    assert_that(results, rounded_from_float32(xs))
    run(p)
