"""Start-up compiles in background threads: every listed shape, waits counted apart."""

import threading
import time

import apache_beam as beam
import numpy as np
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax._src.kernel import precompile
from beam_jax._src.kernel.precompile import BackgroundCompile
from beam_jax.internal import Kernel
from beam_jax.testing import CountingLoader, assert_conserved
from tests.beam_helpers import pipeline, run


def _shapes(sizes):
    return [([((n, 3), np.float32)], ()) for n in sizes]


class _SignalWaiters(dict):
    """Stands in for a kernel's shapes-being-compiled table: sets ``waiting`` when a caller
    finds its shape being compiled by another thread and takes the event to wait on."""

    def __init__(self, waiting: threading.Event):
        super().__init__()
        self.waiting = waiting

    def get(self, key, default=None):
        done = super().get(key, default)
        if done is not None:
            self.waiting.set()
        return done


def test_background_compiles_every_shape_and_a_batch_of_a_ready_shape_waits_zero():
    kernel = Kernel(lambda p, x, lengths: x.sum() * p, batched=True)
    job = BackgroundCompile(kernel, 2.0, _shapes([1, 2, 3, 5, 8]), None, threads=3)
    assert job.wait()
    assert kernel.compiles == 5
    assert kernel.wait_seconds == 0.0  # background compiles are not waiting
    assert {sig[0][0][0] for sig in kernel.compiled_shapes()} == {1, 2, 3, 5, 8}
    for n in (1, 2, 3, 5, 8):  # every shape ready: no batch waits at all
        out = kernel.call(np.float32(2.0), [np.ones((n, 3), np.float32)], {}, treedef=None)
        assert float(out) == 6.0 * n
    assert kernel.compiles == 5
    assert kernel.wait_seconds == 0.0


def test_compile_threads_follow_the_usable_cores_and_one_thread_keeps_the_listed_order(
    monkeypatch,
):
    """One thread per usable CPU, at most 4 (also for a kernel on a TPU: there one thread
    made a first run 1.3x slower and a warm one no faster); on one thread the shapes
    compile in the order listed, the one needed first first."""
    for cores, threads in ((1, 1), (2, 2), (8, 4)):
        monkeypatch.setattr(precompile, "usable_cores", lambda c=cores: c)
        assert precompile.default_threads() == threads
    kernel = Kernel(lambda p, x, lengths: x.sum(), batched=True)
    order, real = [], kernel.precompile

    def record(params, shapes, treedef, background=False):
        order.append(shapes[0][0][0][0][0])
        return real(params, shapes, treedef, background=background)

    monkeypatch.setattr(kernel, "precompile", record)
    job = BackgroundCompile(kernel, None, _shapes([8, 1, 4]), None, threads=1)
    assert job.wait(60) and len(job._threads) == 1
    assert order == [8, 1, 4] and kernel.compiles == 3


def test_a_caller_waits_for_a_shape_another_thread_compiles_and_it_compiles_once():
    started, release = threading.Event(), threading.Event()

    def slow(p, x, lengths):
        started.set()
        release.wait(10)  # tracing holds here until the caller is waiting
        return x.sum()

    kernel = Kernel(slow, batched=True)
    waiting = threading.Event()
    kernel._compiling = _SignalWaiters(waiting)
    job = BackgroundCompile(kernel, None, _shapes([4]), None, threads=1)
    assert started.wait(30)
    waiter = threading.Thread(
        target=lambda: kernel.call(None, [np.ones((4, 3), np.float32)], {}, treedef=None)
    )
    waiter.start()
    assert waiting.wait(30)  # the caller found the shape compiling and waits for it
    release.set()
    waiter.join(30)
    assert job.wait(30)
    assert kernel.compiles == 1
    assert kernel.wait_seconds > 0  # the caller's wait is on the critical path


def test_a_shape_that_fails_to_compile_fails_for_its_callers_only():
    def picky(p, x, lengths):
        if x.shape[0] == 2:
            raise ValueError("no batches of 2")
        return x.sum()

    kernel = Kernel(picky, batched=True)
    assert BackgroundCompile(kernel, None, _shapes([1, 2]), None).wait()
    assert kernel.compiles == 1
    try:
        kernel.call(None, [np.ones((2, 3), np.float32)], {}, treedef=None)
    except bj.CompileError as e:
        assert "no batches of 2" in str(e) and "batched=True" not in str(e)  # batched already
    else:
        raise AssertionError("expected a CompileError")


def test_pipeline_precompiles_the_listed_set_and_reports_the_critical_path_apart():
    def total(params, element, lengths):
        return element["x"].sum(axis=(1, 2))

    spec = {"x": bj.ArraySpec(("L", 2), np.float32)}
    values = [{"x": np.ones((n, 2), np.float32)} for n in range(1, 13)]
    bucketing = bj.plan_bucketing([len(v["x"]) for v in values], max_size=12, compile_budget=3)
    p = pipeline()
    results = (
        p
        | beam.Create(values)
        | bj.RunKernel(total, spec=spec, batched=True, precompile=True,
                       bucketing=bucketing.bucketing)
        | beam.Map(float)
    )  # fmt: skip
    assert_that(results, equal_to([2.0 * n for n in range(1, 13)]))
    summary = assert_conserved(run(p))
    assert summary.compiles == bucketing.shapes
    assert summary.padding_ratio == bucketing.padding_ratio


def test_precompile_compiles_shapes_no_batch_needs_off_the_critical_path():
    """Only the shortest bucket's lengths arrive: every listed shape still compiles, and the
    others' compiles are waited for by no batch (time compiled beyond time waited)."""

    def total(params, element, lengths):
        return element["x"].sum(axis=(1, 2))

    spec = {"x": bj.ArraySpec(("L", 2), np.float32)}
    bucketing = bj.Bucketing(boundaries={"L": (4, 8, 12)}, batch_size=4, batch_sizes=(4,))
    values = [{"x": np.ones((n, 2), np.float32)} for n in (1, 2, 3, 4)]

    def compiled(precompile: bool):
        p = pipeline()
        results = (
            p
            | beam.Create(values)
            | bj.RunKernel(total, spec=spec, batched=True, precompile=precompile,
                           bucketing=bucketing)
            | beam.Map(float)
        )  # fmt: skip
        assert_that(results, equal_to([2.0, 4.0, 6.0, 8.0]))
        return assert_conserved(run(p))

    eager, lazy = compiled(True), compiled(False)
    assert eager.compiles == 3 and lazy.compiles == 1  # the listed set, against the one used
    assert eager.compile_seconds > eager.compile_wait_seconds
    assert eager.compile_overlapped_seconds > 0
    # Of the compiles, the tracing and lowering, reported through the pipeline's metrics.
    assert 0 < eager.compile_trace_seconds <= eager.compile_seconds


def test_without_precompile_every_compile_is_on_the_critical_path():
    def total(params, element, lengths):
        return element["x"].sum(axis=(1, 2))

    spec = {"x": bj.ArraySpec(("L", 2), np.float32)}
    values = [{"x": np.ones((n, 2), np.float32)} for n in range(1, 9)]
    p = pipeline()
    results = (
        p
        | beam.Create(values)
        | bj.RunKernel(total, spec=spec, batched=True, precompile=False,
                       bucketing=bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=8,
                                              batch_sizes=(8,)))
        | beam.Map(float)
    )  # fmt: skip
    assert_that(results, equal_to([2.0 * n for n in range(1, 9)]))
    summary = assert_conserved(run(p))
    assert summary.compiles == 2
    # Each batch compiled its own shape while it waited: all of it on the critical path
    # (the milliseconds are truncated per report, hence the one-per-compile slack).
    assert summary.compile_wait_seconds > 0
    assert summary.compile_overlapped_seconds <= 0.001 * summary.compiles


def test_start_workers_builds_the_worker_once_in_the_first_stage(tmp_path):
    def total(params, element, lengths):
        return element["x"].sum(axis=(1, 2)) * params

    spec = {"x": bj.ArraySpec(("L", 2), np.float32)}
    loader = CountingLoader(tmp_path / "loads", np.float32(1.0))
    values = [{"x": np.ones((n, 2), np.float32)} for n in range(1, 9)]
    embed = bj.RunKernel(
        total, spec=spec, batched=True, precompile=True, load_params=loader,
        bucketing=bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=4, batch_sizes=(4,)),
    )  # fmt: skip
    p = pipeline()
    _ = p | "Start" >> embed.start_workers()
    results = p | beam.Create(values) | embed | beam.Map(float)
    assert_that(results, equal_to([2.0 * n for n in range(1, 9)]))
    summary = assert_conserved(run(p))
    # One worker: parameters loaded once, each of the 2 shapes compiled once.
    assert sum(loader.calls().values()) == 1
    assert summary.compiles == 2


def test_start_workers_alone_builds_and_keeps_a_worker(tmp_path):
    from beam_jax._src.transforms import base

    loader = CountingLoader(tmp_path / "loads", np.float32(1.0))
    embed = bj.RunKernel(
        lambda p, x, lengths: x.sum(), spec=bj.ArraySpec(("L",), np.float32),
        load_params=loader, bucketing=bj.Bucketing(boundaries={"L": (4,)}, batch_size=2),
    )  # fmt: skip
    p = pipeline()
    _ = p | embed.start_workers()
    run(p)
    started = base._take_started(embed._start_id)  # waiting for the DoFn to take it
    assert started is not None
    started.get()  # built in the background: parameters loaded once
    assert sum(loader.calls().values()) == 1


def test_a_full_batch_whose_shape_is_compiling_waits_while_ready_shapes_run():
    from apache_beam.transforms.window import GlobalWindow

    from beam_jax._src.transforms.elements import ElementsDoFn

    release = threading.Event()

    def total(params, element, lengths):
        if element["x"].shape[1] == 8:
            release.wait(30)  # the long bucket's shape compiles until the test says
        return element["x"].sum(axis=(1, 2))

    spec = {"x": bj.ArraySpec(("L", 2), np.float32)}
    options = bj.KernelOptions(
        batched=True, precompile=True,
        bucketing=bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=4, batch_sizes=(4,)),
    )  # fmt: skip
    dofn = ElementsDoFn(total, spec, options, handle_errors=False, keyed=False)
    dofn.setup()
    try:
        worker = dofn._worker
        deadline = time.time() + 30
        while not worker.ready((4,), 4) and time.time() < deadline:
            time.sleep(0.05)
        assert worker.ready((4,), 4) and not worker.ready((8,), 4)
        dofn.start_bundle()
        out = []
        for n in (5, 6, 7, 8, 1, 2, 3, 4):  # the long bucket fills first, the short one second
            element = {"x": np.ones((n, 2), np.float32)}
            out += list(dofn.process(element, timestamp=0, window=GlobalWindow()))
        # The long batch waits for its shape; the short one was launched meanwhile.
        assert [b.bucket for b in dofn._engine._waiting] == [(8,)]
        assert [f.batch.bucket for f in dofn._engine._inflight] == [(4,)]
        release.set()
        out += list(dofn.finish_bundle())
        assert sorted(float(v.value) for v in out) == [2.0 * n for n in range(1, 9)]
        assert worker.kernel.compiles == 2
    finally:
        release.set()
        dofn.teardown()


def test_run_kernel_on_arrow_takes_the_worker_started_here(tmp_path):
    """The worker ``start_worker_here()`` built (as the flagship does on the in-process
    runner) is the one the Arrow front end runs: parameters load once."""
    import pyarrow as pa

    loader = CountingLoader(tmp_path / "loads", np.float32(2.0))
    embed = bj.RunKernelOnArrow(
        lambda params, element, lengths: element["x"].sum() * params,
        spec={"x": bj.ArraySpec(("L",), np.float32)},
        columns=bj.ArrowColumns(leaves={"x": "x"}, id="id"),
        bucketing=bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=4, batch_sizes=(4,)),
        load_params=loader,
        precompile=True,
    )
    batch = pa.record_batch(
        {
            "id": pa.array(range(6)),
            "x": pa.array([[1.0] * n for n in range(1, 7)], pa.list_(pa.float32())),
        }
    )
    p = pipeline()
    results = (
        p | beam.Create([batch]) | embed | beam.FlatMap(lambda b: b.column("output").to_pylist())
    )
    assert_that(results, equal_to([2.0 * n for n in range(1, 7)]))
    embed.start_worker_here()
    try:
        run(p)
    finally:
        embed.forget_worker_here()
    assert sum(loader.calls().values()) == 1


def test_shapes_started_together_lower_one_at_a_time():
    # Each tracing waits (up to 0.3 s) for another to begin beside it: shapes that lowered
    # side by side would record two at once.
    lock, tracing, most = threading.Lock(), [0], [0]
    company = threading.Condition(lock)

    def fn(p, x, lengths):
        with company:
            tracing[0] += 1
            most[0] = max(most[0], tracing[0])
            company.notify_all()
            company.wait_for(lambda: tracing[0] > 1, timeout=0.3)
            tracing[0] -= 1
        return x.sum()

    kernel = Kernel(fn, batched=True)
    job = BackgroundCompile(kernel, None, _shapes([1, 2, 3, 4]), None, threads=4)
    assert job.wait(60)
    assert kernel.compiles == 4
    assert most[0] == 1
