"""RunKernel end to end through real Beam pipelines on the FnApiRunner."""

import collections

import apache_beam as beam
import jax.numpy as jnp
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from beam_jax import ArraySpec, Bucketing, RunKernel, Validation
from beam_jax.testing import CountingLoader, assert_conserved
from tests import kernels
from tests.beam_helpers import pipeline, run

D = kernels.D


def mean_spec():
    return {"x": ArraySpec(("L", D), np.float32)}


def mean_transform(**kw):
    return RunKernel(
        kernels.failing_mean,
        spec=mean_spec(),
        bucketing=Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8),
        load_params=lambda: np.float32(2.0),
        output_spec={"mean": ArraySpec((D,), None), "scaled": ArraySpec(("L", D), None)},
        keyed=True,
        **kw,
    )


def close_to(expected, rtol=1e-5):
    """A matcher for [(key, pytree-of-arrays)] in any order."""
    import jax

    def check(actual):
        got = dict(actual)
        assert len(got) == len(actual), "duplicate keys"
        assert sorted(got) == sorted(k for k, _ in expected), (sorted(got), expected)
        for key, want in expected:
            for g, w in zip(
                jax.tree_util.tree_leaves(got[key]), jax.tree_util.tree_leaves(want), strict=True
            ):
                assert g.shape == w.shape, (key, g.shape, w.shape)
                np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6, err_msg=str(key))

    return check


def make_mean_elements(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.standard_normal((int(rng.integers(1, 17)), D)).astype(np.float32)
        out.append((f"e{i}", {"x": x}))
    return out


def expected_mean(elements):
    return [(k, {"mean": v["x"].mean(0) * 2, "scaled": v["x"] * 2}) for k, v in elements]


def test_two_ragged_axes_keyed_and_cut_back():
    rng = np.random.default_rng(1)
    elements = []
    for i in range(30):
        h, w = (int(v) for v in rng.integers(1, 20, 2))
        elements.append(
            (i, {"image": rng.random((h, w, 3), dtype=np.float32), "bias": np.float32(i)})
        )
    expected = [
        (k, {"mean": v["image"].mean((0, 1)) + v["bias"], "scaled": v["image"] * 3})
        for k, v in elements
    ]
    p = pipeline()
    results = (
        p
        | beam.Create(elements)
        | RunKernel(
            kernels.image_stats,
            spec={"image": ArraySpec(("H", "W", 3)), "bias": ArraySpec(())},
            bucketing=Bucketing(boundaries={"H": (8, 20), "W": (4, 12, 20)}, batch_size=4),
            load_params=lambda: np.float32(3.0),
            output_spec={"mean": ArraySpec((3,), None), "scaled": ArraySpec(("H", "W", 3), None)},
            keyed=True,
        )
    )
    assert_that(results, close_to(expected))
    summary = assert_conserved(run(p))
    assert summary.results == 30 and summary.dead_letters == 0
    # 6 buckets x batch sizes {4} (rounded up to the 4 CPU devices): at most 6 shapes.
    assert 1 <= summary.compiles <= 6
    # Each bucket's elements in batches of 4 rows, padded to the bucket on both axes.
    counts = collections.Counter(
        (min(b for b in (8, 20) if b >= v["image"].shape[0]),
         min(b for b in (4, 12, 20) if b >= v["image"].shape[1]))
        for _, v in elements
    )  # fmt: skip
    padded = sum(-(-n // 4) * 4 * h * w for (h, w), n in counts.items())
    real = sum(v["image"].shape[0] * v["image"].shape[1] for _, v in elements)
    assert summary.padding_ratio == pytest.approx(padded / real)


def test_windows_and_timestamps_are_kept():
    elements = make_mean_elements(24, seed=2)
    p = pipeline()
    stamped = (
        p
        | beam.Create(list(enumerate(elements)))
        | beam.Map(lambda ie: window.TimestampedValue(ie[1], ie[0] * 10))
        | beam.WindowInto(window.FixedWindows(60))
    )
    results = stamped | mean_transform()

    def where(kv, ts=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam):
        return kv[0], int(w.start), int(ts)

    expected = [(k, (i * 10) // 60 * 60, i * 10) for i, (k, _) in enumerate(elements)]
    assert_that(results | beam.Map(where), equal_to(expected))
    # Grouping per window after RunKernel still works: each window's keys come together.
    counts = (
        results
        | beam.Map(lambda kv: ("all", 1))
        | beam.CombinePerKey(sum)
        | "Values" >> beam.Values()
    )
    assert_that(counts, equal_to([6, 6, 6, 6]), label="PerWindow")
    run(p)


def invalid_cases():
    good_x = np.ones((3, D), np.float32)
    return [
        ("none", None, "validation", "InvalidElementError"),
        ("wrong_dtype", {"x": np.array([["a"] * D])}, "validation", "InvalidElementError"),
        ("wrong_rank", {"x": np.ones((3, D, 1), np.float32)}, "validation", "InvalidElementError"),
        ("wrong_dim", {"x": np.ones((3, D + 1), np.float32)}, "validation", "InvalidElementError"),
        ("missing_leaf", {}, "validation", "InvalidElementError"),
        ("extra_leaf", {"x": good_x, "y": good_x}, "validation", "InvalidElementError"),
        ("not_array", {"x": "text"}, "validation", "InvalidElementError"),
        ("empty", {"x": np.ones((0, D), np.float32)}, "validation", "InvalidElementError"),
        ("too_long", {"x": np.ones((17, D), np.float32)}, "validation", "ElementTooLargeError"),
        (
            "raises_a",
            {"x": np.full((3, D), kernels.SENTINEL, np.float32)},
            "kernel",
            "JaxRuntimeError",
        ),
        (
            "raises_b",
            {"x": np.full((9, D), kernels.SENTINEL, np.float32)},
            "kernel",
            "JaxRuntimeError",
        ),
    ]


def test_valid_invalid_and_failing_elements_are_accounted_exactly():
    valid = make_mean_elements(40, seed=3)
    bad = invalid_cases()
    elements = valid[:20] + [(k, v) for k, v, _, _ in bad] + valid[20:]
    p = pipeline()
    results, dead = p | beam.Create(elements) | mean_transform().with_exception_handling()
    assert_that(results, close_to(expected_mean(valid)))
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage, r.error_type)),
        equal_to([(k, stage, etype) for k, _, stage, etype in bad]),
        label="DeadLetters",
    )

    def check_records(records):
        by_key = {r.key: r for r in records}
        assert "kernel refuses the value 13.0" in by_key["raises_a"].message
        assert "exceeds the largest bucket (16)" in by_key["too_long"].message
        assert "Traceback" in by_key["wrong_dim"].traceback
        for r in records:
            assert r.to_json()  # plain data, no pickling needed
            assert len(r.element) <= 1000

    assert_that(dead, check_records, label="Records")
    summary = assert_conserved(run(p))
    assert summary.results == 40
    assert summary.dead_letters_by_stage == {
        "validation": 9,
        "compile": 0,
        "kernel": 2,
        "output": 0,
    }


def test_without_exception_handling_a_bad_element_fails_the_pipeline():
    p = pipeline()
    _ = p | beam.Create([("bad", {"x": np.ones((2, D + 1), np.float32)})]) | mean_transform()
    with pytest.raises(Exception, match="axis 1 must have size 8"):
        run(p)


def test_threshold_fails_the_job_when_too_many_elements_fail():
    valid = make_mean_elements(10, seed=4)
    bad = [(f"b{i}", None) for i in range(5)]
    p = pipeline()
    _ = p | beam.Create(valid + bad) | mean_transform().with_exception_handling(threshold=0.2)
    with pytest.raises(Exception, match="5 of 15 elements failed"):
        run(p)
    p = pipeline()
    _ = p | beam.Create(valid + bad) | mean_transform().with_exception_handling(threshold=0.4)
    run(p)


def test_shape_that_fails_to_compile_dead_letters_only_its_bucket():
    def picky(params, element, lengths):
        if element["x"].shape[0] == 16:
            raise TypeError("this kernel cannot handle length-16 buckets")
        return element["x"].sum(0)

    elements = make_mean_elements(30, seed=5)
    p = pipeline()
    results, dead = (
        p
        | beam.Create(elements)
        | RunKernel(
            picky,
            spec=mean_spec(),
            keyed=True,
            bucketing=Bucketing(boundaries={"L": (8, 16)}, batch_size=4),
        ).with_exception_handling()
    )
    long_keys = [k for k, v in elements if v["x"].shape[0] > 8]
    assert_that(results | beam.Keys(), equal_to([k for k, _ in elements if k not in long_keys]))
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage, r.error_type)),
        equal_to([(k, "compile", "TypeError") for k in long_keys]),
        label="Dead",
    )
    assert_conserved(run(p))


def batch_masked_sum(params, element, lengths):
    """A kernel that takes a whole batch: ``x`` is ``[batch, L, D]``, ``lengths["L"]`` a vector."""
    x = element["x"]
    mask = jnp.arange(x.shape[1])[None, :] < lengths["L"][:, None]
    return jnp.where(mask[:, :, None], x, jnp.zeros((), x.dtype)).sum(1)


def test_a_batched_kernel_run_per_element_dead_letters_with_the_batched_hint():
    elements = make_mean_elements(6, seed=7)
    bucketing = Bucketing(boundaries={"L": 16})
    p = pipeline()
    results, dead = (
        p
        | "Create" >> beam.Create(elements)
        | "PerElement"
        >> RunKernel(
            batch_masked_sum, spec=mean_spec(), keyed=True, bucketing=bucketing
        ).with_exception_handling()
    )

    def check(records):
        assert sorted(r.key for r in records) == sorted(k for k, _ in elements)
        for r in records:
            assert r.stage == "compile", r
            assert "ONE element at a time under jax.vmap" in r.message, r.message
            assert r.message.endswith("if fn already takes a whole batch, pass batched=True.")

    assert_that(dead, check, label="Dead")
    assert_that(results, equal_to([]), label="NoResults")
    batched = (
        p
        | "Again" >> beam.Create(elements)
        | "Batched"
        >> RunKernel(
            batch_masked_sum, spec=mean_spec(), keyed=True, bucketing=bucketing, batched=True
        )
    )
    expected = [(k, v["x"].sum(0)) for k, v in elements]
    assert_that(batched, close_to(expected), label="Batched")
    run(p)


def test_parameters_load_once_per_process_and_multiprocess_results_match(tmp_path):
    elements = make_mean_elements(60, seed=6)
    outputs = {}
    for mode, args in {
        "in_process": [],
        "multi_process": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    }.items():
        loader = CountingLoader(str(tmp_path / mode), np.float32(2.0))
        out = tmp_path / f"{mode}.txt"
        p = pipeline(*args)
        _ = (
            p
            | beam.Create(elements, reshuffle=True)
            | RunKernel(
                kernels.failing_mean,
                spec=mean_spec(),
                load_params=loader,
                keyed=True,
                bucketing=Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8),
                output_spec={"mean": ArraySpec((D,), None), "scaled": ArraySpec(("L", D), None)},
            )
            | beam.Map(lambda kv: f"{kv[0]} {kv[1]['mean'].astype(np.float32).tobytes().hex()}")
            | beam.io.WriteToText(str(out), shard_name_template="")
        )
        run(p)
        outputs[mode] = sorted(out.read_text().splitlines())
        calls = loader.calls()
        assert calls, "the loader never ran"
        assert all(n == 1 for n in calls.values()), f"{mode}: loads per process {dict(calls)}"
    assert len(outputs["in_process"]) == 60
    assert outputs["in_process"] == outputs["multi_process"]


def test_unkeyed_and_batched_kernel():
    def batched_sum(params, element, lengths):
        return element["x"].sum(axis=(1, 2))

    values = [{"x": np.full((n, D), 1.0, np.float32)} for n in range(1, 17)]
    p = pipeline()
    results = (
        p
        | beam.Create(values)
        | RunKernel(
            batched_sum,
            spec=mean_spec(),
            batched=True,
            precompile=True,
            bucketing=Bucketing(boundaries={"L": (8, 16)}, batch_size=8),
            validation=Validation(check_outputs_finite=True),
        )
        | beam.Map(float)
    )
    assert_that(results, equal_to([float(n * D) for n in range(1, 17)]))
    summary = assert_conserved(run(p))
    # precompile compiled the whole listed set (2 buckets x sizes {4, 8}) and nothing else.
    assert summary.compiles == 4


@pytest.mark.parametrize("returned", [None, {}, ()], ids=["None", "empty-dict", "empty-tuple"])
def test_a_kernel_that_returns_no_array_dead_letters_each_element_saying_so(returned):
    """A kernel without its `return` gave None: the bundle failed on a zip of results."""
    elements = [(f"e{n}", {"x": np.ones((n, D), np.float32)}) for n in (3, 5, 12)]
    p = pipeline()
    results, dead = (
        p
        | beam.Create(elements)
        | RunKernel(
            lambda params, element, lengths: returned,
            spec=mean_spec(),
            keyed=True,
            bucketing=Bucketing(boundaries={"L": (8, 16)}, batch_size=4),
        ).with_exception_handling()
    )
    assert_that(results, equal_to([]), label="Results")
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage, "holds no array" in r.message)),
        equal_to([(k, "output", True) for k, _ in elements]),
        label="Dead",
    )
    assert_conserved(run(p))


def test_params_with_a_str_leaf_fail_naming_the_leaf_and_the_fix():
    """A setting kept in params (a str) failed with JAX's "Argument 'model' of type <class
    'str'> is not a valid JAX type", which names neither params nor where it was."""
    p = pipeline()
    _ = (
        p
        | beam.Create([{"x": np.ones((3, D), np.float32)}])
        | RunKernel(
            lambda params, element, lengths: element["x"].sum() * params["scale"],
            spec=mean_spec(),
            bucketing=Bucketing(boundaries={"L": (4,)}, batch_size=4),
            load_params=lambda: {"scale": np.float32(2.0), "config": {"name": "model"}},
        )
    )
    with pytest.raises(
        Exception, match=r"load_params returned a str at params\['config'\]\['name'\]"
    ):
        run(p)


def test_a_python_number_feeds_a_0_d_leaf_through_a_pipeline():
    """``{"x": array, "w": 2.0}``: the weight of a weighted sum given as a Python float."""

    def weighted_sum(params, element, lengths):
        real = jnp.arange(element["x"].shape[0]) < lengths["L"]
        return jnp.where(real, element["x"], 0.0).sum() * element["w"]

    spec = {"x": ArraySpec(("L",), np.float32), "w": ArraySpec((), np.float32)}
    p = pipeline()
    out = (
        p
        | beam.Create(
            [(0, {"x": np.ones(3, np.float32), "w": 2.0}), (1, {"x": np.ones(5), "w": 1})]
        )
        | RunKernel(weighted_sum, spec=spec, keyed=True, bucketing=Bucketing(boundaries={"L": 8}))
        | beam.MapTuple(lambda k, v: (k, float(v)))
    )
    assert_that(out, equal_to([(0, 6.0), (1, 5.0)]))
    run(p)
