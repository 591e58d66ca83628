"""Bucketing and padding: pure numpy, no Beam."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax import ArraySpec, Bucketing
from beam_jax._src.bucketing.rule import default_batch_sizes
from beam_jax.internal import Plan


def test_default_boundaries_and_batch_sizes():
    assert bj.default_boundaries(512) == (16, 32, 64, 128, 256, 512)
    assert bj.default_boundaries(10) == (10,)
    assert default_batch_sizes(1) == (1,)
    assert default_batch_sizes(64) == (1, 2, 4, 8, 16, 32, 64)


def test_bucketing_rejects_bad_configuration():
    with pytest.raises(bj.SpecError, match="strictly increasing, got \\(8, 4\\)"):
        Bucketing(boundaries={"L": (8, 4)})
    with pytest.raises(bj.SpecError, match="positive int, got 0"):
        Bucketing(batch_size=0)
    with pytest.raises(bj.SpecError, match="oversize"):
        Bucketing(oversize="drop")
    with pytest.raises(bj.SpecError, match="no bucket boundaries"):
        Plan(ArraySpec(("L",)), Bucketing())
    with pytest.raises(bj.SpecError, match="no leaf of the spec uses"):
        Plan(ArraySpec(("L",)), Bucketing(boundaries={"L": 8, "T": 8}))
    with pytest.raises(bj.SpecError, match="ArraySpec.shape entries"):
        ArraySpec((-1, 3))
    with pytest.raises(bj.SpecError, match="numeric or bool"):
        ArraySpec((3,), np.str_)


def test_numpy_sizes_and_bare_one_axis_keys_give_the_python_bucketing():
    """Sizes computed with numpy (``int(lengths.max())`` left out) and ``{8: 4}`` for the
    bucket ``(8,)`` raised TypeErrors, or "batch_size must be a positive int, got 64"."""
    want = Bucketing(
        boundaries={"L": 64},
        batch_size={(16,): 4, (32,): 2, (64,): 1},
        batch_sizes={(16,): (2, 4), (32,): (2,), (64,): (1,)},
    )
    got = Bucketing(
        boundaries={"L": np.int64(64)},
        batch_size={16: np.int64(4), 32: 2, 64: 1},
        batch_sizes={16: (2, 4), 32: (2,), 64: (1,)},
    )
    assert got == want
    assert Bucketing(batch_size=np.int32(8)) == Bucketing(batch_size=8)
    assert Plan(ArraySpec(("L",)), got).shapes() == Plan(ArraySpec(("L",)), want).shapes()


def test_batch_sizes_all_above_batch_size_are_refused_not_used():
    """Bucketing(batch_size=8, batch_sizes=(16,)) planned batches of 16 rows."""
    with pytest.raises(
        bj.SpecError, match=r"batch_sizes are \(16,\), all larger than batch_size 8"
    ):
        Bucketing(boundaries={"L": (8, 16)}, batch_size=8, batch_sizes=(16,))
    with pytest.raises(bj.SpecError, match=r"for bucket \(16,\) are \(8,\).*raise batch_size to 8"):
        Bucketing(boundaries={"L": (8, 16)}, batch_size={8: 8, 16: 4}, batch_sizes=(8,))
    with pytest.raises(bj.SpecError, match=r"for bucket \(16,\) are \(16, 32\)"):
        Bucketing(boundaries={"L": (8, 16)}, batch_size=8, batch_sizes={8: (4,), 16: (16, 32)})
    # One list for every bucket, each bucket keeping the sizes up to its own batch_size.
    mixed = Bucketing(boundaries={"L": (8, 16)}, batch_size={8: 8, 16: 4}, batch_sizes=(4, 8))
    assert Plan(ArraySpec(("L",)), mixed).shapes() == [((8,), 4), ((8,), 8), ((16,), 4)]


@given(
    dtype=st.sampled_from([np.int8, np.uint8, np.int16, np.uint16, np.int32, np.bool_]),
    value=st.one_of(st.integers(-(2**40), 2**40), st.sampled_from([0.5, -1.5, np.nan])),
)
def test_an_integer_spec_pads_with_its_pad_value_or_refuses_it(dtype, value):
    """np.int64(-1) padded uint8 leaves with 255, 0.5 an int32 leaf with 0, 2 a bool leaf
    with True; a Python int out of range raised numpy's OverflowError."""
    try:
        spec = ArraySpec(("L",), dtype, pad_value=value)
    except bj.SpecError:
        return
    assert np.asarray(spec.pad_value).astype(dtype) == value


def test_a_float_pad_value_may_round_but_not_overflow():
    assert ArraySpec(("L",), np.float16, pad_value=0.1).pad_value == 0.1
    assert ArraySpec(("L",), np.float32, pad_value=-np.inf).pad_value == -np.inf
    with pytest.raises(bj.SpecError, match="cannot be represented as float16: it would pad"):
        ArraySpec(("L",), np.float16, pad_value=1e10)
    with pytest.raises(bj.SpecError, match="cannot be represented as uint8: it would pad"):
        ArraySpec(("L",), np.uint8, pad_value=np.int64(-1))


def test_smallest_bucket_that_fits_on_every_axis():
    plan = Plan(
        {"img": ArraySpec(("H", "W", 3))},
        Bucketing(boundaries={"H": (8, 16), "W": (4, 32)}, batch_size=4),
    )
    assert plan.buckets == ((8, 4), (8, 32), (16, 4), (16, 32))
    assert plan.bucket_for((8, 5)) == (8, 32)
    assert plan.bucket_for((9, 1)) == (16, 4)


def test_budget_gives_long_buckets_smaller_batches():
    plan = Plan(
        ArraySpec(("L", 4)),
        Bucketing(boundaries={"L": (16, 128, 512)}, batch_size=64, max_padded_size=4096),
    )
    assert plan.max_batch((16,)) == 64
    assert plan.max_batch((128,)) == 32
    assert plan.max_batch((512,)) == 8
    assert all(b * s <= 4096 for (b,), s in plan.shapes())


def test_a_budget_below_one_element_of_a_bucket_is_refused_not_exceeded():
    """max_padded_size=4 gave the bucket 8 batches of 1 row: 8 positions, over the budget."""
    bucketing = Bucketing(boundaries={"L": (2, 8)}, batch_size=4, max_padded_size=4)
    want = r"bucket \(8,\) pads each element to 8 positions, more than max_padded_size=4"
    with pytest.raises(bj.SpecError, match=want + ".*raise max_padded_size to at least 8"):
        Plan(ArraySpec(("L",)), bucketing)
    with pytest.raises(bj.SpecError, match=r"bucket \(8,\)"):
        bj.RunKernel(lambda p, x, lengths: x, spec=ArraySpec(("L",)), bucketing=bucketing)
    image = Bucketing(boundaries={"H": (4,), "W": (4,)}, max_padded_size=15)
    with pytest.raises(bj.SpecError, match=r"bucket \(4, 4\) pads each element to 16"):
        Plan(ArraySpec(("H", "W")), image)
    # One row fits: rounded up to the 4 devices, the smallest size still shards evenly.
    shared = Bucketing(boundaries={"L": (8,)}, batch_size=4, max_padded_size=8)
    assert Plan(ArraySpec(("L",)), shared, num_devices=4).batch_sizes((8,)) == (4,)


def test_per_bucket_batch_size_and_device_rounding():
    plan = Plan(
        ArraySpec(("L",)),
        Bucketing(boundaries={"L": (8, 16)}, batch_size={(8,): 10, (16,): 3}),
        num_devices=4,
    )
    assert plan.batch_sizes((8,)) == (4, 8, 12)
    assert plan.batch_sizes((16,)) == (4,)
    assert all(s % 4 == 0 for _, s in plan.shapes())


def test_shape_set_is_listed_before_the_job():
    plan = Plan(ArraySpec(("L", 2)), Bucketing(boundaries={"L": (4, 8)}, batch_size=4))
    assert plan.shapes() == [((4,), 1), ((4,), 2), ((4,), 4), ((8,), 1), ((8,), 2), ((8,), 4)]
    assert plan.leaf_shapes((8,), 2) == [((2, 8, 2), np.dtype(np.float32))]


@st.composite
def ragged_batches(draw):
    """A spec with 1-2 ragged axes over 1-3 leaves, plus a batch of elements for one bucket."""
    names = ["A", "B"][: draw(st.integers(1, 2))]
    bounds = {
        n: tuple(sorted(draw(st.sets(st.integers(1, 9), min_size=1, max_size=3)))) for n in names
    }
    leaves = {}
    for i in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.sampled_from([*names, 1, 2, 3]), min_size=0, max_size=3)))
        dtype = draw(st.sampled_from([np.float32, np.int32, np.bool_]))
        leaves[f"leaf{i}"] = ArraySpec(shape, dtype, pad_value=draw(st.sampled_from([0, 1])))
    used = {d for s in leaves.values() for d in s.shape if isinstance(d, str)}
    bucketing = Bucketing(
        boundaries={n: b for n, b in bounds.items() if n in used},
        batch_size=draw(st.integers(1, 5)),
    )
    plan = Plan(leaves, bucketing)
    bucket = draw(st.sampled_from(plan.buckets))
    sizes = dict(zip(plan.layout.axis_names, bucket, strict=True))
    elements = []
    for _ in range(draw(st.integers(1, plan.max_batch(bucket)))):
        lengths = {n: draw(st.integers(1, sizes[n])) for n in plan.layout.axis_names}
        el = {}
        for k, spec in leaves.items():
            shape = spec.resolve(lengths)
            el[k] = (
                np.asarray(
                    draw(
                        st.lists(
                            st.integers(-5, 5),
                            min_size=int(np.prod(shape)),
                            max_size=int(np.prod(shape)),
                        )
                    )
                )
                .reshape(shape)
                .astype(spec.dtype)
            )
        elements.append(el)
    return plan, elements


@settings(max_examples=150, deadline=2000)
@given(ragged_batches())
def test_pad_then_unpad_round_trips(case):
    plan, elements = case
    out_spec = {k: ArraySpec(s.shape, None) for k, s in plan.layout.tree.items()}
    plan = Plan(plan.layout, plan.bucketing, output_spec=out_spec)
    items = [plan.validate(e) for e in elements]
    buckets = {plan.bucket_for(it.lengths) for it in items}
    for bucket in buckets:
        idx = [i for i, it in enumerate(items) if plan.bucket_for(it.lengths) == bucket]
        group = [items[i] for i in idx]
        batch = plan.pad(bucket, group)
        # The padded shape is one of the listed shapes.
        assert (bucket, batch.size) in plan.shapes()
        assert batch.num_real == len(group) and batch.size >= len(group)
        for leaf, (shape, dtype) in zip(
            batch.leaves, plan.leaf_shapes(bucket, batch.size), strict=True
        ):
            assert leaf.shape == shape and leaf.dtype == dtype
        # The identity kernel's outputs, cut back, are the inputs.
        outputs = plan.layout.unflatten(batch.leaves)
        back = plan.unbatch(outputs, batch, group)
        for got, want in zip(back, [elements[i] for i in idx], strict=True):
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
                assert got[k].dtype == want[k].dtype


def test_padding_uses_each_leafs_pad_value_and_zero_lengths_on_padded_rows():
    plan = Plan(
        {"ids": ArraySpec(("L",), np.int32, pad_value=-1), "w": ArraySpec(("L",), np.float32)},
        Bucketing(boundaries={"L": (4,)}, batch_size=4),
    )
    items = [plan.validate({"ids": np.array([1, 2]), "w": np.ones(2, np.float32)})] * 3
    batch = plan.pad((4,), items)
    assert batch.size == 4
    np.testing.assert_array_equal(batch.leaves[0][0], [1, 2, -1, -1])
    np.testing.assert_array_equal(batch.leaves[0][3], [-1, -1, -1, -1])
    np.testing.assert_array_equal(batch.lengths["L"], [2, 2, 2, 0])
    assert batch.padded_volume == 16


def _fill_then_copy(shape, spec, values):
    """What ``pad_leaf`` must equal: the whole buffer filled, then each value copied in."""
    out = np.full(shape, spec.pad_value, spec.dtype)
    for i, value in enumerate(values):
        out[(i, *(slice(0, d) for d in value.shape))] = value
    return out


PAD_SPECS = [
    ArraySpec(("L", 3), np.float32),
    ArraySpec(("L",), np.int32, pad_value=-1),
    ArraySpec((2, "L", 3), np.float32, pad_value=0.5),
    ArraySpec((2, 3), np.float32, pad_value=7.0),
    ArraySpec(("L", "M"), np.int32, pad_value=-2),
]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(PAD_SPECS), st.integers(0, 6), st.integers(0, 3), st.data())
def test_pad_leaf_writes_values_and_pad_value_everywhere_else(spec, n, extra, data):
    from beam_jax._src.core.plan import pad_leaf

    bucket = {"L": 5, "M": 4}
    shape = (n + extra, *spec.resolve(bucket))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    values = []
    for _ in range(n):
        sizes = {k: data.draw(st.integers(0, v)) for k, v in bucket.items()}
        values.append((rng.integers(1, 100, spec.resolve(sizes))).astype(spec.dtype))
    out = pad_leaf(shape, spec, values)
    assert out.shape == shape and out.dtype == spec.dtype
    assert out.size == 0 or out.ctypes.data % 64 == 0  # XLA:CPU reads it in place
    np.testing.assert_array_equal(out, _fill_then_copy(shape, spec, values))


@pytest.mark.parametrize(
    "outputs",
    [
        np.arange(24, dtype=np.float32).reshape(4, 6),  # one leaf: a bare array each
        {"a": np.arange(24.0).reshape(4, 3, 2), "b": np.arange(8).reshape(4, 2)},
        {"a": np.arange(4.0), "b": np.arange(8).reshape(4, 2)},  # a 1-D leaf: 0-d rows
    ],
    ids=["array", "dict", "with-1d-leaf"],
)
def test_split_outputs_gives_each_chosen_row_in_the_outputs_structure(outputs):
    import jax

    plan = Plan(ArraySpec(("L",), np.float32), Bucketing(boundaries={"L": (4,)}, batch_size=4))
    items = [plan.validate(np.ones(n, np.float32)) for n in (1, 2, 3)]
    rows = [0, 2, 3]
    got = plan.split_outputs(plan.check_outputs(outputs, 4), rows, items)
    assert len(got) == len(rows)
    for row, result in zip(rows, got, strict=True):
        want = jax.tree_util.tree_map(lambda leaf, row=row: leaf[row, ...], outputs)
        assert jax.tree_util.tree_structure(result) == jax.tree_util.tree_structure(want)
        leaves = jax.tree_util.tree_leaves
        for a, b in zip(leaves(result), leaves(want), strict=True):
            assert type(a) is np.ndarray and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
