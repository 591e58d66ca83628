"""JaxModelHandler under Beam's RunInference: same results as RunKernel, listed shapes only."""

from __future__ import annotations

import collections
import json
import pickle

import apache_beam as beam
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.ml.inference.base import RunInference
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax._src.inference.handler import _value_length
from tests.beam_helpers import pipeline, run
from tests.kernels import D, attention_params, masked_attention_pool, reference_attention_pool

SPEC = {"x": bj.ArraySpec(("L", D), np.float32)}
BUCKETING = bj.Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8)
TRACED: list[tuple[int, ...]] = []  # batch shapes the kernel was traced with, in this process


def recording_pool(params, element, lengths):
    """``masked_attention_pool`` over a batch, noting each batch shape it is compiled for."""
    TRACED.append(tuple(element["x"].shape))
    return jax.vmap(masked_attention_pool, in_axes=(None, 0, 0))(params, element, dict(lengths))


def _records(n: int = 40, seed: int = 3) -> list[tuple[int, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(i, rng.standard_normal((int(rng.integers(1, 17)), D)).astype(np.float32))
            for i in range(n)]  # fmt: skip


def _write_parquet(path, records) -> str:
    table = pa.table({
        "id": pa.array([i for i, _ in records], pa.int64()),
        "x": pa.array([x.reshape(-1) for _, x in records], pa.list_(pa.float32())),
    })  # fmt: skip
    pq.write_table(table, path)
    return str(path)


def _write_json_lines(path, records) -> str:
    path.write_text("".join(json.dumps({"id": i, "x": x.tolist()}) + "\n" for i, x in records))
    return str(path)


def _from_parquet_row(row: dict) -> tuple[int, dict]:
    return row["id"], {"x": np.asarray(row["x"], np.float32).reshape(-1, D)}


def _from_json_line(line: str) -> tuple[int, dict]:
    row = json.loads(line)
    return row["id"], {"x": np.asarray(row["x"], np.float32)}


def _read(p, tmp_path, records, fmt: str):
    if fmt == "parquet":
        path = _write_parquet(tmp_path / "data.parquet", records)
        return p | beam.io.ReadFromParquet(path) | beam.Map(_from_parquet_row)
    path = _write_json_lines(tmp_path / "data.jsonl", records)
    return p | beam.io.ReadFromText(path) | beam.Map(_from_json_line)


def _handler_kwargs():
    return dict(spec=SPEC, bucketing=BUCKETING, load_params=attention_params, batched=True)


def _key_of(x: np.ndarray) -> bytes:
    return np.asarray(x, np.float32).tobytes()


def _same_as_run_kernel(records):
    """A matcher of ``(key, {"handler": [v], "kernel": [v]})``: one result each, equal, and
    equal to the float64 numpy reference."""
    params = attention_params()
    expected = {i: reference_attention_pool(params, x) for i, x in records}

    def check(joined):
        assert sorted(k for k, _ in joined) == sorted(expected)
        for key, sides in joined:
            (handler,), (kernel,) = sides["handler"], sides["kernel"]
            np.testing.assert_allclose(handler, kernel, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(handler, expected[key], rtol=1e-4, atol=1e-5)

    return check


def _assert_only_listed_shapes(handler):
    listed = {(s, *b, D) for b, s in handler.plan(num_devices=len(jax.devices())).shapes()}
    assert TRACED, "the kernel never compiled"
    assert set(TRACED) <= listed, set(TRACED) - listed


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_keyed_handler_equals_run_kernel_and_compiles_only_listed_shapes(tmp_path, fmt):
    records = _records()
    handler = bj.KeyedJaxModelHandler(recording_pool, **_handler_kwargs())
    TRACED.clear()
    jax.clear_caches()  # trace again: an earlier test may have compiled these shapes
    p = pipeline()
    pairs = _read(p, tmp_path, records, fmt)
    inferred = (
        pairs
        | RunInference(handler)
        | "Unwrap" >> beam.MapTuple(lambda k, r: (k, np.asarray(r.inference)))
    )
    kernel = pairs | bj.RunKernel(recording_pool, keyed=True, **_handler_kwargs())
    joined = {"handler": inferred, "kernel": kernel} | beam.CoGroupByKey()
    assert_that(joined, _same_as_run_kernel(records))
    result = run(p)
    _assert_only_listed_shapes(handler)
    # RunInference's own metrics, under the handler's namespace, count every element.
    query = result.metrics().query(
        beam.metrics.MetricsFilter().with_namespace("BeamML_Jax").with_name("num_inferences")
    )
    assert sum(c.committed for c in query["counters"]) == len(records)


def test_unkeyed_handler_equals_run_kernel(tmp_path):
    records = _records(seed=5)
    handler = bj.JaxModelHandler(recording_pool, **_handler_kwargs())
    p = pipeline()
    pairs = _read(p, tmp_path, records, "parquet")
    by_bytes = {_key_of(x): i for i, x in records}
    inferred = (
        pairs
        | "Values" >> beam.Map(lambda kv: kv[1])
        | RunInference(handler)
        | "ById" >> beam.Map(lambda r: (by_bytes[_key_of(r.example["x"])], np.asarray(r.inference)))
    )
    kernel = pairs | bj.RunKernel(recording_pool, keyed=True, **_handler_kwargs())
    joined = {"handler": inferred, "kernel": kernel} | beam.CoGroupByKey()
    assert_that(joined, _same_as_run_kernel(records))
    run(p)


def test_a_bad_element_fails_its_batch_into_failed_inferences_naming_the_element():
    good = [{"x": np.ones((3, D), np.float32)} for _ in range(5)]
    bad = {"x": np.ones((3, D + 1), np.float32)}
    handler = bj.JaxModelHandler(
        masked_attention_pool, spec=SPEC, bucketing=BUCKETING, load_params=attention_params,
        max_batch_duration_secs=None,
    )  # fmt: skip
    p = pipeline()
    elements = p | beam.Create([*good, bad], reshuffle=False)
    main, other = elements | RunInference(handler).with_exception_handling()
    # Beam's dead-letter output keeps the exception as (type, repr, traceback lines).
    failures = other.failed_inferences | beam.MapTuple(
        lambda batch, error: (len(batch), error[0].__name__, "elements [5] failed" in error[1])
    )
    assert_that(failures, equal_to([(6, "InferenceBatchError", True)]), label="Failed")
    assert_that(main, equal_to([]), label="NoResults")
    run(p)


def test_batching_kwargs_give_beam_the_plans_buckets_and_a_fixed_batch_size():
    handler = bj.JaxModelHandler(masked_attention_pool, **_handler_kwargs())
    kwargs = handler.batch_elements_kwargs()
    # The length is the ragged axis's (buckets 4, 8, 16): Beam's lower-inclusive
    # boundaries 5, 9 group the lengths of each of the plan's buckets.
    assert kwargs["bucket_boundaries"] == [5, 9]
    assert kwargs["min_batch_size"] == kwargs["max_batch_size"] == 8
    assert kwargs["max_batch_duration_secs"] == 1.0
    length = kwargs["length_fn"]
    assert [length({"x": np.zeros((n, D), np.float32)}) for n in (1, 4, 5, 8, 9, 16)] == [
        1, 4, 5, 8, 9, 16,
    ]  # fmt: skip
    assert length("not an element") == 0  # rejected later, with a message
    keyed = bj.KeyedJaxModelHandler(masked_attention_pool, **_handler_kwargs())
    assert keyed.batch_elements_kwargs()["length_fn"]((1, {"x": np.zeros((7, D))})) == 7
    own = bj.JaxModelHandler(masked_attention_pool, batch_length_fn=len, **_handler_kwargs())
    # A user's length over the one ragged axis keeps the plan's boundaries, in Beam's terms.
    assert own.batch_elements_kwargs()["bucket_boundaries"] == [5, 9]
    assert _value_length(len, None) == 0


def test_one_bucket_or_no_stateful_batching_gives_beam_no_length_buckets():
    one = bj.JaxModelHandler(
        masked_attention_pool, spec=SPEC, bucketing=bj.Bucketing(boundaries={"L": (16,)})
    )
    assert "length_fn" not in one.batch_elements_kwargs()
    plain = bj.JaxModelHandler(masked_attention_pool, **_handler_kwargs(),
                               max_batch_duration_secs=None)  # fmt: skip
    assert "length_fn" not in plain.batch_elements_kwargs()
    assert "max_batch_duration_secs" not in plain.batch_elements_kwargs()


def test_params_path_is_read_once_per_load_and_update_model_path_replaces_it(tmp_path):
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    bj.write_params(attention_params(0), str(first))
    bj.write_params(attention_params(1), str(second))
    handler = bj.JaxModelHandler(masked_attention_pool, spec=SPEC, bucketing=BUCKETING,
                                 params_path=str(first))  # fmt: skip
    x = {"x": np.ones((3, D), np.float32)}
    (before,) = handler.run_inference([x], handler.load_model())
    handler.update_model_path(str(second))
    (after,) = handler.run_inference([x], handler.load_model())
    assert before.model_id == str(first) and after.model_id == str(second)
    np.testing.assert_allclose(
        after.inference, reference_attention_pool(attention_params(1), x["x"]), rtol=1e-4
    )
    assert not np.allclose(before.inference, after.inference)


def test_configuration_errors_say_what_to_do():
    with pytest.raises(bj.SpecError, match="params_path or load_params"):
        bj.JaxModelHandler(masked_attention_pool, params_path="p.npz", **_handler_kwargs())
    handler = bj.JaxModelHandler(masked_attention_pool, **_handler_kwargs())
    with pytest.raises(bj.SpecError, match="give params_path"):
        handler.update_model_path("other.npz")
    with pytest.raises(bj.SpecError, match="min_batch_size must be within"):
        bj.JaxModelHandler(masked_attention_pool, min_batch_size=9, **_handler_kwargs())
    with pytest.raises(bj.SpecError, match="no bucket boundaries"):
        bj.JaxModelHandler(masked_attention_pool, spec=SPEC, bucketing=bj.Bucketing())


def test_the_batch_error_survives_pickling_with_its_failures():
    handler = bj.JaxModelHandler(masked_attention_pool, **_handler_kwargs())
    with pytest.raises(bj.InferenceBatchError) as info:
        handler.run_inference(
            [{"x": np.ones((2, D), np.float32)}, {"x": np.ones((40, D), np.float32)}],
            handler.load_model(),
        )
    error = pickle.loads(pickle.dumps(info.value))
    assert str(error) == str(info.value) and "element 1" in str(error)
    assert [(f.key, f.stage, f.error_type) for f in error.failures] == [
        (1, "validation", "ElementTooLargeError")
    ]
    assert isinstance(error, RuntimeError) and error.batch_size == 2


def test_a_kernel_failure_is_bisected_down_to_its_element():
    from tests.kernels import SENTINEL, failing_mean

    handler = bj.JaxModelHandler(
        failing_mean, spec=SPEC, bucketing=BUCKETING, load_params=lambda: np.float32(2.0)
    )
    batch = [{"x": np.full((3, D), i, np.float32)} for i in range(6)]
    model = handler.load_model()
    ok = handler.run_inference(batch, model)
    np.testing.assert_allclose([r.inference["mean"][0] for r in ok], [2.0 * i for i in range(6)])
    batch[4] = {"x": np.full((3, D), SENTINEL, np.float32)}
    with pytest.raises(bj.InferenceBatchError, match=r"elements \[4\] failed") as info:
        handler.run_inference(batch, model)
    assert [(f.key, f.stage) for f in info.value.failures] == [(4, "kernel")]


def test_runinference_model_updates_through_a_side_input_reload_the_parameters(tmp_path):
    from apache_beam.ml.inference.base import ModelMetadata

    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    bj.write_params(attention_params(0), str(first))
    bj.write_params(attention_params(1), str(second))
    handler = bj.JaxModelHandler(masked_attention_pool, spec=SPEC, bucketing=BUCKETING,
                                 params_path=str(first))  # fmt: skip
    x = np.arange(3 * D, dtype=np.float32).reshape(3, D) / 10
    expected = reference_attention_pool(attention_params(1), x)
    p = pipeline()
    update = p | "Model" >> beam.Create([ModelMetadata(model_id=str(second), model_name="v2")])
    results = (
        p
        | "Elements" >> beam.Create([{"x": x}])
        | RunInference(handler, model_metadata_pcoll=update)
        | beam.Map(lambda r: (r.model_id, np.allclose(r.inference, expected, rtol=1e-4)))
    )
    assert_that(results, equal_to([(str(second), True)]))
    run(p)


def test_parameters_load_once_per_process_across_batches(tmp_path):
    from beam_jax.testing import CountingLoader

    loader = CountingLoader(str(tmp_path / "loads"), attention_params())
    handler = bj.KeyedJaxModelHandler(
        masked_attention_pool, spec=SPEC, bucketing=BUCKETING, load_params=loader
    )
    records = _records(n=48)
    p = pipeline()
    count = (
        p
        | beam.Create([(i, {"x": x}) for i, x in records])
        | RunInference(handler)
        | beam.combiners.Count.Globally()
    )
    assert_that(count, equal_to([48]))
    result = run(p)
    assert list(loader.calls().values()) == [1]
    query = result.metrics().query(
        beam.metrics.MetricsFilter()
        .with_namespace("BeamML_Jax")
        .with_name("inference_request_batch_size")
    )
    (batch_sizes,) = [d.committed for d in query["distributions"]]
    assert batch_sizes.count >= 6 and batch_sizes.max <= 8  # many batches, one load


IMAGES = {"img": bj.ArraySpec(("H", "W"), np.float32)}
IMAGE_BUCKETS = bj.Bucketing(boundaries={"H": (4, 8), "W": (4, 8)}, batch_size=4)
BATCH_BUCKETS: list[set] = []  # per run_inference call: the plan buckets its batch held


def masked_image_sums(params, element, lengths):
    """Per image of a batch (``batched=True``), the sum of its real pixels."""
    img = element["img"]
    TRACED.append(tuple(img.shape))
    rows = np.arange(img.shape[1])[None, :, None] < lengths["H"][:, None, None]
    cols = np.arange(img.shape[2])[None, None, :] < lengths["W"][:, None, None]
    return jax.numpy.where(rows & cols, img, 0.0).sum(axis=(1, 2))


class _RecordingHandler(bj.JaxModelHandler):
    def run_inference(self, batch, model, inference_args=None):
        plan = self.plan()
        BATCH_BUCKETS.append({plan.bucket_for(np.shape(x["img"])) for x in batch})
        return super().run_inference(batch, model, inference_args)


def test_several_ragged_axes_batch_by_the_plans_bucket_and_compile_listed_shapes():
    """2-D ragged images, 4 buckets (H x W): Beam's length buckets are the plan's, so every
    batch RunInference forms holds one bucket, and only listed shapes compile."""
    rng = np.random.default_rng(5)
    images = [rng.random((int(rng.integers(1, 9)), int(rng.integers(1, 9)))).astype(np.float32)
              for _ in range(100)]  # fmt: skip
    handler = _RecordingHandler(masked_image_sums, spec=IMAGES, bucketing=IMAGE_BUCKETS,
                                batched=True, devices=[0])  # fmt: skip
    TRACED.clear()
    BATCH_BUCKETS.clear()
    p = pipeline()
    sums = (
        p
        | beam.Create([{"img": x} for x in images])
        | RunInference(handler)
        | beam.Map(lambda r: round(float(r.inference), 3))
    )
    assert_that(sums, equal_to([round(float(x.sum(dtype=np.float64)), 3) for x in images]))
    run(p)
    assert BATCH_BUCKETS and all(len(buckets) == 1 for buckets in BATCH_BUCKETS)
    assert sum(1 for _ in BATCH_BUCKETS) >= 25  # batches of at most 4 of 100 images
    listed = {(size, *bucket) for bucket, size in handler.plan().shapes()}
    assert TRACED and set(TRACED) <= listed


# --- packing: Beam's batches packed into rows -------------------------------------------------


def _packed_records(n: int = 50, seed: int = 11):
    rng = np.random.default_rng(seed)
    return [
        (i, {"x": rng.standard_normal((int(rng.integers(1, 13)), 3)).astype(np.float32),
             "w": np.float32(rng.uniform(0.5, 2.0))})
        for i in range(n)
    ]  # fmt: skip


PACKED_SPEC = {"x": bj.ArraySpec(("L", 3), np.float32), "w": bj.ArraySpec((), np.float32)}
PACKING = bj.Packing(row_lengths=(8, 16), rows_per_batch=(2, 4), max_segments=5)


def test_packed_handler_equals_the_unpacked_kernel_through_runinference():
    from tests import packed_kernels as pk

    records = _packed_records()
    handler = bj.KeyedJaxModelHandler(pk.segment_sum, spec=PACKED_SPEC, packing=PACKING)
    p = pipeline()
    pairs = p | beam.Create(records)
    inferred = (
        pairs
        | RunInference(handler)
        | "Unwrap" >> beam.MapTuple(lambda k, r: (k, np.asarray(r.inference["sum"])))
    )
    expected = {i: r["x"].sum(0) * r["w"] for i, r in records}

    def check(got):
        assert sorted(k for k, _ in got) == sorted(expected)
        for key, value in got:
            np.testing.assert_allclose(value, expected[key], rtol=1e-5, atol=1e-6)

    assert_that(inferred, check)
    run(p)


def test_packed_batching_kwargs_take_every_length_up_to_a_packed_batch_of_records():
    from tests import packed_kernels as pk

    handler = bj.JaxModelHandler(pk.segment_sum, spec=PACKED_SPEC, packing=PACKING)
    kwargs = handler.batch_elements_kwargs()
    assert "length_fn" not in kwargs  # records of every length share rows
    assert kwargs["max_batch_size"] == 4 * 5  # the largest batch's rows x max_segments
    planned = bj.JaxModelHandler(
        pk.segment_sum,
        spec=PACKED_SPEC,
        packing=bj.plan_packing(
            [3, 5, 9, 12, 2, 7] * 20, max_size=16, compile_budget=2, buffer_size=32
        ),
    )
    assert planned.batch_elements_kwargs()["max_batch_size"] == 32  # the planned buffer
    with pytest.raises(bj.SpecError, match="Drop batch_length_fn"):
        bj.JaxModelHandler(pk.segment_sum, spec=PACKED_SPEC, packing=PACKING, batch_length_fn=len)


def test_a_kernel_failure_in_a_packed_batch_is_bisected_down_to_its_record():
    from tests.packed_kernels import SENTINEL, failing_sum

    handler = bj.JaxModelHandler(
        failing_sum,
        spec=bj.ArraySpec(("L",), np.float32),
        packing=bj.Packing(row_lengths=8, rows_per_batch=(2, 4), max_segments=4),
    )
    batch = [np.full((i % 5 + 1,), i, np.float32) for i in range(10)]
    model = handler.load_model()
    ok = handler.run_inference(batch, model)
    np.testing.assert_allclose(
        [float(r.inference) for r in ok], [i * (i % 5 + 1) for i in range(10)]
    )
    batch[6] = np.full((2,), SENTINEL, np.float32)
    with pytest.raises(bj.InferenceBatchError, match=r"elements \[6\] failed") as info:
        handler.run_inference(batch, model)
    assert [(f.key, f.stage) for f in info.value.failures] == [(6, "kernel")]


def test_a_beam_batch_of_several_buckets_runs_each_bucket_in_full_batches():
    """A Beam batch that mixes buckets (no length buckets) and holds more than one batch
    of a bucket: every element's result is its own, each bucket runs in batches of at most
    the plan's size, and an invalid element is named alone with validate's message."""
    records = _records(n=30, seed=11)
    handler = bj.JaxModelHandler(recording_pool, **_handler_kwargs())
    model = handler.load_model()
    TRACED.clear()
    jax.clear_caches()
    calls = []
    dispatch = model.kernel.dispatch
    model.kernel.dispatch = lambda *a, **k: calls.append(len(a[1][0])) or dispatch(*a, **k)
    batch = [{"x": x} for _, x in records]
    results = handler.run_inference(batch, model)
    params = attention_params()
    for (_, x), r in zip(records, results, strict=True):
        np.testing.assert_allclose(r.inference, reference_attention_pool(params, x), 1e-4, 1e-5)
    _assert_only_listed_shapes(handler)
    per_bucket = collections.Counter(model.plan.bucket_for((len(x),)) for _, x in records)
    assert len(calls) == sum(-(-n // 8) for n in per_bucket.values()), (calls, per_bucket)
    assert calls.count(8) == sum(n // 8 for n in per_bucket.values())  # full batches
    bad = {"x": np.ones((3, D), np.float64)[:, :-1]}
    want = model.plan.validate_many([bad])[0]
    with pytest.raises(bj.InferenceBatchError, match=r"elements \[7\] failed") as info:
        handler.run_inference([*batch[:7], bad, *batch[7:]], model)
    (failure,) = info.value.failures
    assert (failure.key, failure.stage, failure.message) == (7, "validation", str(want))


def test_beam_batches_across_buckets_through_runinference_equal_the_reference():
    records = _records(n=50, seed=13)
    handler = bj.KeyedJaxModelHandler(
        masked_attention_pool, spec=SPEC, bucketing=BUCKETING, load_params=attention_params,
        max_batch_duration_secs=None,  # Beam's batches then mix every length
    )  # fmt: skip
    p = pipeline()
    pairs = p | beam.Create([(i, {"x": x}) for i, x in records], reshuffle=False)
    inferred = (
        pairs
        | RunInference(handler)
        | "Unwrap" >> beam.MapTuple(lambda k, r: (k, np.asarray(r.inference)))
    )
    params = attention_params()
    expected = {i: reference_attention_pool(params, x) for i, x in records}

    def check(got):
        assert sorted(k for k, _ in got) == sorted(expected)
        for key, value in got:
            np.testing.assert_allclose(value, expected[key], rtol=1e-4, atol=1e-5)

    assert_that(inferred, check)
    run(p)
