"""Nothing lost: bad input, kernel faults, out of memory, worker crashes, fuzzed input."""

import json
import math
import os

import apache_beam as beam
import jax
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import beam_jax as bj
from beam_jax import ArraySpec, Bucketing, RunKernel, Validation
from beam_jax.testing import assert_conserved
from tests import kernels
from tests import reliability_kernels as rk
from tests.beam_helpers import pipeline, run

VOCAB, D = rk.VOCAB, rk.D


SPEC = {
    "ids": ArraySpec(("L",), np.int32, valid_range=(0, VOCAB)),
    "dense": {"x": ArraySpec(("L", D), np.float32), "scale": ArraySpec((), np.float32)},
}


def good(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "ids": rng.integers(0, VOCAB, n).astype(np.int32),
        "dense": {
            "x": rng.standard_normal((n, D)).astype(np.float32),
            "scale": np.float32(seed % 5 + 1),
        },
    }


def expected(element):
    table = rk.embed_params()["table"]
    ids = np.asarray(element["ids"]).astype(np.int64)
    x = np.asarray(element["dense"]["x"], np.float32)
    return {
        "embedding": table[ids].mean(0),
        "dense": x.sum(0) * np.float32(element["dense"]["scale"]),
    }


def with_(n, path, value):
    e = good(n)
    if len(path) == 1:
        e[path[0]] = value
    else:
        e[path[0]][path[1]] = value
    return e


def without(n, *path):
    e = good(n)
    (e if len(path) == 1 else e[path[0]]).pop(path[-1])
    return e


def _object_of_arrays():
    out = np.empty(2, dtype=object)
    out[0], out[1] = np.ones(D, np.float32), np.ones(D, np.float32)
    return out


def bad_inputs():
    """(key, element, substring the dead letter's message must contain)."""
    nan_x = good(3)
    nan_x["dense"]["x"][1, 1] = np.nan
    inf_x = good(3)
    inf_x["dense"]["x"][0, 0] = -np.inf
    lengths = good(3)
    lengths["ids"] = np.arange(4, dtype=np.int32)
    return [
        ("none", None, "received NoneType None"),
        ("object", object(), "expected a dict with keys ['dense', 'ids'], received object"),
        ("string", "hello", "received str 'hello'"),
        ("list", [1, 2], "received list"),
        ("missing_leaf", without(3, "dense"), "missing keys ['dense']"),
        ("extra_leaf", {**good(3), "mask": np.ones(3)}, "unexpected keys ['mask']"),
        ("nested_missing", without(3, "dense", "scale"), "at ['dense']: missing keys ['scale']"),
        (
            "nested_wrong_structure",
            with_(3, ["dense"], (np.ones((3, D)), np.float32(1))),
            "at ['dense']: expected a dict with keys ['scale', 'x'], received tuple",
        ),
        (
            "not_array",
            with_(3, ["ids"], [1, 2, 3]),
            "at ['ids']: expected an array of shape ('L',) and dtype int32, received list",
        ),
        (
            "string_dtype",
            with_(2, ["ids"], np.array(["a", "b"])),
            "dtype <U1 cannot be cast to int32",
        ),
        (
            "object_dtype",
            with_(2, ["ids"], np.array([1, "a"], dtype=object)),
            "dtype object cannot be cast to int32",
        ),
        (
            "object_of_arrays",
            with_(2, ["dense", "x"], _object_of_arrays()),
            "It is an object array (e.g. of arrays or Python objects)",
        ),
        (
            "masked_array",
            with_(
                2,
                ["dense", "x"],
                np.ma.masked_array(
                    [[1e6] * D, [1.0] * D], mask=[[True] * D, [False] * D], dtype=np.float32
                ),
            ),
            "numpy.ma.MaskedArray, with 4 masked entries whose mask would be dropped",
        ),
        (
            "matrix",
            with_(2, ["dense", "x"], np.matrix(np.ones((2, D), np.float32))),
            "numpy.matrix, which is always 2-D",
        ),
        (
            "record_array",
            with_(2, ["ids"], np.rec.fromarrays([np.arange(2), np.arange(2)], names="a,b")),
            "It is a structured (record) array with fields ['a', 'b']",
        ),
        ("float_ids", with_(3, ["ids"], np.ones(3)), "dtype float64 cannot be cast to int32"),
        (
            "ids_that_would_wrap",  # in range once wrapped: 2**32 + 5 is 5 as int32
            with_(3, ["ids"], np.array([1, 2**32 + 5, 2], np.int64)),
            "received the value 4294967301, outside int32's range",
        ),
        (
            "finite_values_that_would_overflow",
            with_(2, ["dense", "x"], np.full((2, D), 1e300)),
            "received the value 1e+300, outside float32's range",
        ),
        (
            "complex_x",
            with_(3, ["dense", "x"], np.ones((3, D), np.complex64)),
            "dtype complex64 cannot be cast to float32",
        ),
        (
            "wrong_rank",
            with_(3, ["dense", "x"], np.ones(3, np.float32)),
            "expected rank 2 (shape ('L', 4)), received rank 1 with shape (3,)",
        ),
        (
            "wrong_fixed_dim",
            with_(3, ["dense", "x"], np.ones((3, D + 1), np.float32)),
            "axis 1 must have size 4, received shape (3, 5)",
        ),
        (
            "scale_not_scalar",
            with_(3, ["dense", "scale"], np.ones(1, np.float32)),
            "expected rank 0 (shape ()), received rank 1 with shape (1,)",
        ),
        (
            "lengths_disagree",
            lengths,
            "ragged axis 'L' has length 3 at ['dense']['x'] axis 0 but 4 at ['ids'] axis 0",
        ),
        ("empty", good(0), "ragged axis 'L' has length 0"),
        (
            "too_long",
            good(17),
            "has length 17 at ['dense']['x'] axis 0, which exceeds the largest bucket (16)",
        ),
        ("nan_input", nan_x, "received NaN or Inf values"),
        ("inf_input", inf_x, "received NaN or Inf values"),
        (
            "id_out_of_range",
            with_(3, ["ids"], np.array([1, VOCAB, 2], np.int32)),
            f"values must lie in [0, {VOCAB}), received values from 1 to {VOCAB}",
        ),
        (
            "negative_id",
            with_(3, ["ids"], np.array([-1, 0, 2], np.int32)),
            "received values from -1 to 2",
        ),
        ("too_many_bytes", good(16), "element is 324 bytes, more than max_element_bytes=300"),
        (
            "huge_bad",
            with_(4, ["dense", "x"], np.zeros((4, 250_000), np.float32)),
            "axis 1 must have size 4",
        ),
    ]


def matrix_transform(**kw):
    return RunKernel(
        rk.embed_mean,
        spec=SPEC,
        bucketing=Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8),
        validation=Validation(nonfinite="reject", max_element_bytes=300),
        load_params=rk.embed_params,
        keyed=True,
        **kw,
    )


def close_to(expected_pairs):
    def check(actual):
        got = dict(actual)
        assert len(got) == len(actual) and sorted(got) == sorted(k for k, _ in expected_pairs)
        for key, want in expected_pairs:
            for name in want:
                np.testing.assert_allclose(
                    got[key][name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"{key} {name}"
                )

    return check


def test_bad_input_matrix_each_kind_gives_exactly_one_dead_letter():
    bad = bad_inputs()
    assert len(bad) >= 20
    valid = [(f"good{i}", good(n, seed=i)) for i, n in enumerate([1, 3, 5, 8, 9, 12, 2, 7])]
    big_endian = good(5, seed=40)
    big_endian["dense"]["x"] = big_endian["dense"]["x"].astype(">f4")
    big_endian["ids"] = big_endian["ids"].astype(">i8")
    strided = good(6, seed=41)
    strided["dense"]["x"] = np.asfortranarray(np.repeat(strided["dense"]["x"], 2, axis=1)[:, ::2])
    strided["ids"] = np.repeat(strided["ids"], 2)[::2]
    assert not strided["ids"].flags.c_contiguous or not strided["dense"]["x"].flags.c_contiguous
    valid += [("big_endian", big_endian), ("strided", strided)]
    # Interleave so bad elements share bundles and batches with good ones.
    elements = []
    for i in range(max(len(bad), len(valid))):
        if i < len(valid):
            elements.append(valid[i])
        if i < len(bad):
            elements.append(bad[i][:2])
    elements.append(({1, 2}, good(3)))  # a key that cannot be encoded deterministically
    elements.append("not a pair")

    p = pipeline()
    results, dead = p | beam.Create(elements) | matrix_transform().with_exception_handling()
    assert_that(results, close_to([(k, expected(v)) for k, v in valid]))
    messages = {k: m for k, _, m in bad}

    def check_dead(records):
        keys = [r.key for r in records if isinstance(r.key, str) and r.key in messages]
        assert sorted(keys) == sorted(messages), sorted(set(messages) ^ set(keys))
        for r in records:
            assert r.stage == "validation", r
            assert len(r.element) <= 1000 and len(r.to_json()) < 20_000
            if r.key in messages:
                assert messages[r.key] in r.message, (r.key, r.message)
        others = [r for r in records if r.key not in messages]
        assert len(others) == 2
        assert any("key of a keyed element must be a str" in r.message for r in others)
        assert any("keyed=True expects (key, value) pairs" in r.message for r in others)

    assert_that(dead, check_dead, label="Dead")
    summary = assert_conserved(run(p))
    assert summary.results == len(valid)
    assert summary.dead_letters == summary.dead_letters_by_stage["validation"] == len(bad) + 2


def test_truncate_instead_of_dead_letter():
    p = pipeline()
    long = good(20, seed=3)
    results = (
        p
        | beam.Create([("long", long)])
        | RunKernel(
            rk.embed_mean,
            spec=SPEC,
            load_params=rk.embed_params,
            keyed=True,
            bucketing=Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8, oversize="truncate"),
        )
    )
    cut = {
        "ids": long["ids"][:16],
        "dense": {"x": long["dense"]["x"][:16], "scale": long["dense"]["scale"]},
    }
    assert_that(results, close_to([("long", expected(cut))]))
    assert_conserved(run(p))


def test_bisection_isolates_failures_within_the_stated_bound():
    rng = np.random.default_rng(7)
    n, failing = 32, {3, 17, 30}
    elements = []
    for i in range(n):
        x = rng.standard_normal((4, kernels.D)).astype(np.float32)
        if i in failing:
            x[1, 2] = kernels.SENTINEL
        elements.append((i, {"x": x}))
    p = pipeline()
    results, dead = (
        p
        | beam.Create(elements)
        | RunKernel(
            kernels.failing_mean,
            spec={"x": ArraySpec(("L", kernels.D))},
            keyed=True,
            bucketing=Bucketing(boundaries={"L": (4,)}, batch_size=n),
            load_params=lambda: np.float32(1.0),
        ).with_exception_handling()
    )
    assert_that(results | beam.Keys(), equal_to(sorted(set(range(n)) - failing)))
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage)),
        equal_to([(i, "kernel") for i in failing]),
        label="Dead",
    )
    summary = assert_conserved(run(p))
    # One batch of n with k failing elements costs at most 1 + 2 k ceil(log2 n) calls.
    bound = 1 + 2 * len(failing) * math.ceil(math.log2(n))
    assert 1 + len(failing) < summary.kernel_calls <= bound, summary.kernel_calls


def test_non_finite_outputs_go_to_dead_letters_when_checked():
    elements = [(i, {"x": np.full((2, 1), v, np.float32)}) for i, v in enumerate([1, 0, 2, 0])]
    for check, want_dead in [(True, [1, 3]), (False, [])]:
        p = pipeline()
        results, dead = (
            p
            | beam.Create(elements)
            | RunKernel(
                rk.divide_by_value,
                spec={"x": ArraySpec(("L", 1))},
                keyed=True,
                bucketing=Bucketing(boundaries={"L": (4,)}),
                validation=Validation(check_outputs_finite=check),
            ).with_exception_handling()
        )
        assert_that(
            dead | beam.Map(lambda r: (r.key, r.stage)),
            equal_to([(k, "output") for k in want_dead]),
            label="Dead",
        )
        assert_that(results | beam.Keys(), equal_to([k for k in range(4) if k not in want_dead]))
        assert_conserved(run(p))


def test_out_of_memory_splits_lowers_the_batch_limit_and_isolates_a_poison_element():
    rng = np.random.default_rng(8)
    elements = [(i, {"x": rng.random((3, 2), dtype=np.float32)}) for i in range(40)]
    elements[21] = (21, {"x": np.full((3, 2), rk.POISON, np.float32)})
    p = pipeline()
    results, dead = (
        p
        | beam.Create(elements)
        | RunKernel(
            rk.memory_hungry,
            spec={"x": ArraySpec(("L", 2))},
            keyed=True,
            bucketing=Bucketing(boundaries={"L": (4,)}, batch_size=8),
            devices=[0],
        ).with_exception_handling()
    )
    assert_that(results | beam.Keys(), equal_to([i for i in range(40) if i != 21]))
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage, "RESOURCE_EXHAUSTED" in r.message)),
        equal_to([(21, "kernel", True)]),
        label="Dead",
    )
    summary = assert_conserved(run(p))
    # The first batch of 8 did not fit and both halves of 4 did: the limit dropped to 4 once,
    # and the poison element alone did not drag it lower.
    assert summary.batch_limit_lowered == 1
    # 1 for the first batch of 8, and at most 3 on the way down to the poison element (4, 2, 1)
    # per bundle it lands in; never one per later batch.
    assert 2 <= summary.out_of_memory <= 1 + 3 * 2, summary.out_of_memory


def test_worker_crash_fails_the_job_loudly_and_a_rerun_is_complete(tmp_path):
    marker = str(tmp_path / "crashed")
    rng = np.random.default_rng(9)
    elements = [(i, {"x": rng.random((2, 2), dtype=np.float32)}) for i in range(30)]
    elements[11] = (11, {"x": np.full((2, 2), rk.CRASH, np.float32)})
    out = tmp_path / "out.txt"

    def build():
        p = pipeline("--direct_running_mode=multi_processing", "--direct_num_workers=2")
        _ = (
            p
            | beam.Create(elements, reshuffle=True)
            | RunKernel(
                rk.Crasher(marker),
                spec={"x": ArraySpec(("L", 2))},
                keyed=True,
                bucketing=Bucketing(boundaries={"L": (2,)}, batch_size=4),
            )
            | beam.Map(lambda kv: str(kv[0]))
            | beam.io.WriteToText(str(out), shard_name_template="")
        )
        return p

    with pytest.raises(Exception):  # noqa: B017 - the runner's own error type varies
        run(build())
    assert os.path.exists(marker), "the crash never happened"
    assert not out.exists(), "a failed job must not leave a finished output behind"
    run(build())
    assert sorted(int(k) for k in out.read_text().split()) == list(range(30))


def test_parameters_load_only_from_formats_that_cannot_run_code(tmp_path):
    params = {"enc": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "b": np.ones(2)}
    for suffix in (".safetensors", ".npz"):
        path = str(tmp_path / "new" / "dir" / f"p{suffix}")  # missing directories are made
        bj.write_params(params, path)
        back = bj.read_params(path)
        np.testing.assert_array_equal(back["enc"]["w"], params["enc"]["w"])
        assert sorted(bj.read_params(path, sep=None)) == ["b", "enc.w"]
        bj.write_params({"step": np.int64(3), "lr": np.float32(0.5)}, path)
        scalars = bj.read_params(path)
        assert scalars["step"].shape == () and scalars["step"] == 3  # 0-d stays 0-d
        assert scalars["lr"].shape == () and scalars["lr"].dtype == np.float32
    evil = str(tmp_path / "evil.npz")
    np.savez(evil, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(bj.SpecError, match="pickled objects"):
        bj.read_params(evil)
    with pytest.raises(bj.SpecError, match="Pickle and other formats"):
        bj.read_params(str(tmp_path / "model.pkl"))
    with pytest.raises(bj.SpecError, match="without pickling"):
        bj.write_params({"x": np.array([object()])}, str(tmp_path / "bad.npz"))


def test_dead_letters_are_plain_json_with_bounded_echo():
    huge = "x" * 5_000_000

    class BrokenRepr:
        def __repr__(self):
            raise RuntimeError("no repr")

    record = bj.FailedElement.from_exception(
        ValueError("boom"), stage="validation", element={"text": huge}, key=huge
    )
    data = json.loads(record.to_json())
    assert set(data) == {"key", "element", "stage", "error_type", "message", "traceback",
                         "source", "row", "key_type"}  # fmt: skip
    assert bj.FailedElement.from_dict(data) == record
    assert len(record.to_json()) < 20_000
    odd = bj.FailedElement.from_exception(
        ValueError("x"), stage="kernel", element=BrokenRepr(), key=BrokenRepr()
    )
    assert "repr raised RuntimeError" in odd.element and "repr raised" in odd.key


# Random pytrees: arrays of random dtype, rank and shape (NaN, empty), wrong containers.
_arrays = hnp.arrays(
    dtype=st.sampled_from(
        [np.float32, np.float64, np.int32, np.int64, np.bool_, np.complex64, np.uint8, np.float16]
    ),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=20),
    elements=None,
)
_leaves = st.one_of(
    _arrays,
    st.none(),
    st.integers(),
    st.text(max_size=5),
    st.just(np.array(["a", "b"])),
    st.floats(),
)
_trees = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.dictionaries(
            st.sampled_from(["ids", "dense", "x", "scale", "zz"]), children, max_size=3
        ),
        st.lists(children, max_size=3),
    ),
    max_leaves=6,
)


@settings(max_examples=100, deadline=2000, suppress_health_check=list(HealthCheck))
@given(st.one_of(_trees, st.integers(1, 16).map(lambda n: good(n, n))))
def test_fuzzed_elements_validate_or_raise_an_invalid_element_error_never_another(element):
    """The check every element meets before a pipeline batches it: a random pytree is
    either accepted and pads, batches and unbatches back to itself, or rejected with an
    ``InvalidElementError`` (a dead letter), never any other exception."""
    from beam_jax.internal import Plan

    plan = Plan(
        SPEC,
        Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8),
        validation=Validation(nonfinite="reject", max_element_bytes=300),
    )
    try:
        item = plan.validate(element)
    except bj.InvalidElementError:
        return
    bucket = plan.bucket_for(item.lengths)
    assert all(n <= b for n, b in zip(item.lengths, bucket, strict=True))
    batch = plan.pad(bucket, [item])
    assert batch.num_real == 1
    for leaf, padded in zip(item.leaves, batch.leaves, strict=True):
        assert padded.dtype == leaf.dtype
        np.testing.assert_array_equal(padded[(0, *(slice(0, d) for d in leaf.shape))], leaf)
    assert [int(batch.lengths[name][0]) for name in plan.layout.axis_names] == list(item.lengths)


# Each fuzzed list is one pipeline run (about 2 s on 2 cores, most of it Beam's launch): a
# quarter of the profile's examples (25 in CI, 250 with HYPOTHESIS_PROFILE=deep), of up to
# 50 elements each, so every run mixes several batches of several buckets. Compiled
# programs come from a persistent cache after the first example (the same kernel and
# shapes every time), so an example costs its pipeline only.
PIPELINE_EXAMPLES = max(25, settings.default.max_examples // 4)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    from jax.experimental.compilation_cache import compilation_cache

    from beam_jax._src.kernel.cache import enable_compilation_cache

    saved = {
        name: getattr(jax.config, name)
        for name in (
            "jax_compilation_cache_dir",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
        )
    }
    enable_compilation_cache(str(tmp_path_factory.mktemp("jax_cache")))
    yield
    compilation_cache.reset_cache()  # JAX opens its cache once per process
    for name, value in saved.items():
        jax.config.update(name, value)


@pytest.mark.usefixtures("compile_cache")
@settings(max_examples=PIPELINE_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.one_of(_trees, st.integers(1, 16).map(lambda n: good(n, n))), min_size=1, max_size=50
    )
)
def test_fuzzed_elements_never_escape_and_are_conserved(elements):
    keyed = list(enumerate(elements))
    p = pipeline()
    results, dead = p | beam.Create(keyed) | matrix_transform().with_exception_handling()
    counts = (
        (results | "R" >> beam.Map(lambda _: "r"), dead | "D" >> beam.Map(lambda _: "d"))
        | beam.Flatten()
        | beam.combiners.Count.Globally()
    )
    assert_that(counts, equal_to([len(keyed)]))
    keys = ((results | beam.Keys()), (dead | beam.Map(lambda r: r.key))) | "K" >> beam.Flatten()
    assert_that(keys, equal_to(list(range(len(keyed)))), label="EachOnce")
    assert_conserved(run(p))


def test_a_long_error_text_keeps_its_last_line():
    # Errors raised in a JAX callback arrive as XLA text with the actual error last.
    frames = "".join(f'  File "/jax/_src/x{i}.py", line {i}, in f\n' for i in range(2000))
    text = (
        f"INTERNAL: CpuCallback error: Traceback (most recent call last):\n{frames}"
        "RuntimeError: RESOURCE_EXHAUSTED: Out of memory (the line users need)"
    )
    record = bj.FailedElement.from_exception(RuntimeError(text), stage="kernel", element=1)
    assert record.message.startswith("INTERNAL: CpuCallback error")
    assert record.message.endswith("RESOURCE_EXHAUSTED: Out of memory (the line users need)")
    assert len(record.message) <= 8100 and "chars cut" in record.message
