"""Validating a batch at once gives exactly what validating each element gives."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_jax import ArraySpec, Bucketing, Validation
from beam_jax._src.core import batch_validation
from beam_jax.internal import Plan
from tests.test_validate import INVALID, SPEC, good


def _plan(spec=SPEC, oversize="dead_letter", **validation):
    return Plan(
        spec,
        Bucketing(boundaries={"L": (4, 8)}, oversize=oversize),
        validation=Validation(**validation),
    )


def _outcome(call):
    try:
        out = call()
    except Exception as e:  # noqa: BLE001 - compared as (type, message)
        return type(e), str(e)
    return out


def _assert_same(plan, elements):
    """``plan.validate_many(elements)`` is ``plan.validate`` of each: equal leaves (same
    dtype), equal lengths; the same error type and message for each rejected element."""
    many = plan.validate_many(elements)
    assert len(many) == len(elements)
    for element, got in zip(elements, many, strict=True):
        want = _outcome(lambda element=element: plan.validate(element))
        if isinstance(want, tuple):
            assert isinstance(got, Exception), (want, got)
            assert (type(got), str(got)) == want
            continue
        assert not isinstance(got, Exception), got
        assert got.lengths == want.lengths
        assert len(got.leaves) == len(want.leaves)
        for a, b in zip(got.leaves, want.leaves, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def _mixed_batch():
    return [
        good(3),
        *[element for _, element, _ in INVALID],
        good(1),
        {"x": np.ones((2, 3)), "ids": np.arange(2)},  # float64 and int64: cast
        {"x": np.ones((6, 3), ">f4"), "ids": np.arange(6, dtype=np.int32)},  # big-endian
        {"x": np.ones((3, 6), np.float32)[:, ::2], "ids": np.arange(3, dtype=np.int32)},
        {"x": jnp.ones((2, 3), jnp.float32), "ids": np.arange(2, dtype=np.int32)},
        {"x": np.full((2, 3), np.nan, np.float32), "ids": np.arange(2, dtype=np.int32)},
        {"x": np.ones((2, 3), np.float32), "ids": np.arange(2, dtype=np.int32) + 100},
        ({"x": np.ones((2, 3), np.float32)}, np.arange(2)),  # a tuple, not a dict
        {"x": np.ones((2, 3), np.float32), "ids": None},
        good(8),
    ]


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"oversize": "truncate"},
        {"allow_empty": True},
        {"max_element_bytes": 60},
        {"nonfinite": "reject"},
        {"casting": "no"},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default",
)
def test_a_mixed_batch_validates_as_each_element_alone(config):
    _assert_same(_plan(**config), _mixed_batch())


def test_specs_the_batch_checks_leave_to_each_element_validate_the_same():
    ranged = {"x": ArraySpec(("L", 3), np.float32), "ids": ArraySpec(("L",), np.int32, 0, (0, 10))}
    _assert_same(_plan(ranged), _mixed_batch())
    untyped = {"x": ArraySpec(("L", 3), None), "ids": ArraySpec(("L",), np.int32)}
    _assert_same(_plan(untyped), _mixed_batch())


def test_one_ragged_axis_twice_in_a_leaf_and_across_leaves():
    spec = {"a": ArraySpec(("L", "L"), np.float32), "b": ArraySpec((2, "L"), np.int32)}
    elements = [
        {"a": np.ones((3, 3), np.float32), "b": np.ones((2, 3), np.int32)},
        {"a": np.ones((3, 4), np.float32), "b": np.ones((2, 3), np.int32)},  # L 3 then 4
        {"a": np.ones((3, 3), np.float32), "b": np.ones((2, 2), np.int32)},  # across leaves
        {"a": np.ones((2, 2), np.float32), "b": np.ones((3, 2), np.int32)},  # fixed axis
        {"a": np.ones((0, 0), np.float32), "b": np.ones((2, 0), np.int32)},
    ]
    _assert_same(_plan(spec), elements)
    _assert_same(_plan(spec, allow_empty=True), elements)


def test_a_bare_array_spec_batch():
    plan = Plan(ArraySpec(("L",), np.float32), Bucketing(boundaries={"L": (4,)}))
    elements = [np.ones(2, np.float32), np.ones(5, np.float32), [1.0], np.ones((2, 1)), None]
    _assert_same(plan, elements)


def test_elements_that_pass_the_batch_checks_are_not_validated_one_by_one(monkeypatch):
    calls = []
    real = batch_validation.validate

    def counted(layout, element, **kw):
        calls.append(element)
        return real(layout, element, **kw)

    monkeypatch.setattr(batch_validation, "validate", counted)
    bad = {"x": np.ones((2, 4), np.float32), "ids": np.arange(2, dtype=np.int32)}
    elements = [good(n) for n in range(1, 9)] + [bad]
    out = _plan().validate_many(elements)
    assert [type(r).__name__ for r in out] == ["Validated"] * 8 + ["InvalidElementError"]
    assert calls == [bad]  # only the element the batch checks refused
    for o, e in zip(out[:8], elements, strict=False):  # the arrays as given, in spec order
        assert o.leaves[0] is e["ids"] and o.leaves[1] is e["x"]


def test_an_empty_batch():
    assert _plan().validate_many([]) == []


_LEAF = st.sampled_from(
    [
        lambda n: np.ones((n, 3), np.float32),
        lambda n: np.ones((n, 3), np.float64),
        lambda n: np.ones((n, 2), np.float32),
        lambda n: np.ones((n + 1, 3), np.float32),
        lambda n: np.ones(n, np.float32),
        lambda n: [[0.0] * 3] * n,
    ]
)
_IDS = st.sampled_from(
    [
        lambda n: np.arange(n, dtype=np.int32),
        lambda n: np.arange(n, dtype=np.int64),
        lambda n: np.arange(n + 2, dtype=np.int32),
        lambda n: np.arange(n, dtype=np.float32),
    ]
)


@st.composite
def _elements(draw):
    out = []
    for _ in range(draw(st.integers(0, 12))):
        n = draw(st.integers(0, 10))
        element = {"x": draw(_LEAF)(n), "ids": draw(_IDS)(n)}
        if draw(st.integers(0, 9)) == 0:
            element = draw(st.sampled_from([None, [element], {"x": element["x"]}]))
        out.append(element)
    return out


@settings(max_examples=60, deadline=None)
@given(
    _elements(),
    st.sampled_from(["dead_letter", "truncate"]),
    st.booleans(),
    st.sampled_from([None, 100]),
)
def test_random_batches_validate_as_each_element_alone(elements, oversize, empty, limit):
    plan = _plan(oversize=oversize, allow_empty=empty, max_element_bytes=limit)
    _assert_same(plan, elements)
