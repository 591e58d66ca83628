"""The private names of Beam and JAX that beam_jax uses live in ``_src/compat/`` alone, and
each is still where it was in the installed release: a release that moves one fails here,
naming the adapter to fix, not in a job."""

from __future__ import annotations

import ast
import pathlib
import threading

import jax
import pytest

import beam_jax as bj
from beam_jax._src.compat import beam as compat_beam
from beam_jax._src.compat import jax as compat_jax

ROOT = pathlib.Path(bj.__file__).parent
LIBRARIES = ("apache_beam", "jax", "jaxlib")


def _reaches_in(path: pathlib.Path) -> list[str]:
    """Where ``path`` imports a private module of Beam or JAX, reads a private attribute
    of one of their names, or assigns to an attribute of one (patching it)."""
    tree = ast.parse(path.read_text())
    theirs: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    theirs.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in LIBRARIES:
                if any(part.startswith("_") for part in node.module.split(".")):
                    found.append(f"line {node.lineno}: from {node.module} import")
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"line {node.lineno}: import {alias.name}")
                theirs |= {alias.asname or alias.name for alias in node.names}

    def root(node: ast.AST) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and root(node) in theirs:
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            if private or node.attr in ("__defaults__", "__code__", "__dict__"):
                found.append(f"line {node.lineno}: .{node.attr}")
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and root(target) in theirs:
                    found.append(f"line {node.lineno}: assigns .{target.attr}")
    return found


def test_only_the_compat_adapters_reach_into_beam_or_jax():
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in ROOT.rglob("*.py")
        if "compat" not in path.parts and (found := _reaches_in(path))
    }
    assert not offenders, offenders
    # The scan sees what it looks for: the adapters themselves are flagged.
    assert _reaches_in(ROOT / "_src" / "compat" / "beam.py")
    assert _reaches_in(ROOT / "_src" / "compat" / "jax.py")


def test_beams_internals_are_where_the_beam_adapter_reaches():
    from apache_beam.runners.direct import direct_runner
    from apache_beam.runners.direct.clock import TestClock
    from apache_beam.runners.worker import statesampler

    where = "beam_jax/_src/compat/beam.py: Beam moved an internal it uses"
    init = statesampler.StateSampler.__init__
    assert init.__defaults__ == (statesampler.DEFAULT_SAMPLING_PERIOD_MS,), where
    assert direct_runner.TestClock is TestClock, where
    sampler = statesampler.StateSampler("stage", None)
    assert isinstance(sampler._states_by_name, dict), where
    assert "metrics_container" in statesampler.StateSampler.scoped_state.__code__.co_varnames


def test_dataflows_internals_are_where_the_beam_adapter_reaches():
    apiclient = pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient")
    from apache_beam.runners.internal import names

    where = "beam_jax/_src/compat/beam.py: Beam moved a Dataflow internal it uses"
    client = apiclient.DataflowApplicationClient
    assert callable(client._apply_sdk_environment_overrides), where
    assert isinstance(apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION, str), where
    assert names.STAGED_PIPELINE_FILENAME, where


def test_dasks_internals_are_where_the_beam_adapter_reaches():
    pytest.importorskip("dask")
    import apache_beam as beam

    where = "beam_jax/_src/compat/beam.py: Beam moved a Dask runner internal it uses"
    primitives = compat_beam.dask_primitives()
    assert set(primitives) == {"Create", "Read", "Flatten", "GroupByKeyOnly", "Reshuffle"}
    assert all(issubclass(t, beam.PTransform) for t in primitives.values()), where
    options = {"npartitions": 3, "address": "tcp://127.0.0.1:1"}
    assert compat_beam.dask_bag_options(options) == {"npartitions": 3}, where
    assert options == {"address": "tcp://127.0.0.1:1"}, where  # the client keeps the rest


def test_jaxs_internals_are_where_the_jax_adapter_reaches():
    from jax._src import xla_bridge

    where = "beam_jax/_src/compat/jax.py: JAX moved an internal it uses"
    assert hasattr(xla_bridge._backend_lock, "acquire"), where
    assert isinstance(xla_bridge._backends, dict), where


def test_backends_opened_answers_without_waiting_for_an_opening():
    from jax._src import xla_bridge

    jax.devices()
    assert compat_jax.backends_opened() is True
    held, release = threading.Event(), threading.Event()

    def opening():  # as JAX holds its lock while it opens its backends
        with xla_bridge._backend_lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=opening)
    thread.start()
    held.wait(10)
    try:
        assert compat_jax.backends_opened() is None
    finally:
        release.set()
        thread.join()


def test_the_beam_adapters_give_back_what_they_change():
    from apache_beam.runners.direct import direct_runner
    from apache_beam.runners.direct.clock import TestClock
    from apache_beam.runners.worker import statesampler

    before = (
        statesampler.StateSampler.__init__.__defaults__,
        direct_runner.TestClock,
        statesampler.StateSampler.scoped_state,
    )
    clock = TestClock()
    with compat_beam.default_sampling_period(7) as applied:
        assert applied and statesampler.StateSampler("stage", None).sampling_period_ms == 7
        with compat_beam.default_sampling_period(9) as nested:  # set otherwise already
            assert not nested
        with compat_beam.direct_runner_clock(clock), compat_beam.metrics_per_bundle():
            assert direct_runner.TestClock() is clock
            assert statesampler.StateSampler.scoped_state is not before[2]
    after = (
        statesampler.StateSampler.__init__.__defaults__,
        direct_runner.TestClock,
        statesampler.StateSampler.scoped_state,
    )
    assert after == before
