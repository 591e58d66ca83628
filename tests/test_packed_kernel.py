"""RunKernel with packing, end to end through real pipelines: results equal the unpacked
kernel's, per-record dead letters, the bisection bound, out of memory, metrics, shapes."""

from __future__ import annotations

import math

import apache_beam as beam
import jax
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import beam_jax as bj
import beam_jax.internal
from beam_jax import ArraySpec, Packing, RunKernel
from beam_jax.testing import assert_conserved
from tests import packed_kernels as pk
from tests.beam_helpers import pipeline, run

D = 3
SPEC = {"x": ArraySpec(("L", D), np.float32), "w": ArraySpec((), np.float32)}


def records(n: int, seed: int = 0, top: int = 12):
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.standard_normal((int(rng.integers(1, top + 1)), D)).astype(np.float32),
            "w": np.float32(rng.uniform(0.5, 2.0)),
        }
        for _ in range(n)
    ]


def rounded(out):
    return (tuple(np.round(out["sum"], 4).tolist()), int(out["length"]))


@pytest.mark.parametrize(
    "keyed, classes", [(True, None), (False, None), (True, (8, 16)), (False, (4, 8, 16))]
)
def test_packed_results_equal_the_unpacked_kernels(keyed, classes):
    data = records(60)
    packing = Packing(
        row_lengths=(4, 8, 16) if classes else (8, 16),
        rows_per_batch=(4, 8),
        max_segments=6,
        pack_lengths=classes,
    )
    inputs = list(enumerate(data)) if keyed else data
    p = pipeline()
    created = p | beam.Create(inputs)
    packed = created | "Packed" >> RunKernel(
        pk.segment_sum, spec=SPEC, keyed=keyed, packing=packing
    )
    bucketed = created | "Bucketed" >> RunKernel(
        pk.bucketed_sum,
        spec=SPEC,
        keyed=keyed,
        bucketing=bj.Bucketing(boundaries={"L": (4, 8, 16)}),
    )
    if keyed:
        packed = packed | "RoundP" >> beam.MapTuple(lambda k, v: (k, rounded(v)))
        bucketed = bucketed | "RoundB" >> beam.MapTuple(lambda k, v: (k, rounded(v)))
    else:
        packed = packed | "RoundP" >> beam.Map(rounded)
        bucketed = bucketed | "RoundB" >> beam.Map(rounded)
    both = (
        (packed, bucketed)
        | beam.Flatten()
        | beam.Map(lambda v: (v, 1))
        | beam.CombinePerKey(sum)
        | beam.Values()
    )
    # Every result appears exactly twice: once packed, once bucketed.
    assert_that(both, equal_to([2] * len(data)), label="Same")
    want = [
        (i, (tuple(np.round(r["x"].sum(0) * r["w"], 4).tolist()), len(r["x"])))
        for i, r in enumerate(data)
    ]
    got = packed if keyed else packed | beam.Map(lambda v: v)
    assert_that(got, equal_to(want if keyed else [v for _, v in want]), label="Exact")
    run(p)


def test_a_kernel_fault_dead_letters_that_record_alone_within_the_bound():
    rng = np.random.default_rng(7)
    n, failing = 40, {3, 17, 30}
    elements = []
    for i in range(n):
        x = rng.uniform(1, 2, int(rng.integers(1, 5))).astype(np.float32)
        if i in failing:
            x[-1] = pk.SENTINEL
        elements.append((i, x))
    p = pipeline()
    results, dead = (
        p
        | beam.Create(elements)
        | RunKernel(
            pk.failing_sum,
            spec=ArraySpec(("L",), np.float32),
            keyed=True,
            packing=Packing(row_lengths=16, rows_per_batch=16, max_segments=8),
        ).with_exception_handling()
    )
    want = {i: float(x.sum()) for i, x in elements if i not in failing}
    assert_that(
        results | beam.MapTuple(lambda k, v: (k, round(float(v), 4))),
        equal_to([(i, round(v, 4)) for i, v in want.items()]),
    )
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage, "refuses" in r.message)),
        equal_to([(i, "kernel", True) for i in failing]),
        label="Dead",
    )
    summary = assert_conserved(run(p))
    # One packed batch of n records with k failing ones: at most 1 + 2 k ceil(log2 n) calls.
    bound = 1 + 2 * len(failing) * math.ceil(math.log2(n))
    assert 1 + len(failing) < summary.kernel_calls <= bound, summary.kernel_calls


def test_a_non_finite_output_dead_letters_its_record_only():
    values = [[1.0, 2.0], [1.0, -1.0], [3.0], [0.0], [2.0, 2.0]]
    elements = [(i, np.asarray(v, np.float32)) for i, v in enumerate(values)]
    for check, want_dead in [(True, [1, 3]), (False, [])]:
        p = pipeline()
        results, dead = (
            p
            | beam.Create(elements)
            | RunKernel(
                pk.inverse_sum,
                spec=ArraySpec(("L",), np.float32),
                keyed=True,
                packing=Packing(row_lengths=8, rows_per_batch=4, max_segments=4),
                validation=bj.Validation(check_outputs_finite=check),
            ).with_exception_handling()
        )
        assert_that(
            dead | beam.Map(lambda r: (r.key, r.stage)),
            equal_to([(i, "output") for i in want_dead]),
            label="Dead",
        )
        assert_that(results | beam.Keys(), equal_to([i for i in range(5) if i not in want_dead]))
        assert_conserved(run(p))


def test_out_of_memory_splits_lowers_the_row_limit_and_isolates_a_poison_record():
    rng = np.random.default_rng(8)
    elements = [(i, rng.uniform(1, 2, 4).astype(np.float32)) for i in range(24)]
    elements[9] = (9, np.full(4, pk.POISON, np.float32))
    p = pipeline()
    results, dead = (
        p
        | beam.Create(elements)
        | RunKernel(
            pk.memory_hungry,
            spec=ArraySpec(("L",), np.float32),
            keyed=True,
            packing=Packing(row_lengths=8, rows_per_batch=(1, 2, 4), max_segments=2),
            devices=[0],
        ).with_exception_handling()
    )
    assert_that(results | beam.Keys(), equal_to([i for i in range(24) if i != 9]))
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage, "RESOURCE_EXHAUSTED" in r.message)),
        equal_to([(9, "kernel", True)]),
        label="Dead",
    )
    summary = assert_conserved(run(p))
    # Batches of 4 rows did not fit and both halves (2 rows each) did: the limit dropped to
    # 2 rows once; the poison record alone did not drag it lower.
    assert summary.batch_limit_lowered == 1
    assert summary.out_of_memory >= 2


def test_padding_counts_empty_slots_and_empty_rows():
    # Four records of 4 fill two rows of 8; a batch of 4 rows leaves two rows empty.
    elements = [np.ones(4, np.float32) * i for i in range(4)]
    p = pipeline()
    out = (
        p
        | beam.Create(elements)
        | RunKernel(
            pk.inverse_sum,
            spec=ArraySpec(("L",), np.float32),
            packing=Packing(row_lengths=8, rows_per_batch=4, max_segments=4),
            validation=bj.Validation(check_outputs_finite=False),
        )
    )
    assert_that(out | beam.combiners.Count.Globally(), equal_to([4]))
    summary = assert_conserved(run(p))
    assert summary.padding_ratio == pytest.approx(32 / 16)
    assert summary.kernel_calls == 1


def test_length_classes_run_short_records_in_short_rows_through_a_pipeline():
    # The record of 12 opens a row of 16 that one record of 4 fills; the other three of 4
    # (their class: 8) open rows of 8.
    elements = [np.ones(4, np.float32) * (i + 1) for i in range(4)] + [np.ones(12, np.float32)]
    p = pipeline()
    out = (
        p
        | beam.Create(elements)
        | RunKernel(
            pk.inverse_sum,
            spec=ArraySpec(("L",), np.float32),
            packing=Packing(row_lengths=(8, 16), rows_per_batch=4, pack_lengths=(8, 16)),
            validation=bj.Validation(check_outputs_finite=False),
        )
    )
    assert_that(out | beam.combiners.Count.Globally(), equal_to([5]))
    summary = assert_conserved(run(p))
    assert summary.kernel_calls == 2  # one batch of rows of 8, one of rows of 16
    assert summary.padding_ratio == pytest.approx((4 * 8 + 4 * 16) / 28)


def test_only_listed_shapes_compile():
    pk.TRACED.clear()
    packing = Packing(row_lengths=(4, 8, 16), rows_per_batch=(4, 8), max_segments=8)
    run_kernel = RunKernel(
        pk.traced_batched, spec=ArraySpec(("L",), np.float32), batched=True, packing=packing
    )
    data = [np.ones(int(n), np.float32) for n in np.random.default_rng(3).integers(1, 17, 90)]
    p = pipeline()
    out = p | beam.Create(data) | run_kernel
    assert_that(out | beam.Map(lambda v: int(v)), equal_to([len(x) for x in data]))
    run(p)
    listed = {(s, n) for (n,), s in run_kernel.plan(len(jax.devices())).shapes()}
    assert pk.TRACED and set(pk.TRACED) <= listed, (pk.TRACED, listed)


def test_precompile_compiles_exactly_the_listed_packed_shapes():
    packing = Packing(row_lengths=(8, 16), rows_per_batch=(4, 8), max_segments=4)
    run_kernel = RunKernel(
        pk.failing_sum, spec=ArraySpec(("L",), np.float32), packing=packing, precompile=True
    )
    data = [np.ones(int(n), np.float32) for n in np.random.default_rng(4).integers(1, 17, 40)]
    p = pipeline()
    out = p | beam.Create(data) | run_kernel
    assert_that(out | beam.Map(float), equal_to([float(len(x)) for x in data]))
    summary = assert_conserved(run(p))
    assert summary.compiles == len(run_kernel.plan(len(jax.devices())).shapes())


# Packing has no Bucketing, so the fix for a record too long is the packing's own.
TOO_LONG = (
    "exceeds the longest packed row (8); add a row length of at least 20 to "
    "Packing(row_lengths=...) (with plan_packing, raise max_size), or cut such records "
    "before the transform: packing does not truncate."
)


def test_records_too_long_or_misshapen_are_validation_dead_letters():
    elements = [(0, np.ones(3, np.float32)), (1, np.ones(20, np.float32)), (2, np.ones((2, 2)))]
    p = pipeline()
    results, dead = (
        p
        | beam.Create(elements)
        | RunKernel(
            pk.failing_sum,
            spec=ArraySpec(("L",), np.float32),
            keyed=True,
            packing=Packing(row_lengths=8, rows_per_batch=4),
        ).with_exception_handling()
    )
    assert_that(results, equal_to([(0, np.float32(3.0))]))
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage, r.message.endswith(TOO_LONG))),
        equal_to([(1, "validation", True), (2, "validation", False)]),
        label="Dead",
    )
    assert_conserved(run(p))


def test_a_record_too_long_to_pack_names_the_packing_fix_from_the_batch_and_arrow_checks():
    """The message said to set Bucketing(oversize='truncate'), which packing cannot take."""
    packing = Packing(row_lengths=8, rows_per_batch=4)
    handler = bj.JaxModelHandler(
        pk.failing_sum, spec=ArraySpec(("L",), np.float32), packing=packing
    )
    with pytest.raises(bj.InferenceBatchError) as info:  # RunInference's batch checks
        handler.run_inference(
            [np.ones(3, np.float32), np.ones(20, np.float32)], handler.load_model()
        )
    [failure] = info.value.failures
    assert failure.error_type == "ElementTooLargeError" and failure.message.endswith(TOO_LONG)
    batch = pa.record_batch({"id": [0, 1], "x": [[1.0] * 3, [1.0] * 20]})
    p = pipeline()
    _, dead = (
        p
        | beam.Create([batch])
        | bj.RunKernelOnArrow(
            pk.failing_sum,
            spec=ArraySpec(("L",), np.float32),
            columns=bj.ArrowColumns(leaves="x", id="id"),
            packing=packing,
        ).with_exception_handling()
    )
    assert_that(
        dead | beam.Map(lambda f: (f.key, f.message.endswith(TOO_LONG))), equal_to([(1, True)])
    )
    run(p)


def test_a_plan_packing_result_runs_and_lists_its_shapes():
    rng = np.random.default_rng(0)
    data = [rng.uniform(1, 2, int(n)).astype(np.float32) for n in rng.integers(1, 40, 120)]
    chosen = bj.plan_packing([len(x) for x in data], max_size=40, compile_budget=2, buffer_size=50)
    run_kernel = RunKernel(pk.failing_sum, spec=ArraySpec(("L",), np.float32), packing=chosen)
    assert run_kernel.plan().shapes() == [((n,), s) for n, s in chosen.packing.shapes()]
    assert len(run_kernel.plan().shapes()) <= 2
    p = pipeline()
    keyed = RunKernel(
        pk.failing_sum, spec=ArraySpec(("L",), np.float32), keyed=True, packing=chosen
    )
    out = p | beam.Create(list(enumerate(data))) | keyed
    assert_that(
        out | beam.MapTuple(lambda k, v: (k, round(float(v), 3))),
        equal_to([(i, round(float(x.sum()), 3)) for i, x in enumerate(data)]),
    )
    summary = assert_conserved(run(p))
    # The job packs about as tightly as the planner predicted for the sample.
    assert summary.padding_ratio <= 1.1 * chosen.padding_ratio


def test_specs_and_transforms_that_cannot_pack_are_refused_with_the_reason():
    packing = Packing(row_lengths=8)
    with pytest.raises(bj.SpecError, match="no ragged axis"):
        RunKernel(pk.failing_sum, spec=ArraySpec((4,)), packing=packing)
    with pytest.raises(bj.SpecError, match="several ragged axes"):
        RunKernel(pk.failing_sum, spec=ArraySpec(("A", "B")), packing=packing)
    with pytest.raises(bj.SpecError, match="bucketing and packing"):
        RunKernel(
            pk.failing_sum,
            spec=ArraySpec(("L",)),
            packing=packing,
            bucketing=bj.Bucketing(boundaries={"L": 8}),
        )
    with pytest.raises(bj.SpecError, match="cannot name axes"):
        RunKernel(
            pk.failing_sum, spec=ArraySpec(("L",)), packing=packing, output_spec=ArraySpec(("L",))
        )
    with pytest.raises(bj.SpecError, match="packing must be"):
        RunKernel(pk.failing_sum, spec=ArraySpec(("L",)), packing=8)
    with pytest.raises(bj.SpecError, match="Drop batch_length_fn"):
        bj.JaxModelHandler(pk.failing_sum, spec=ArraySpec(("L",)), packing=packing,
                           batch_length_fn=len)  # fmt: skip


def test_reduce_kernel_sums_real_segments_per_window_and_leaves_out_failures():
    from apache_beam.transforms import window

    rng = np.random.default_rng(5)
    data = [rng.uniform(1, 2, int(rng.integers(1, 9))).astype(np.float32) for _ in range(60)]
    data[7][0] = pk.SENTINEL
    p = pipeline()
    totals, dead = (
        p
        | beam.Create(list(enumerate(data)))
        | beam.Map(lambda kv: window.TimestampedValue(kv, kv[0]))
        | beam.WindowInto(window.FixedWindows(20))
        | bj.ReduceKernel(
            pk.failing_sum,
            spec=ArraySpec(("L",), np.float32),
            keyed=True,
            packing=Packing(row_lengths=(8, 16), rows_per_batch=4, max_segments=4),
        ).with_exception_handling()
    )
    want = [
        (20 - (lo == 0), round(sum(float(x.sum()) for i, x in enumerate(data[lo : lo + 20], lo)
                                   if i != 7), 2))
        for lo in (0, 20, 40)
    ]  # fmt: skip
    assert_that(totals | beam.Map(lambda r: (r.count, round(float(r.total), 2))), equal_to(want))
    assert_that(dead | beam.Map(lambda r: (r.key, r.stage)), equal_to([(7, "kernel")]), "Dead")
    assert_conserved(run(p))


def test_cross_bundle_mode_packs_flushes_with_per_record_results_and_dead_letters():
    rng = np.random.default_rng(11)
    data = [(i, rng.uniform(1, 2, int(rng.integers(1, 9))).astype(np.float32)) for i in range(50)]
    data[12][1][0] = pk.SENTINEL
    p = pipeline()
    # buffer_size=6: a key's buffer is full at 6 records (plan_packing's buffer).
    chosen = bj.plan_packing([len(x) for _, x in data], max_size=8, buffer_size=6)
    results, dead = (
        p
        | beam.Create(data)
        | RunKernel(pk.failing_sum, spec=ArraySpec(("L",), np.float32), keyed=True, packing=chosen)
        .with_cross_bundle_batching(max_wait_s=3600, shards=2)
        .with_exception_handling()
    )
    assert_that(
        results | beam.MapTuple(lambda k, v: (k, round(float(v), 3))),
        equal_to([(i, round(float(x.sum()), 3)) for i, x in data if i != 12]),
    )
    assert_that(dead | beam.Map(lambda r: (r.key, r.stage)), equal_to([(12, "kernel")]), "Dead")
    summary = assert_conserved(run(p))
    assert summary.buffering.waited == 50
    assert summary.buffering.flushes["full"] >= 6


class _Calls:
    """A counter in place of a Beam metric, read back by the property below."""

    def __init__(self):
        self.n = 0

    def inc(self, k: int = 1):
        self.n += k


_WORKER = {}


def _engine_run(values, handle_errors=True):
    """``values`` through one ElementFrontEnd + BatchEngine with packing (no Beam):
    ``(results by index, dead letters by index, kernel calls)``."""
    from beam_jax.internal import BatchEngine, ElementFrontEnd, KernelMetrics, PerElement

    if not _WORKER:
        packing = Packing(row_lengths=(8, 16), rows_per_batch=(4, 8), max_segments=5)
        options = bj.KernelOptions(packing=packing)
        _WORKER["w"] = bj.internal.Worker(pk.failing_sum, ArraySpec(("L",), np.float32), options)
    worker = _WORKER["w"]
    metrics = KernelMetrics()
    metrics.kernel_calls = calls = _Calls()
    results, dead = {}, {}
    strategy = PerElement(worker.plan, lambda tag, out: results.__setitem__(tag, float(out)))
    front = ElementFrontEnd(
        worker.plan, strategy, lambda e, stage, tag: dead.__setitem__(tag, stage)
    )
    front.engine = BatchEngine(
        worker, metrics, front, handle_errors=handle_errors, report_compiles=lambda: None
    )
    for i, v in enumerate(values):
        for _ in front.add(i, worker.plan.validate(v)):
            pass
    for stream in (front.drain(), front.engine.flush(), front.outputs.finish()):
        for _ in stream:
            pass
    return results, dead, calls.n


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 16), min_size=1, max_size=80),
    failing=st.sets(st.integers(0, 79), max_size=4),
)
def test_property_packed_engine_results_dead_letters_and_call_bound(lengths, failing):
    failing = {i for i in failing if i < len(lengths)}
    values = [np.full(n, (i % 7) + 1, np.float32) for i, n in enumerate(lengths)]
    _, _, batches = _engine_run(values)  # the same packing without faults: one call a batch
    for i in failing:
        values[i][-1] = pk.SENTINEL
    results, dead, calls = _engine_run(values)
    assert dead == {i: "kernel" for i in failing}
    assert results == {i: float(v.sum()) for i, v in enumerate(values) if i not in failing}
    # Each batch of n_b records with k_b failing ones: 1 + 2 k_b ceil(log2 n_b) calls at most.
    bound = batches + 2 * len(failing) * math.ceil(math.log2(max(len(lengths), 2)))
    assert calls <= bound, (calls, bound)


@pytest.mark.parametrize(
    "classes, rows_per_batch, chunk_units",
    # The last: 16 rows per batch (4 per device) run 2 rows of 8 or 1 row of 16 at a time.
    [(None, 4, None), ((8, 16), 4, None), (None, 16, 16)],
)
def test_run_kernel_on_arrow_packs_rows_with_results_by_id_and_origins(
    tmp_path, classes, rows_per_batch, chunk_units
):
    from tests.test_columnar import BAD, SPEC, records, write_parquet

    xs = records(60)
    path = str(tmp_path / "data.parquet")
    write_parquet(path, xs)
    ids = list(range(len(xs))) + list(BAD)
    order = np.random.default_rng(1).permutation(len(ids))  # write_parquet's row order
    file_row = {int(ids[j]): at for at, j in enumerate(order)}
    p = pipeline()
    results, dead = (
        p
        | bj.ReadArrowBatches(path, max_rows=7)
        | bj.RunKernelOnArrow(
            pk.failing_vector_sum,
            spec=SPEC,
            columns=bj.ArrowColumns(leaves={"x": "x"}, id="id"),
            packing=Packing(
                row_lengths=(8, 16),
                rows_per_batch=rows_per_batch,
                max_segments=4,
                pack_lengths=classes,
            ),
            chunk_units=chunk_units,
            metrics_namespace="arrow_packed",
        ).with_exception_handling()
    )
    rows = results | beam.FlatMap(
        lambda b: zip(b.column("id").to_pylist(), b.column("sum").to_pylist(), strict=True)
    )

    def same_sums(got):
        got = dict(got)
        assert sorted(got) == list(range(len(xs)))
        for i, x in enumerate(xs):
            np.testing.assert_allclose(got[i], x.sum(0), rtol=1e-5, atol=1e-5)

    assert_that(rows, same_sums)
    assert_that(
        dead | beam.Map(lambda f: (f.key, f.stage, f.source == path, f.row)),
        equal_to([(k, stage, True, file_row[k]) for k, (_, stage, _) in BAD.items()]),
        label="Dead",
    )
    assert_conserved(run(p), namespace="arrow_packed")


def test_run_kernel_on_arrow_packs_a_ragged_and_a_scalar_leaf_under_string_ids():
    """Packed record batches cut each row's leaves from the columns (a ragged one, a
    scalar one, binary or list layout), keep string ids, and give the unpacked results."""
    import pyarrow as pa

    data = records(40, seed=3)
    ids = [f"doc-{i}" for i in range(len(data))]
    x = [r["x"] for r in data]
    batches = [
        pa.record_batch(
            {
                "key": pa.array(ids[lo : lo + 9]),
                "x": pa.array([v.tobytes() for v in x[lo : lo + 9]], pa.binary())
                if lo % 2
                else pa.array(
                    [v.reshape(-1).tolist() for v in x[lo : lo + 9]], pa.list_(pa.float32())
                ),
                "w": pa.array([float(r["w"]) for r in data[lo : lo + 9]], pa.float32()),
            }
        )
        for lo in range(0, len(data), 9)
    ]
    p = pipeline()
    results = (
        p
        | beam.Create(batches)
        | bj.RunKernelOnArrow(
            pk.segment_sum,
            spec=SPEC,
            columns=bj.ArrowColumns(leaves={"x": "x", "w": "w"}, id="key"),
            packing=Packing(row_lengths=(8, 16), rows_per_batch=4, max_segments=4),
        )
    )
    rows = results | beam.FlatMap(
        lambda b: zip(
            b.column("key").to_pylist(),
            b.column("sum").to_pylist(),
            b.column("length").to_pylist(),
            strict=True,
        )
    )
    want = {ids[i]: (r["x"].sum(0) * r["w"], len(r["x"])) for i, r in enumerate(data)}

    def same(got):
        assert sorted(k for k, _, _ in got) == sorted(want)
        for key, total, length in got:
            np.testing.assert_allclose(total, want[key][0], rtol=1e-5, atol=1e-5)
            assert length == want[key][1]

    assert_that(rows, same)
    run(p)
