"""Validation of single elements: every rejection says what was received and expected."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax import ArraySpec, Bucketing, Validation
from beam_jax.internal import Plan

SPEC = {"x": ArraySpec(("L", 3), np.float32), "ids": ArraySpec(("L",), np.int32)}


def plan(**kw):
    oversize = kw.pop("oversize", "dead_letter")
    return Plan(
        SPEC, Bucketing(boundaries={"L": (4, 8)}, oversize=oversize), validation=Validation(**kw)
    )


def good(n=3):
    return {"x": np.ones((n, 3), np.float32), "ids": np.arange(n, dtype=np.int32)}


INVALID = [
    ("not a dict", [1, 2], "expected a dict with keys \\['ids', 'x'\\], received list"),
    ("None", None, "received NoneType None"),
    ("missing leaf", {"x": np.ones((2, 3))}, "missing keys \\['ids'\\]"),
    ("extra leaf", {**good(), "y": np.ones(2)}, "unexpected keys \\['y'\\]"),
    (
        "not an array",
        {"x": [[1.0, 2.0, 3.0]], "ids": np.arange(1)},
        "at \\['x'\\]: expected an array of shape \\('L', 3\\) and dtype float32, received list",
    ),
    (
        "string dtype",
        {"x": np.array([["a", "b", "c"]]), "ids": np.arange(1)},
        "dtype <U1 cannot be cast to float32",
    ),
    (
        "complex dtype",
        {"x": np.ones((2, 3), np.complex64), "ids": np.arange(2)},
        "dtype complex64 cannot be cast to float32",
    ),
    (
        "wrong rank",
        {"x": np.ones((2, 3, 1)), "ids": np.arange(2)},
        "expected rank 2 \\(shape \\('L', 3\\)\\), received rank 3 with shape \\(2, 3, 1\\)",
    ),
    (
        "wrong fixed dim",
        {"x": np.ones((2, 4)), "ids": np.arange(2)},
        "axis 1 must have size 3, received shape \\(2, 4\\)",
    ),
    (
        "lengths disagree",
        {"x": np.ones((2, 3)), "ids": np.arange(5)},
        "ragged axis 'L' has length 5 at \\['ids'\\] axis 0 but 2 at \\['x'\\] axis 0",
    ),
    ("empty", good(0), "ragged axis 'L' has length 0 .* Validation\\(allow_empty=True\\)"),
    (
        "too long",
        good(9),
        "has length 9 .* exceeds the largest bucket \\(8\\); add a larger "
        "boundary or set Bucketing\\(oversize='truncate'\\)",
    ),
]


@pytest.mark.parametrize("name,element,message", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_elements_are_rejected_with_a_clear_message(name, element, message):
    with pytest.raises(bj.InvalidElementError, match=message):
        plan().validate(element)


def test_oversize_raises_the_specific_error_type():
    with pytest.raises(bj.ElementTooLargeError):
        plan().validate(good(9))


def test_truncate_cuts_every_leaf_sharing_the_axis():
    item = plan(oversize="truncate").validate(good(11))
    assert item.lengths == (8,)
    assert item.leaves[0].shape == (8,) and item.leaves[1].shape == (8, 3)


def test_casting_rules():
    item = plan().validate({"x": np.ones((2, 3), np.float64), "ids": np.arange(2)})
    assert item.leaves[1].dtype == np.float32  # leaves are in jax's sorted-key order
    with pytest.raises(bj.InvalidElementError, match="casting='safe'"):
        plan(casting="safe").validate({"x": np.ones((2, 3), np.float64), "ids": np.arange(2)})


def test_a_cast_that_would_wrap_or_overflow_is_refused_with_the_values():
    wide = {"x": np.ones((3, 3)), "ids": np.array([1, 2**32 + 5, 3], np.int64)}
    with pytest.raises(bj.InvalidElementError) as caught:
        plan().validate(wide)
    assert str(caught.value) == (
        "at ['ids']: received the value 4294967301, outside int32's range (-2147483648 to "
        "2147483647); a cast to int32 would wrap it around. Fix the data, or give the spec a "
        "wider dtype."
    )
    huge = {"x": np.array([[1.0, -1e300, 2.0]] * 2), "ids": np.arange(2)}
    with pytest.raises(bj.InvalidElementError, match="-1e.300, outside float32's .* infinite"):
        plan().validate(huge)  # finite, so not a nonfinite input: it would become one
    # Values that fit pass as before; infinities stay infinities.
    fits = plan().validate({"x": np.full((2, 3), np.inf), "ids": np.array([-5, 2**31 - 1])})
    assert fits.leaves[0].tolist() == [-5, 2**31 - 1]


@settings(deadline=None)
@given(
    values=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=6),
    want=st.sampled_from([np.int8, np.int16, np.int32, np.int64]),  # same_kind from int64
)
def test_a_validated_integer_is_the_value_given_or_the_element_is_refused(values, want):
    spec = {"ids": ArraySpec(("L",), want)}
    element = {"ids": np.array(values, np.int64)}
    try:
        got = Plan(spec, Bucketing(boundaries={"L": (8,)})).validate(element).leaves[0]
    except bj.InvalidElementError as e:
        info = np.iinfo(want)
        assert any(not info.min <= v <= info.max for v in values) and "range" in str(e)
    else:
        assert got.dtype == want and got.tolist() == values


def test_nonfinite_inputs_pass_or_are_rejected():
    bad = good()
    bad["x"][1, 2] = np.nan
    assert plan().validate(bad).lengths == (3,)
    with pytest.raises(bj.InvalidElementError, match="NaN or Inf"):
        plan(nonfinite="reject").validate(bad)


def test_big_endian_and_non_contiguous_arrays_are_accepted():
    x = np.arange(24, dtype=">f8").reshape(4, 6)[:, ::2]
    item = plan().validate({"x": x, "ids": np.arange(4, dtype=">i4")})
    assert item.leaves[1].dtype == np.dtype(np.float32)
    np.testing.assert_array_equal(item.leaves[1], x.astype(np.float32))


def test_byte_limit():
    with pytest.raises(bj.InvalidElementError, match="more than max_element_bytes=16"):
        plan(max_element_bytes=16).validate(good(3))


def test_jax_arrays_are_accepted():
    import jax.numpy as jnp

    item = plan().validate({"x": jnp.ones((2, 3)), "ids": jnp.arange(2)})
    assert item.lengths == (2,)


def test_array_likes_with_hidden_semantics_are_refused_by_name_or_honoured():
    # A masked array's mean would silently use the masked 1e6 values if its mask were dropped.
    masked = np.ma.masked_array([[1e6, 1e6, 1e6], [1.0, 2.0, 3.0]], mask=[[True] * 3, [False] * 3])
    with pytest.raises(bj.InvalidElementError, match="MaskedArray, with 3 masked entries"):
        plan().validate({"x": masked, "ids": np.arange(2)})
    # Nothing masked: plain data, honoured as such.
    unmasked = np.ma.masked_array(np.ones((2, 3)), mask=False)
    assert plan().validate({"x": unmasked, "ids": np.arange(2)}).lengths == (2,)
    with pytest.raises(bj.InvalidElementError, match="numpy.matrix, which is always 2-D"):
        plan().validate({"x": np.matrix(np.ones((2, 3))), "ids": np.arange(2)})
    record = np.zeros(2, dtype=[("a", np.int32), ("b", np.int32)])
    with pytest.raises(bj.InvalidElementError, match="structured \\(record\\) array with fields"):
        plan().validate({"x": np.ones((2, 3)), "ids": record})
    objects = np.empty(2, dtype=object)
    objects[:] = [np.ones(3), np.ones(3)]
    with pytest.raises(bj.InvalidElementError, match="object array \\(e.g. of arrays"):
        plan().validate({"x": objects, "ids": np.arange(2)})


def test_a_python_number_is_a_0_d_leaf():
    """A Python float for a 0-d leaf was refused ("pass numpy (or jax) arrays") where
    ``np.float64(2.0)`` passed; a number is a 0-d array, checked like any other."""
    spec = {"x": ArraySpec(("L",), np.float32), "w": ArraySpec((), np.float32)}
    scalar = Plan(spec, Bucketing(boundaries={"L": (4,)}))
    for w in (2.5, 3, np.float64(2.5), True):
        got = scalar.validate({"x": np.ones(2, np.float32), "w": w}).leaves
        assert got[0].dtype == np.float32 and got[0].shape == () and got[0] == np.float32(w)  # w, x
    with pytest.raises(bj.InvalidElementError, match="expected rank 1 .*received rank 0"):
        scalar.validate({"x": 1.0, "w": 2.0})
    ints = Plan({"n": ArraySpec((), np.int32)}, Bucketing(boundaries={}))
    with pytest.raises(bj.InvalidElementError, match="float64 cannot be cast to int32"):
        ints.validate({"n": 2.5})
    with pytest.raises(bj.InvalidElementError, match="received list"):
        scalar.validate({"x": [1.0, 2.0], "w": 2.0})
