"""Padded batches filled from record batches: reused buffers, ids and pad values (properties)."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_jax import ArraySpec, Bucketing, Validation
from beam_jax._src.arrow.decode import decode_batch
from beam_jax._src.arrow.fill import BucketFill
from beam_jax.internal import Plan

D = 3
WIDTH = 6
ID_TYPES = {
    "int64": pa.int64(),
    "int32": pa.int32(),
    "uint16": pa.uint16(),
    "float64": pa.float64(),
    "string": pa.string(),
}


def _plan(pad_value: float) -> Plan:
    spec = {"x": ArraySpec(("L", D), np.float32, pad_value=pad_value)}
    return Plan(spec, Bucketing(boundaries={"L": (WIDTH,)}, batch_size=8))


def _column(rows: list[np.ndarray], layout: str) -> pa.Array:
    """The rows as ``list<float32>`` (flat, row-major) or as raw ``binary`` float32 bytes."""
    if layout == "binary":
        return pa.array([r.tobytes() for r in rows], pa.binary())
    return pa.array([r.reshape(-1).tolist() for r in rows], pa.list_(pa.float32()))


def _ids(values: list[int], id_type: str, null_every: int) -> pa.Array:
    typ = ID_TYPES[id_type]
    out = [str(v) if id_type == "string" else v for v in values]
    if null_every:
        out = [None if i % null_every == 0 else v for i, v in enumerate(out)]
    return pa.array(out, typ)


def _decode(plan: Plan, batch: pa.RecordBatch):
    return decode_batch(
        batch,
        layout=plan.layout,
        columns=("x",),
        id_column="id",
        validation=Validation(),
        max_sizes={"L": WIDTH},
        truncate=False,
    )


# One round: a few record batches, each a list of row lengths; rows of each batch are added
# (a random subset, in order) until the fill is full, then the batch is checked and reset.
rounds_strategy = st.lists(
    st.lists(st.lists(st.integers(1, WIDTH), min_size=1, max_size=7), min_size=1, max_size=3),
    min_size=1,
    max_size=4,
)


@settings(max_examples=80, deadline=None)
@given(
    rounds=rounds_strategy,
    layout=st.sampled_from(["list", "binary"]),
    id_type=st.sampled_from(sorted(ID_TYPES)),
    null_every=st.sampled_from([0, 3]),
    pad_value=st.sampled_from([0.0, -1.5]),
    copy=st.sampled_from(["gather", "rows"]),
    malformed=st.booleans(),
    data=st.data(),
)
def test_a_reused_fill_holds_exactly_the_rows_added(
    rounds, layout, id_type, null_every, pad_value, copy, malformed, data
):
    """Whatever ran in the buffers before, a filled batch holds each added row's values,
    the pad value everywhere else, the rows' lengths and their ids (type kept): rows
    gathered whole or copied one by one, and rows that start mid-step in the values
    because a malformed row (not a whole number of steps) comes before them."""
    plan = _plan(pad_value)
    fill = BucketFill(plan, (WIDTH,), 8)
    fill.row_copy_values = 0 if copy == "rows" else 10**9
    rng = np.random.default_rng(len(rounds))
    next_id = 0
    for batches in rounds:
        expected_rows, expected_ids = [], []
        for lengths in batches:
            rows = [rng.standard_normal((n, D)).astype(np.float32) for n in lengths]
            if malformed:  # one value short of a step: the rows after it start mid-step
                rows.insert(0, rng.standard_normal(D - 1).astype(np.float32))
            ids = _ids(list(range(next_id, next_id + len(rows))), id_type, null_every)
            next_id += len(rows)
            decoded = _decode(plan, pa.record_batch({"id": ids, "x": _column(rows, layout)}))
            assert decoded.failed.tolist() == [True] * malformed + [False] * len(lengths)
            picked = data.draw(
                st.lists(
                    st.sampled_from(range(int(malformed), len(rows))),
                    unique=True,
                    max_size=fill.free,
                )
            )
            picked = np.asarray(sorted(picked), np.int64)
            if not len(picked):
                continue
            fill.add(decoded, picked)
            expected_rows += [rows[r] for r in picked]
            expected_ids += [ids[int(r)].as_py() for r in picked]
        if not expected_rows:
            continue
        batch = fill.padded()
        n = len(expected_rows)
        assert batch.num_real == n
        leaf = batch.leaves[0]
        want = np.full(leaf.shape, pad_value, np.float32)
        for i, row in enumerate(expected_rows):
            want[i, : len(row)] = row
        np.testing.assert_array_equal(leaf, want)
        assert batch.lengths["L"][:n].tolist() == [len(r) for r in expected_rows]
        assert (batch.lengths["L"][n:] == 0).all()
        id_column = fill.id_column()
        assert id_column.type == ID_TYPES[id_type]
        assert id_column.to_pylist() == expected_ids
        fill.reset()


def test_a_fill_mixing_numeric_and_null_id_batches_keeps_every_id():
    """Ids gathered with numpy (a numeric column without nulls) and with Arrow (one with
    nulls) join into one id column of the input's type."""
    plan = _plan(0.0)
    fill = BucketFill(plan, (WIDTH,), 8)
    rows = [np.ones((2, D), np.float32)] * 3
    plain = _decode(
        plan, pa.record_batch({"id": pa.array([1, 2, 3], pa.int32()), "x": _column(rows, "list")})
    )
    nulls = _decode(
        plan,
        pa.record_batch({"id": pa.array([None, 5, 6], pa.int32()), "x": _column(rows, "list")}),
    )
    assert plain.id_values() is not None and nulls.id_values() is None
    fill.add(plain, np.array([0, 2]))
    fill.add(nulls, np.array([0, 1]))
    fill.add(plain, np.array([1]))
    ids = fill.id_column()
    assert ids.type == pa.int32() and ids.to_pylist() == [1, 3, None, 5, 2]
    assert fill.id_column() is ids  # joined once
