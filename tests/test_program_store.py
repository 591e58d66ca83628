"""Compiled programs stored whole (``program_key``): a later kernel loads them untraced."""

from __future__ import annotations

import logging

import apache_beam as beam
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that
from jax.experimental.compilation_cache import compilation_cache

import beam_jax as bj
from beam_jax import ArraySpec, Bucketing
from beam_jax._src.engine.options import KernelOptions, make_kernel
from beam_jax._src.kernel import stored
from beam_jax._src.kernel.cache import enable_compilation_cache
from beam_jax._src.kernel.stored import SUBDIR, ProgramStore
from beam_jax.internal import Kernel
from tests import flagship as ft
from tests import kernels
from tests.beam_helpers import pipeline

TREE = jax.tree_util.tree_structure({"x": 0})


@pytest.fixture(autouse=True)
def jax_cache():
    """JAX's own cache off for each test (an earlier test in this process may have turned it
    on, and its programs are not stored here on a CPU), and back as it was after."""
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()
    yield
    jax.config.update("jax_compilation_cache_dir", before)
    compilation_cache.reset_cache()


class Traced:
    """``masked_attention_pool`` on float32 copies of the parameters, counting how often JAX
    traces it."""

    def __init__(self):
        self.traces = 0

    def __call__(self, params, element, lengths):
        self.traces += 1
        params = jax.tree.map(lambda w: w.astype(np.float32), params)
        return kernels.masked_attention_pool(params, element, lengths)


def batch(rows: int = 8, length: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, length, kernels.D)).astype(np.float32)
    return [x], {"L": rng.integers(1, length + 1, rows).astype(np.int32)}


def run_once(directory, key, *, devices=None, rows=8, params=None):
    """A fresh kernel with its own store in ``directory``: (outputs, kernel, store, fn)."""
    store, fn = ProgramStore(str(directory), key), Traced()
    kernel = Kernel(fn, devices=devices, store=store)
    placed = kernel.put_params(kernels.attention_params() if params is None else params)
    leaves, lengths = batch(rows)
    return kernel.call(placed, leaves, lengths, treedef=TREE), kernel, store, fn


@pytest.mark.parametrize("devices", [[0], None])  # one device; all four (shard_map)
def test_a_stored_program_loads_without_tracing_and_gives_the_same_outputs(tmp_path, devices):
    first, kernel, store, fn = run_once(tmp_path, "attention-v1", devices=devices)
    assert (store.stored, store.loaded, fn.traces) == (1, 0, 1) and kernel.trace_seconds > 0
    assert len(list((tmp_path / SUBDIR).glob("*.program"))) == 1

    again, kernel, store, fn = run_once(tmp_path, "attention-v1", devices=devices)
    assert (store.stored, store.loaded, fn.traces) == (0, 1, 0)
    assert kernel.compiles == 1 and kernel.trace_seconds == 0
    np.testing.assert_array_equal(again, first)


def test_another_key_shape_or_parameter_dtype_is_compiled_and_stored_apart(tmp_path):
    run_once(tmp_path, "attention-v1")
    params = {k: v.astype(np.float16) for k, v in kernels.attention_params().items()}
    for change in ({"key": "attention-v2"}, {"rows": 4}, {"params": params}):
        kwargs = {"key": "attention-v1", **change}
        _, _, store, fn = run_once(tmp_path, kwargs.pop("key"), **kwargs)
        assert (store.loaded, store.stored, fn.traces) == (0, 1, 1), change
    assert len(list((tmp_path / SUBDIR).glob("*.program"))) == 4


def test_the_key_follows_xla_flags_and_jax_settings(tmp_path, monkeypatch):
    store = ProgramStore(str(tmp_path), "k")
    devices = jax.devices()[:1]
    abstract = (None, {"x": jax.ShapeDtypeStruct((8, 4), np.float32)})
    base = store.key(devices, abstract)
    assert store.key(devices, abstract) == base
    assert store.key(devices, abstract, ("chunk rows", 2)) != base
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_rwb_fusion=false")
    assert store.key(devices, abstract) != base
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    with jax.default_matmul_precision("highest"):
        assert store.key(devices, abstract) != base
    assert store.key(devices, abstract) == base
    monkeypatch.setattr(stored, "_host_cpu", lambda: "x86_64 another CPU's flags")
    assert store.key(devices, abstract) != base  # a CPU program is built for its CPU


def test_a_damaged_program_is_logged_compiled_anew_and_replaced(tmp_path, caplog):
    first, *_ = run_once(tmp_path, "attention-v1")
    (path,) = (tmp_path / SUBDIR).glob("*.program")
    path.write_bytes(b"not a program")
    with caplog.at_level(logging.WARNING):
        again, _, store, fn = run_once(tmp_path, "attention-v1")
    assert "could not load" in caplog.text and str(path) in caplog.text
    assert (store.loaded, store.stored, fn.traces) == (0, 1, 1)
    np.testing.assert_array_equal(again, first)
    _, _, store, fn = run_once(tmp_path, "attention-v1")
    assert (store.loaded, fn.traces) == (1, 0)


def test_a_damaged_program_is_removed_where_jax_cache_gives_its_shape(tmp_path, caplog):
    enable_compilation_cache(str(tmp_path / "jax"))
    run_once(tmp_path / "store", "k")
    (path,) = (tmp_path / "store" / SUBDIR).glob("*.program")
    path.write_bytes(path.read_bytes()[:100])  # cut short
    with caplog.at_level(logging.WARNING):
        _, _, store, _ = run_once(tmp_path / "store", "k")
    assert "could not load" in caplog.text and (store.stored, store.skipped) == (0, 1)
    assert not path.exists()  # not read and logged again by every later worker
    caplog.clear()
    _, _, store, fn = run_once(tmp_path / "store", "k")
    assert "could not load" not in caplog.text and fn.traces == 1


def test_a_cpu_program_jax_loaded_from_its_cache_is_not_stored(tmp_path):
    # Re-serialized, such a program has lost its compiled functions: it would load, then
    # fail every batch ("NOT_FOUND: Function ... not found"). XLA's own builds are stored.
    enable_compilation_cache(str(tmp_path / "jax"))
    first, _, store, _ = run_once(tmp_path / "built", "k")
    assert (store.stored, store.skipped) == (1, 0)
    _, _, store, fn = run_once(tmp_path / "from-jax", "k")  # JAX's cache has it now
    assert (store.stored, store.skipped, fn.traces) == (0, 1, 1)  # the event was seen
    again, _, store, fn = run_once(tmp_path / "from-jax", "k")
    assert (store.loaded, fn.traces) == (0, 1)
    _, _, store, fn = run_once(tmp_path / "built", "k")
    assert (store.loaded, fn.traces) == (1, 0)
    np.testing.assert_array_equal(again, first)


def _store_from_jax_cache_as_on_a_tpu(monkeypatch):
    """Programs JAX's cache gives are stored here as on a TPU: on a CPU such a stored program
    loads and then fails every run, a real broken program for the tests below."""
    compile_ = ProgramStore.compile
    monkeypatch.setattr(
        ProgramStore, "compile", lambda self, key, lowered, _: compile_(self, key, lowered, "tpu")
    )
    return lambda: monkeypatch.setattr(ProgramStore, "compile", compile_)


def test_a_loaded_program_that_fails_at_run_time_is_compiled_anew(tmp_path, monkeypatch, caplog):
    enable_compilation_cache(str(tmp_path / "jax"))
    first, *_ = run_once(tmp_path / "built", "k")
    restore = _store_from_jax_cache_as_on_a_tpu(monkeypatch)
    _, _, store, _ = run_once(tmp_path / "broken", "k")  # from JAX's cache: stored broken
    restore()
    assert store.stored == 1
    store, fn = ProgramStore(str(tmp_path / "broken"), "k"), Traced()
    kernel = Kernel(fn, store=store)
    placed = kernel.put_params(kernels.attention_params())
    leaves, lengths = batch()
    with pytest.raises(Exception, match="NOT_FOUND") as failed:
        kernel.call(placed, leaves, lengths, treedef=TREE)
    assert (store.loaded, fn.traces) == (1, 0)
    with caplog.at_level(logging.WARNING):
        assert kernel.forget_loaded(leaves, ("L",), TREE, failed.value)
    assert "failed at run time" in caplog.text and "NOT_FOUND" in caplog.text
    assert store.discarded == 1 and not list(store.directory.glob("*.program"))
    again = kernel.call(placed, leaves, lengths, treedef=TREE)  # compiled anew
    np.testing.assert_array_equal(again, first)
    assert fn.traces == 1 and not kernel.forget_loaded(leaves, ("L",), TREE, failed.value)
    # JAX's cache gave the new program too: after a failure it is not stored, even on a TPU.
    assert store.stored == 0 and store.skipped == 1


def test_a_pipeline_whose_stored_programs_fail_runs_them_compiled_anew(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    elements = [
        {"x": rng.standard_normal((n, kernels.D)).astype(np.float32)} for n in (3, 5, 9, 16, 2)
    ]
    _, first = _summary_of_a_run(tmp_path, "built", elements)  # JAX's cache holds them now
    for program in (tmp_path / "cache" / SUBDIR).glob("*.program"):
        program.unlink()
    restore = _store_from_jax_cache_as_on_a_tpu(monkeypatch)
    stored_broken, _ = _summary_of_a_run(tmp_path, "stored", elements)
    restore()
    assert stored_broken.compile_trace_seconds > 0
    broken = sorted((tmp_path / "cache" / SUBDIR).glob("*.program"))
    assert len(broken) == stored_broken.compiles >= 2
    # Without handling, a failing record would fail this pipeline: none does.
    summary, again = _summary_of_a_run(tmp_path, "loaded", elements)
    assert summary.results == len(elements) and summary.dead_letters == 0
    assert summary.kernel_retries >= 1
    np.testing.assert_array_equal(again, first)
    assert not any(path.exists() for path in broken)  # the broken files are gone


def test_programs_are_stored_only_with_a_key_and_a_local_directory(tmp_path):
    assert ProgramStore.usable(str(tmp_path), "k")
    assert not ProgramStore.usable("gs://bucket/cache", "k")
    assert not ProgramStore.usable(None, "k") and not ProgramStore.usable(str(tmp_path), None)
    spec = {"x": ArraySpec(("L", kernels.D), np.float32)}
    buckets = Bucketing(boundaries={"L": 16})
    keyed = KernelOptions(buckets, compilation_cache_dir=str(tmp_path), program_key="k")
    assert make_kernel(kernels.masked_attention_pool, spec, keyed)[0].store is not None
    plain = KernelOptions(buckets, compilation_cache_dir=str(tmp_path))
    assert make_kernel(kernels.masked_attention_pool, spec, plain)[0].store is None
    for bad in ("", 3):
        with pytest.raises(bj.SpecError, match="program_key must be a non-empty str"):
            KernelOptions(program_key=bad)


def _saved_to(path):
    """An ``assert_that`` check that writes what it got to ``path`` (the pipeline runs the
    check from a pickled copy, so the test reads the values back from the file)."""

    def save(got):
        assert got, "no outputs"
        np.save(path, np.stack(sorted((np.asarray(g) for g in got), key=lambda v: v.tobytes())))

    return save


def _summary_of_a_run(tmp_path, name, elements):
    spec = {"x": ArraySpec(("L", kernels.D), np.float32)}
    step = bj.RunKernel(
        kernels.masked_attention_pool,
        spec=spec,
        bucketing=Bucketing(boundaries={"L": (8, 16)}, batch_size=4),
        load_params=kernels.attention_params,
        compilation_cache_dir=str(tmp_path / "cache"),
        program_key="attention-v1",
    )
    p = pipeline()
    outputs = p | beam.Create(elements) | step
    assert_that(outputs, _saved_to(tmp_path / f"{name}.npy"))
    result = p.run()
    result.wait_until_finish()
    return bj.summarize(result), np.load(tmp_path / f"{name}.npy")


def test_a_second_pipeline_runs_the_stored_programs_untraced(tmp_path):
    rng = np.random.default_rng(3)
    elements = [
        {"x": rng.standard_normal((n, kernels.D)).astype(np.float32)} for n in (3, 5, 9, 16, 2)
    ]
    cold, first = _summary_of_a_run(tmp_path, "cold", elements)
    warm, again = _summary_of_a_run(tmp_path, "warm", elements)
    assert cold.compile_trace_seconds > 0 and warm.compile_trace_seconds == 0
    assert warm.compiles == cold.compiles >= 2 and warm.results == len(elements)
    assert first.shape == (len(elements), kernels.D)
    np.testing.assert_array_equal(again, first)


def test_the_flagship_stores_its_model_and_a_warm_run_traces_nothing(tmp_path):
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(300)), "text": ft.texts(300)}), source)
    flags = ("--compilation_cache_dir", str(tmp_path / "cache"), "--no-progress")
    cold = ft.run(source, tmp_path / "cold", *flags)
    warm = ft.run(source, tmp_path / "warm", *flags)
    assert cold.kernel.compile_trace_seconds > 0 and warm.kernel.compile_trace_seconds == 0
    assert warm.compiles == cold.compiles >= 1
    assert list((tmp_path / "cache" / SUBDIR).glob("*.program"))
    by_id = [ft.read_outputs(tmp_path / run)[0].sort_by("id") for run in ("cold", "warm")]
    assert by_id[0].num_rows == 300 and by_id[0].equals(by_id[1])
