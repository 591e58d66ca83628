"""Binary columns decoded as raw arrays: round trips for any dtype and shape, per-row faults."""

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
from beam_jax import ArraySpec, Bucketing, Validation
from beam_jax._src.arrow.decode import decode_batch
from beam_jax.internal import Plan

MAX_LEN = 5
DTYPES = ["int8", "uint16", "int32", "int64", "float16", "float32", "float64", "complex64"]


def _decode(column: pa.Array, spec: ArraySpec):
    ragged = bool(spec.shape) and isinstance(spec.shape[0], str)
    bounds = {"L": (MAX_LEN,)} if ragged else {}
    plan = Plan({"x": spec}, Bucketing(boundaries=bounds, batch_size=4))
    batch = pa.record_batch({"id": pa.array(range(len(column))), "x": column})
    return decode_batch(
        batch,
        layout=plan.layout,
        columns=("x",),
        id_column="id",
        validation=Validation(),
        max_sizes=plan.max_sizes,
        truncate=False,
    )


def _row(decoded, spec: ArraySpec, r: int) -> np.ndarray:
    """Row ``r`` cut back out of the decoded leaf, in the spec's shape."""
    leaf = decoded.leaves[0]
    if spec.shape and isinstance(spec.shape[0], str):
        shape = (int(decoded.lengths[r, 0]), *spec.shape[1:])
    else:
        shape = spec.shape
    size = int(np.prod(shape, dtype=np.int64))
    start = int(leaf.start[r])
    return leaf.values[start : start + size].reshape(shape)


# A row: ("ok", length along a ragged first axis), ("null",), or ("bad", bytes added or cut).
row_kinds = st.one_of(
    st.tuples(st.just("ok"), st.integers(1, MAX_LEN)),
    st.tuples(st.just("null")),
    st.tuples(st.just("bad"), st.integers(-3, 3).filter(bool)),
)


@settings(max_examples=100, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    ragged=st.booleans(),
    rest=st.lists(st.integers(1, 3), max_size=2),
    rows=st.lists(row_kinds, min_size=1, max_size=12),
    large=st.booleans(),
    offset=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_binary_rows_decode_to_their_arrays_and_only_wrong_rows_fail(
    dtype, ragged, rest, rows, large, offset, seed
):
    """Encode arrays as raw bytes (nulls and rows of the wrong byte length anywhere, in a
    sliced column), decode: every right row equals its array, every other row fails."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    shape = ("L", *rest) if ragged else tuple(rest)
    spec = ArraySpec(shape, dtype)
    arrays, cells = [], []
    for kind in [("ok", 1)] * offset + rows:
        steps = (kind[1],) if ragged and kind[0] == "ok" else (2,) if ragged else ()
        values = (rng.standard_normal((*steps, *rest)) * 100).astype(dtype)
        arrays.append(values if kind[0] == "ok" else None)
        raw = values.tobytes()
        if kind[0] == "null":
            cells.append(None)
        elif kind[0] == "bad" and ragged and len(raw) == 2:
            cells.append(b"")  # one-byte steps: only an empty row is wrong (axis of 0)
        elif kind[0] == "bad":
            # Ragged: a byte count that is no multiple of a step; fixed: any other count.
            step = len(raw) // 2 if ragged else len(raw) + 1
            cut = 1 + (abs(kind[1]) - 1) % (step - 1) if step > 1 else 1
            cells.append(raw + bytes(cut) if kind[1] > 0 else raw[:-cut])
        else:
            cells.append(raw)
    column = pa.array(cells, pa.large_binary() if large else pa.binary()).slice(offset)
    arrays = arrays[offset:]
    decoded = _decode(column, spec)
    want_failed = [a is None for a in arrays]
    assert decoded.failed.tolist() == want_failed
    for r, array in enumerate(arrays):
        if array is None:
            message = str(decoded.describe_failure(r))
            assert f"row {r} (id {r})" in message
            assert ("is null" in message) == (cells[r + offset] is None), message
            continue
        got = _row(decoded, spec, r)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, array)
        if ragged:
            assert decoded.lengths[r, 0] == len(array)


def test_a_short_row_fails_alone_and_says_how_many_bytes_it_needs():
    """A row 3 bytes short shifts every row after it off the float32 grid: they still
    decode (copied once into an aligned buffer), and only the short row fails."""
    rows = [np.arange(4 * k, dtype=np.float32).reshape(k, 4) for k in (1, 2, 3)]
    cells = [rows[0].tobytes()[:-3], rows[1].tobytes(), None, rows[2].tobytes()]
    spec = ArraySpec(("L", 4), np.float32)
    decoded = _decode(pa.array(cells, pa.binary()), spec)
    assert decoded.failed.tolist() == [True, False, True, False]
    assert "holds 13 bytes" in str(decoded.describe_failure(0))
    assert "a multiple of 16 bytes" in str(decoded.describe_failure(0))
    np.testing.assert_array_equal(_row(decoded, spec, 1), rows[1])
    np.testing.assert_array_equal(_row(decoded, spec, 3), rows[2])
    fixed = ArraySpec((2, 4), np.float32)
    decoded = _decode(pa.array([b"\x00" * 31, rows[1].tobytes()], pa.binary()), fixed)
    assert decoded.failed.tolist() == [True, False]
    assert "needs 32 bytes" in str(decoded.describe_failure(0))
    scalar = ArraySpec((), np.int64)
    decoded = _decode(pa.array([b"\x01" * 7, np.int64(5).tobytes()], pa.binary()), scalar)
    assert decoded.failed.tolist() == [True, False]
    assert "exactly 8 bytes" in str(decoded.describe_failure(0))
    assert _row(decoded, scalar, 1) == 5


def test_binary_rows_through_a_pipeline_dead_letter_only_the_wrong_rows(tmp_path):
    """End to end from a Parquet file: the short and null rows become dead letters naming
    their file rows, every other row's result is its own sum."""
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((int(rng.integers(1, 5)), 4)).astype(np.float32) for _ in range(9)]
    cells = [r.tobytes() for r in rows]
    cells[2] = cells[2][:-1]  # shifts rows 3..8 off the float32 grid
    cells[5] = None
    table = pa.table({"id": pa.array(range(100, 109)), "x": pa.array(cells, pa.binary())})
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=5)
    options = PipelineOptions(["--runner=FnApiRunner"])
    with test_pipeline.TestPipeline(options=options) as p:
        results, dead = (
            p
            | bj.ReadArrowBatches(str(tmp_path / "x.parquet"))
            | bj.RunKernelOnArrow(
                lambda params, element, lengths: element["x"].sum(),
                spec={"x": ArraySpec(("L", 4), np.float32)},
                columns=bj.ArrowColumns(id="id"),
                bucketing=Bucketing(boundaries={"L": (4,)}, batch_size=4),
            ).with_exception_handling()
        )
        sums = results | beam.FlatMap(
            lambda b: zip(b.column("id").to_pylist(), b.column("output").to_pylist(), strict=True)
        )
        want = {100 + i: float(r.sum()) for i, r in enumerate(rows) if i not in (2, 5)}
        assert_that(
            sums | beam.Map(lambda kv: (kv[0], round(kv[1], 3))),
            equal_to([(k, round(v, 3)) for k, v in want.items()]),
        )
        assert_that(
            dead | beam.Map(lambda d: (d.key, d.row, "bytes" in d.message or "null" in d.message)),
            equal_to([(102, 2, True), (105, 5, True)]),
            label="Dead",
        )


def test_a_value_a_cast_would_wrap_fails_its_row_alone_with_the_element_message():
    spec = ArraySpec(("L",), np.int32)
    column = pa.array([[1, 2], [3, -(2**40), 5], [6]], pa.list_(pa.int64()))
    decoded = _decode(column, spec)
    assert decoded.failed.tolist() == [False, True, False]
    plan = Plan({"x": spec}, Bucketing(boundaries={"L": (MAX_LEN,)}, batch_size=4))
    with pytest.raises(bj.InvalidElementError) as caught:
        plan.validate({"x": np.array([3, -(2**40), 5])})
    got = str(decoded.describe_failure(1)).replace("row 1 (id 1), column 'x'", "?")
    assert "-1099511627776, outside int32's range" in got
    assert got == str(caught.value).replace("at ['x']", "?")


def test_a_column_and_an_element_with_the_same_fault_get_the_same_message():
    """The Arrow decoder stays apart from ``validate`` (docs/architecture.md says why) but
    words each fault as it does: only where the fault is differs."""
    spec = ArraySpec(("L", 2), np.float32)
    plan = Plan({"x": spec}, Bucketing(boundaries={"L": (MAX_LEN,)}, batch_size=4))
    for rows in (MAX_LEN + 1, 0):  # longer than the largest bucket; empty
        element = {"x": np.ones((rows, 2), np.float32)}
        column = pa.array([np.ones(2 * rows, np.float32)], pa.list_(pa.float32()))
        decoded = _decode(column, spec)
        got = decoded.describe_failure(0)
        with pytest.raises(bj.InvalidElementError) as caught:
            plan.validate(element)
        want = caught.value
        assert type(got) is type(want)
        where_column, where_element = "row 0 (id 0), column 'x'", "['x'] axis 0"
        assert where_column in str(got) and where_element in str(want)
        assert str(got).replace(where_column, "?") == str(want).replace(where_element, "?")
