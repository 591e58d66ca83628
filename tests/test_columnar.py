"""The columnar path: Arrow record batches decoded, bucketed and padded without per-row work."""

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax import ArraySpec, ArrowColumns, Bucketing, Validation
from beam_jax._src.arrow.coder import ArrowCoder
from beam_jax._src.arrow.decode import decode_batch
from beam_jax._src.arrow.fill import BucketFill
from beam_jax._src.core.spec import Layout
from beam_jax.internal import Plan
from beam_jax.testing import assert_conserved
from tests import kernels
from tests.beam_helpers import run

D = kernels.D
SPEC = {"x": ArraySpec(("L", D), np.float32)}
OUTPUT_SPEC = {"mean": ArraySpec((D,), None), "scaled": ArraySpec(("L", D), None)}
BUCKETING = Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8)


def pipeline():
    return test_pipeline.TestPipeline(options=PipelineOptions(["--runner=FnApiRunner"]))


def records(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 17)), D)).astype(np.float32) for _ in range(n)]


def nested(rows):
    """``list<list<float32>>``, ``None`` for a null row."""
    return pa.array(
        [
            None if r is None else [[None if v is None else float(v) for v in s] for s in r]
            for r in rows
        ],
        pa.list_(pa.list_(pa.float32())),
    )


# id -> (x as nested lists, the dead-letter stage and error type it must produce)
BAD = {
    100: (None, "validation", "InvalidElementError"),  # null row
    101: ([[1.0] * D, [1.0] * (D - 1)], "validation", "InvalidElementError"),  # inner size
    102: ([[0.5] * D] * 20, "validation", "ElementTooLargeError"),  # longer than 16
    103: ([], "validation", "InvalidElementError"),  # empty
    104: ([[1.0] * (D - 1) + [None]], "validation", "InvalidElementError"),  # null value
    105: ([[kernels.SENTINEL] * D], "kernel", "JaxRuntimeError"),  # the kernel raises
}


def write_parquet(path, xs):
    ids = list(range(len(xs))) + list(BAD)
    column = pa.array(
        [[list(map(float, s)) for s in x] for x in xs] + [v[0] for v in BAD.values()],
        pa.list_(pa.list_(pa.float32())),
    )
    order = np.random.default_rng(1).permutation(len(ids))  # bad rows spread over batches
    table = pa.table({"id": pa.array(ids, pa.int64()), "x": column}).take(order)
    pq.write_table(table, path, row_group_size=9)


def _rows(batch: pa.RecordBatch):
    ids = batch.column("id").to_pylist()
    means = batch.column("mean").to_pylist()
    scaled = batch.column("scaled").to_pylist()
    return [(i, (m, s)) for i, m, s in zip(ids, means, scaled, strict=True)]


def _same(joined):
    key, (arrow, core) = joined
    assert len(arrow) == 1 and len(core) == 1, (key, arrow, core)
    (mean, scaled), out = arrow[0], core[0]
    np.testing.assert_allclose(mean, out["mean"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(scaled), out["scaled"], rtol=1e-6, atol=1e-6)
    return key


def test_matches_run_kernel_and_dead_letters_bad_rows(tmp_path):
    xs = records()
    path = str(tmp_path / "data.parquet")
    write_parquet(path, xs)
    p = pipeline()
    results, dead = (
        p
        | bj.ReadArrowBatches(path, max_rows=5)
        | bj.RunKernelOnArrow(
            kernels.failing_mean,
            spec=SPEC,
            columns=ArrowColumns(leaves={"x": "x"}, id="id"),
            bucketing=BUCKETING,
            load_params=lambda: np.float32(2.0),
            output_spec=OUTPUT_SPEC,
            metrics_namespace="arrow",
        ).with_exception_handling()
    )
    core, _ = (
        p
        | beam.Create([(i, {"x": x}) for i, x in enumerate(xs)])
        | bj.RunKernel(
            kernels.failing_mean,
            spec=SPEC,
            bucketing=BUCKETING,
            load_params=lambda: np.float32(2.0),
            output_spec=OUTPUT_SPEC,
            keyed=True,
        ).with_exception_handling()
    )
    joined = ({"arrow": results | beam.FlatMap(_rows), "core": core}) | beam.CoGroupByKey()
    matched = joined | beam.Map(lambda kv: _same((kv[0], (kv[1]["arrow"], kv[1]["core"]))))
    assert_that(matched, equal_to(list(range(len(xs)))), label="SameAsRunKernel")
    failures = dead | beam.Map(lambda f: (f.key, f.stage, f.error_type))
    expected = [(k, stage, error) for k, (_, stage, error) in BAD.items()]
    assert_that(failures, equal_to(expected), label="DeadLetters")
    result = p.run()
    result.wait_until_finish()
    summary = assert_conserved(result, namespace="arrow")
    assert summary.elements == len(xs) + len(BAD)
    assert summary.dead_letters == len(BAD)
    assert summary.dead_letters_by_stage["validation"] == 5
    assert summary.dead_letters_by_stage["kernel"] == 1
    assert summary.compiles <= len(BUCKETING.boundaries["L"]) * 4  # the listed shapes only
    assert summary.kernel_calls > summary.batches  # the failing row was bisected out


def _decode(batch, spec=SPEC, columns=("x",), validation=None, truncate=False, top=16):
    layout = Layout(spec)
    validation = validation or Validation()
    return decode_batch(
        batch,
        layout=layout,
        columns=columns,
        id_column="id" if "id" in batch.schema.names else None,
        validation=validation,
        max_sizes={n: top for n in layout.axis_names},
        truncate=truncate,
    )


def _fill(decoded, bucket=(16,), spec=SPEC):
    plan = Plan(spec, Bucketing(boundaries={"L": (bucket[0],)}, batch_size=8))
    fill = BucketFill(plan, bucket, 8)
    fill.add(decoded, np.flatnonzero(~decoded.failed))
    batch = fill.padded()
    return batch.leaves[0][: batch.num_real], batch.lengths["L"][: batch.num_real]


@pytest.mark.parametrize("layout", ["nested", "fixed", "flat", "binary", "large_flat"])
def test_every_layout_decodes_to_the_same_padded_batch(layout):
    xs = records(6)
    lens = np.array([len(x) for x in xs])
    values = np.concatenate(xs).reshape(-1)
    steps = np.concatenate([[0], np.cumsum(lens)])
    if layout == "nested":
        column = nested(xs)
    elif layout == "fixed":
        inner = pa.FixedSizeListArray.from_arrays(pa.array(values), D)
        column = pa.ListArray.from_arrays(pa.array(steps.astype(np.int32)), inner)
    elif layout == "flat":
        column = pa.ListArray.from_arrays(pa.array((steps * D).astype(np.int32)), values)
    elif layout == "large_flat":
        column = pa.LargeListArray.from_arrays(pa.array(steps * D), values)
    else:
        offsets = pa.py_buffer((steps * D * 4).astype(np.int32))
        column = pa.Array.from_buffers(pa.binary(), len(xs), [None, offsets, pa.py_buffer(values)])
    batch = pa.record_batch({"id": pa.array(range(6)), "x": column}).slice(1, 5)
    decoded = _decode(batch)
    assert not decoded.failed.any()
    padded, lengths = _fill(decoded)
    np.testing.assert_array_equal(lengths, lens[1:])
    for row, x in enumerate(xs[1:]):
        np.testing.assert_array_equal(padded[row, : len(x)], x)
        assert (padded[row, len(x) :] == 0).all()


def _messages(decoded):
    return {
        decoded.row_key(r): str(decoded.describe_failure(r)) for r in np.flatnonzero(decoded.failed)
    }


def test_invalid_rows_are_flagged_with_the_reason():
    good = [[0.0] * D] * 3
    rows = [good, None, [[0.0] * D, [0.0] * 3], [[0.0] * D] * 17, [], [[1.0] * (D - 1) + [None]]]
    batch = pa.record_batch({"id": pa.array(range(6)), "x": nested(rows)})
    messages = _messages(_decode(batch))
    assert sorted(messages) == [1, 2, 3, 4, 5]
    assert "is null" in messages[1]
    assert "wrong-sized list at nesting level 1" in messages[2]
    assert "exceeds the largest bucket (16)" in messages[3]
    assert "length 0" in messages[4]
    assert "null values" in messages[5]


def test_flat_and_binary_sizes_must_divide_and_values_be_checked():
    flat = pa.array([[0.0] * (2 * D), [0.0] * (D + 1), [np.nan] * D], pa.list_(pa.float32()))
    batch = pa.record_batch({"id": pa.array([7, 8, 9]), "x": flat})
    messages = _messages(_decode(batch, validation=Validation(nonfinite="reject")))
    assert sorted(messages) == [8, 9]
    assert "not a multiple of 8" in messages[8] and "NaN or Inf" in messages[9]
    raw = np.zeros(2 * D, np.float32).tobytes()
    binary = pa.array([raw, raw[:-3]], pa.binary())
    messages = _messages(_decode(pa.record_batch({"id": pa.array([1, 2]), "x": binary})))
    assert list(messages) == [2] and "multiple of 32 bytes" in messages[2]


def test_shared_axes_ranges_and_wrong_types():
    spec = {
        "ids": ArraySpec(("L",), np.int32, valid_range=(0, 10)),
        "mask": ArraySpec(("L",), np.int32),
    }
    batch = pa.record_batch(
        {
            "id": pa.array([0, 1, 2]),
            "ids": pa.array([[1, 2], [3, 11], [4]], pa.list_(pa.int32())),
            "mask": pa.array([[1, 1], [1, 1], [1, 1]], pa.list_(pa.int32())),
        }
    )
    messages = _messages(_decode(batch, spec=spec, columns=("ids", "mask")))
    assert sorted(messages) == [1, 2]
    assert "must lie in [0, 10)" in messages[1] and "shared" not in messages[1]
    assert "share its length" in messages[2]
    strings = pa.record_batch({"id": pa.array([0, 1]), "x": pa.array([["a"], ["b"]])})
    messages = _messages(_decode(strings))
    assert sorted(messages) == [0, 1] and "has type list<item: string>" in messages[0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 12), min_size=1, max_size=16), min_size=1, max_size=12))
def test_a_range_fails_exactly_the_rows_holding_a_value_outside_it(rows):
    """Any mix of rows in and out of ``valid_range``, all of them in it included: the rows
    failed are those with a value outside, each told so."""
    spec = {"ids": ArraySpec(("L",), np.int32, valid_range=(0, 10))}
    batch = pa.record_batch(
        {"id": pa.array(range(len(rows))), "ids": pa.array(rows, pa.list_(pa.int32()))}
    )
    messages = _messages(_decode(batch, spec=spec, columns=("ids",)))
    outside = [r for r, row in enumerate(rows) if any(not 0 <= v < 10 for v in row)]
    assert sorted(messages) == outside
    assert all("must lie in [0, 10)" in messages[r] for r in outside)


def test_truncate_keeps_the_first_steps():
    x = np.arange(20 * D, dtype=np.float32).reshape(20, D)
    batch = pa.record_batch({"id": pa.array([0]), "x": nested([x])})
    decoded = _decode(batch, truncate=True)
    assert not decoded.failed.any()
    padded, lengths = _fill(decoded)
    assert lengths.tolist() == [16]
    np.testing.assert_array_equal(padded[0], x[:16])


def test_reused_buffers_are_re_padded():
    plan = Plan(SPEC, Bucketing(boundaries={"L": (16,)}, batch_size=4))
    fill = BucketFill(plan, (16,), 4)
    long_rows = _decode(pa.record_batch({"id": pa.array(range(3)), "x": nested(records(3))}))
    fill.add(long_rows, np.arange(3))
    fill.reset()
    short = [np.ones((1, D), np.float32)]
    fill.add(_decode(pa.record_batch({"id": pa.array([9]), "x": nested(short)})), np.array([0]))
    batch = fill.padded()
    leaves, n, size = batch.leaves, batch.num_real, batch.size
    assert (n, size) == (1, 1)
    assert (leaves[0][0, 1:] == 0).all() and (leaves[0][0, 0] == 1).all()
    fill.reset()
    fill.add(long_rows, np.arange(2))
    fill.add(_decode(pa.record_batch({"id": pa.array([9]), "x": nested(short)})), np.array([0]))
    batch = fill.padded()
    leaves, lengths, n, size = batch.leaves, batch.lengths, batch.num_real, batch.size
    assert (n, size) == (3, 4)  # padded to the next allowed batch size: row 3 is all pad
    assert (leaves[0][3] == 0).all() and lengths["L"][3] == 0
    assert (leaves[0][2, 1:] == 0).all()


def test_arrow_coder_round_trips_and_estimates_without_encoding():
    coder = ArrowCoder()
    table = pa.table({"a": [1, 2, 3], "b": [[1.0], [], None]})
    batch = table.to_batches()[0]
    assert coder.decode(coder.encode(table)).equals(table)
    assert coder.decode(coder.encode(batch)).equals(batch)
    assert coder.estimate_size(table) == table.nbytes


def test_a_kernel_that_returns_none_dead_letters_its_rows():
    """A kernel without its `return` gave record batches of ids and no output column."""
    batch = pa.record_batch({"id": [7, 8], "x": nested([[[1.0] * D], [[2.0] * D] * 3])})
    p = pipeline()
    results, dead = (
        p
        | beam.Create([batch])
        | bj.RunKernelOnArrow(
            lambda params, element, lengths: None,
            spec=SPEC,
            columns=ArrowColumns(leaves={"x": "x"}, id="id"),
            bucketing=BUCKETING,
        ).with_exception_handling()
    )
    assert_that(results | beam.Map(lambda b: b.num_rows), equal_to([]), label="Results")
    assert_that(
        dead | beam.Map(lambda f: (f.key, f.stage, "holds no array" in f.message)),
        equal_to([(7, "output", True), (8, "output", True)]),
        label="Dead",
    )
    assert_conserved(run(p))


def test_configuration_errors_name_the_fix():
    with pytest.raises(bj.SpecError, match="ragged axis only as a leaf's first axis"):
        bj.RunKernelOnArrow(
            kernels.failing_mean, spec={"x": ArraySpec((D, "L"))}, bucketing=BUCKETING
        )
    with pytest.raises(bj.SpecError, match="names \\['y'\\]"):
        bj.RunKernelOnArrow(
            kernels.failing_mean,
            spec=SPEC,
            columns=ArrowColumns(leaves={"y": "x"}),
            bucketing=BUCKETING,
        )
    with pytest.raises(bj.SpecError, match="is not in the record batch"):
        _decode(pa.record_batch({"id": pa.array([0]), "y": pa.array([1.0])}))
