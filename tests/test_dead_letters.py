"""Dead letters: built in one module, keys that keep their type, and where a record came from."""

import json
import pathlib
import re

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from tests import kernels
from tests.beam_helpers import pipeline, run

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPEC = {"x": bj.ArraySpec(("L",), np.float32)}
BUCKETING = bj.Bucketing(boundaries={"L": (4,)}, batch_size=4)


def _refuse(x):
    if np.any(x == kernels.SENTINEL):
        raise ValueError(f"kernel refuses the value {kernels.SENTINEL}")
    return x


def failing_sum(params, element, lengths):
    """The sum of ``x``; raises at run time if ``x`` holds ``kernels.SENTINEL``."""
    shape = jax.ShapeDtypeStruct(element["x"].shape, element["x"].dtype)
    x = jax.pure_callback(_refuse, shape, element["x"], vmap_method="broadcast_all")
    return jnp.sum(x) * params


def test_failure_records_are_built_in_one_module():
    """Only core/dead_letter.py constructs a FailedElement or formats a traceback; every
    other site (engine, readers, handler, YAML rows, pipelines) calls its builders."""
    home = ROOT / "beam_jax" / "_src" / "core" / "dead_letter.py"
    construct = re.compile(r"FailedElement\s*\(")
    traceback = re.compile(r"format_exception\(")  # a record's traceback (beam_jax only)
    offenders = []
    for path in [*(ROOT / "beam_jax").rglob("*.py"), *(ROOT / "pipelines").rglob("*.py")]:
        if path == home:
            continue
        library = path.is_relative_to(ROOT / "beam_jax")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = construct.search(line) or (library and traceback.search(line))
            if found and not line.lstrip().startswith(("#", ">>>")):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_tuple_keys_keep_their_type_in_the_pipeline_and_back_from_json():
    elements = [(("doc", i), {"x": np.full(3, float(i), np.float32)}) for i in range(6)]
    elements[4] = (("doc", 4), {"x": np.full(3, kernels.SENTINEL, np.float32)})
    p = pipeline()
    results, dead = (
        p
        | beam.Create(elements)
        | bj.RunKernel(
            failing_sum,
            spec=SPEC,
            bucketing=BUCKETING,
            load_params=lambda: np.float32(1.0),
            keyed=True,
        ).with_exception_handling()
    )

    def check(records):
        assert [(r.key, r.key_type, r.stage, r.source, r.row) for r in records] == [
            (("doc", 4), None, "kernel", None, None)
        ]
        back = bj.FailedElement.from_dict(json.loads(records[0].to_json()))
        assert back == records[0] and isinstance(back.key, tuple)

    assert_that(dead, check, label="Dead")
    assert_that(results | beam.Keys(), equal_to([("doc", i) for i in (0, 1, 2, 3, 5)]))
    run(p)


def test_keys_json_cannot_hold_say_their_type():
    error = ValueError("boom")
    raw = bj.FailedElement.from_exception(error, stage="kernel", element=1, key=b"ab\xff")
    assert (raw.key, raw.key_type) == ("ab\\xff", "bytes")
    odd = bj.FailedElement.from_exception(error, stage="kernel", element=1, key=frozenset({1}))
    assert (odd.key, odd.key_type) == ("frozenset({1})", "frozenset")
    nested = bj.FailedElement.from_exception(
        error, stage="kernel", element=1, key=("a", (np.int64(2), None))
    )
    assert (nested.key, nested.key_type) == (("a", (2, None)), None)
    # JAX's float scalars are numbers as numpy's are (they were kept as their repr, "1.5").
    for dtype in (jnp.bfloat16, np.float16, jnp.float8_e4m3fn):
        scalar = np.array(1.5, dtype)[()]  # a numpy scalar, as an array's element is
        keyed = bj.FailedElement.from_exception(error, stage="kernel", element=1, key=scalar)
        assert (keyed.key, keyed.key_type) == (1.5, None), scalar.dtype
        assert bj.FailedElement.from_dict(json.loads(keyed.to_json())) == keyed
    with pytest.raises(ValueError, match="unknown field"):
        bj.FailedElement.from_dict({**raw.to_dict(), "file": "x"})


def test_arrow_dead_letters_name_their_file_and_row(tmp_path):
    """Validation (too long) and kernel failures alike carry the file and its row."""
    ids = list(range(10))
    xs = [[float(i)] * 3 for i in ids]
    xs[5] = [1.0] * 9  # longer than the largest boundary: a validation failure
    xs[7] = [kernels.SENTINEL] * 2  # the kernel raises on it
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": pa.array(ids), "x": pa.array(xs)}), path, row_group_size=4)
    p = pipeline()
    _, dead = (
        p
        | bj.ReadArrowBatches(str(path), columns=["id", "x"], max_rows=3)
        | bj.RunKernelOnArrow(
            failing_sum,
            spec=SPEC,
            columns=bj.ArrowColumns(id="id"),
            bucketing=BUCKETING,
            load_params=lambda: np.float32(1.0),
        ).with_exception_handling()
    )
    assert_that(
        dead | "Where" >> beam.Map(lambda r: (r.key, r.stage, r.source, r.row)),
        equal_to([(5, "validation", str(path), 5), (7, "kernel", str(path), 7)]),
    )
    run(p)


def _log(params, element, lengths):
    return jnp.log(element["x"][0]) * params


def test_a_nonfinite_output_mid_batch_is_dead_lettered_and_its_batch_mates_keep_their_own():
    """Row 1 of a batch of four gives NaN: keys 0, 2 and 3 get their own results (the kept
    rows are matched to their elements by position), key 1 is one dead letter."""
    values = [2.0, -1.0, 3.0, 5.0]
    p = pipeline()
    results, dead = (
        p
        | beam.Create([(i, {"x": np.full(2, v, np.float32)}) for i, v in enumerate(values)])
        | bj.RunKernel(
            _log,
            spec=SPEC,
            keyed=True,
            bucketing=BUCKETING,
            load_params=lambda: np.float32(1.0),
            validation=bj.Validation(check_outputs_finite=True),
        ).with_exception_handling()
    )
    got = results | beam.MapTuple(lambda k, v: (k, round(float(v), 5)))
    want = [(i, round(float(np.log(np.float32(v))), 5)) for i, v in enumerate(values) if v > 0]
    assert_that(got, equal_to(want), label="Results")
    stages = dead | beam.Map(lambda r: (r.key, r.stage))
    assert_that(stages, equal_to([(1, "output")]), label="Dead")
    run(p)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn])
def test_a_nonfinite_output_of_jax_s_own_float_types_is_caught_too(dtype):
    """bfloat16 and float8 outputs (numpy's kind "V") passed check_outputs_finite unchecked:
    a NaN came out as a result."""
    values = [2.0, -1.0, 3.0]
    p = pipeline()
    results, dead = (
        p
        | beam.Create([(i, {"x": np.full(2, v, np.float32)}) for i, v in enumerate(values)])
        | bj.RunKernel(
            lambda params, element, lengths: _log(params, element, lengths).astype(dtype),
            spec=SPEC,
            keyed=True,
            bucketing=BUCKETING,
            load_params=lambda: np.float32(1.0),
            validation=bj.Validation(check_outputs_finite=True),
        ).with_exception_handling()
    )
    assert_that(results | beam.Keys(), equal_to([0, 2]), label="Results")
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage)), equal_to([(1, "output")]), label="Dead"
    )
    run(p)
