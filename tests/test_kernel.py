"""The compiled kernel: padding invariance, compile counting, batched kernels (no Beam)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax import ArraySpec, Bucketing
from beam_jax._src.kernel.cache import check_cache_dir, enable_compilation_cache
from beam_jax._src.kernel.compiled import is_out_of_memory
from beam_jax.internal import Kernel, Plan
from tests import kernels

SPEC = {"x": ArraySpec(("L", kernels.D), np.float32)}
BUCKETING = Bucketing(boundaries={"L": (4, 16, 32)}, batch_size=8)


def run_plan(kernel, plan, params, elements):
    items = [plan.validate(e) for e in elements]
    out = [None] * len(items)
    for bucket in {plan.bucket_for(it.lengths) for it in items}:
        idx = [i for i, it in enumerate(items) if plan.bucket_for(it.lengths) == bucket]
        for start in range(0, len(idx), plan.max_batch(bucket)):
            chunk = idx[start : start + plan.max_batch(bucket)]
            batch = plan.pad(bucket, [items[i] for i in chunk])
            res = plan.unbatch(
                kernel.run(params, batch, plan.layout.treedef), batch, [items[i] for i in chunk]
            )
            for i, r in zip(chunk, res, strict=True):
                out[i] = r
    return out


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 32), min_size=1, max_size=20), st.integers(0, 2**31 - 1))
def test_masked_kernel_gives_the_same_answer_padded_as_alone(lengths, seed):
    rng = np.random.default_rng(seed)
    params = kernels.attention_params(seed % 7)
    elements = [{"x": rng.standard_normal((n, kernels.D)).astype(np.float32)} for n in lengths]
    kernel = _shared_kernel()
    plan = Plan(SPEC, BUCKETING, num_devices=kernel.num_devices)
    placed = kernel.put_params(params)
    got = run_plan(kernel, plan, placed, elements)
    for e, g in zip(elements, got, strict=True):
        alone = np.asarray(
            jax.jit(kernels.masked_attention_pool)(params, e, {"L": jnp.int32(e["x"].shape[0])})
        )
        np.testing.assert_allclose(g, alone, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            g, kernels.reference_attention_pool(params, e["x"]), rtol=1e-4, atol=1e-5
        )
    # Only listed shapes were ever compiled.
    listed = {
        tuple((shape, str(np.dtype(dtype))) for shape, dtype in plan.leaf_shapes(b, s))
        for b, s in plan.shapes()
    }
    assert kernel.compiled_shapes() <= listed
    assert kernel.compiles == len(kernel.compiled_shapes())


_KERNEL = []


def _shared_kernel():
    if not _KERNEL:
        _KERNEL.append(Kernel(kernels.masked_attention_pool))
    return _KERNEL[0]


def test_each_shape_compiles_once_and_precompile_covers_the_set():
    kernel = Kernel(kernels.masked_attention_pool)
    plan = Plan(SPEC, BUCKETING, num_devices=kernel.num_devices)
    params = kernel.put_params(kernels.attention_params())
    names = plan.layout.axis_names
    shapes = [(plan.leaf_shapes(b, s), names) for b, s in plan.shapes()]
    assert kernel.precompile(params, shapes, plan.layout.treedef) == len(plan.shapes())
    assert kernel.precompile(params, shapes, plan.layout.treedef) == 0
    rng = np.random.default_rng(0)
    elements = [
        {"x": rng.standard_normal((n, kernels.D)).astype(np.float32)}
        for n in rng.integers(1, 33, 50)
    ]
    run_plan(kernel, plan, params, elements)
    assert kernel.compiles == len(plan.shapes())
    assert 0 < kernel.trace_seconds < kernel.compile_seconds  # tracing is part of compiling


def test_batches_are_sharded_over_all_local_devices():
    kernel = Kernel(lambda p, e, lengths: e["x"].sum())
    assert kernel.num_devices == len(jax.local_devices()) == 4
    one = Kernel(lambda p, e, lengths: e["x"].sum(), devices=jax.local_devices()[:1])
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    tree = jax.tree_util.tree_structure({"x": 0})
    a = kernel.call(None, [x], {}, treedef=tree)
    b = one.call(None, [x], {}, treedef=tree)
    np.testing.assert_array_equal(a, b)


def test_already_batched_kernel_is_not_vmapped():
    def batched(params, element, lengths):
        assert element["x"].ndim == 3  # traced once per shape, with the batch axis
        mask = jnp.arange(element["x"].shape[1])[None, :] < lengths["L"][:, None]
        return (element["x"] * mask[:, :, None].astype(jnp.float32)).sum(1)

    kernel = Kernel(batched, batched=True)
    plan = Plan(SPEC, BUCKETING, num_devices=kernel.num_devices)
    elements = [{"x": np.ones((n, kernels.D), np.float32)} for n in (1, 5, 17)]
    got = run_plan(kernel, plan, None, elements)
    for n, g in zip((1, 5, 17), got, strict=True):
        np.testing.assert_array_equal(g, np.full(kernels.D, n, np.float32))


def test_trace_failures_are_cached_per_shape():
    calls = []

    def broken(params, element, lengths):
        calls.append(1)
        return element["x"] @ jnp.ones((3, 3))  # wrong inner dimension

    kernel = Kernel(broken)
    tree = jax.tree_util.tree_structure({"x": 0})
    x = np.ones((4, 2, kernels.D), np.float32)
    for _ in range(3):
        with pytest.raises(bj.CompileError, match="dot_general|shapes|incompatible") as e:
            kernel.call(None, [x], {"L": np.ones(4, np.int32)}, treedef=tree)
        assert "pass batched=True" in str(e.value)  # the cached failure's message too
    assert len(calls) == 1 and kernel.compiles == 0


def test_out_of_memory_is_recognised():
    assert is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1GB"))
    assert not is_out_of_memory(ValueError("shapes (3,) and (4,) differ"))


def test_persistent_compilation_cache(tmp_path):

    enable_compilation_cache(str(tmp_path / "cache"))
    try:
        kernel = Kernel(lambda p, e, lengths: jnp.tanh(e["x"]).sum() * 3.0)
        tree = jax.tree_util.tree_structure({"x": 0})
        kernel.call(None, [np.ones((4, 7), np.float32)], {}, treedef=tree)
        assert any((tmp_path / "cache").iterdir())
    finally:
        jax.config.update("jax_compilation_cache_dir", None)


def test_a_compilation_cache_others_can_write_is_refused(tmp_path):
    # JAX runs programs from its cache directory: whoever can write there runs code.
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(bj.SpecError, match="writable by other users .*chmod go-w"):
        enable_compilation_cache(str(shared))
    group = tmp_path / "group-cache"
    group.mkdir()
    group.chmod(0o770)
    with pytest.raises(bj.SpecError, match="writable by other users"):
        enable_compilation_cache(str(group / "jax"))  # created inside: its parent decides
    private = tmp_path / "private-cache"
    enable_compilation_cache(str(private))  # created 0700 and accepted
    assert (private.stat().st_mode & 0o077) == 0
    # A shared sticky directory such as /tmp may hold a cache of one's own, not be one.
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    with pytest.raises(bj.SpecError, match=re.escape(f"inside it (e.g. {sticky}/jax_cache)")):
        enable_compilation_cache(str(sticky))
    with pytest.raises(bj.SpecError, match="/tmp is writable by other users"):
        check_cache_dir("/tmp")
    enable_compilation_cache(str(sticky / "mine" / "jax"))
    assert (sticky / "mine" / "jax").stat().st_mode & 0o077 == 0


def test_a_compilation_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    import os

    mine = tmp_path / "cache"
    mine.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(mine).st_uid + 1)
    with pytest.raises(bj.SpecError, match="belongs to uid"):
        enable_compilation_cache(str(mine))
