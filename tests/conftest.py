"""Test set-up: several CPU devices and strict JAX promotion, as the house style asks."""

import os
import tempfile

# The device check (tests/test_device.py, run by bench/device_check.sh) sets
# BEAM_JAX_REQUIRE_ACCELERATOR=1: JAX then takes the accelerator it finds, and the tests
# marked gpu run (and fail) where it finds none. BEAM_JAX_DEVICE_TESTS_ON_CPU=1 runs them
# on the CPU instead, to work on them without an accelerator.
REQUIRE_ACCELERATOR = os.environ.get("BEAM_JAX_REQUIRE_ACCELERATOR") == "1"
DEVICE_TESTS_ON_CPU = os.environ.get("BEAM_JAX_DEVICE_TESTS_ON_CPU") == "1"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
if not REQUIRE_ACCELERATOR:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Caches that jobs keep under ~/.cache (embed_text's compilation cache) go to a scratch
# directory, so tests neither read nor leave anything in the user's home.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="beam_jax_test_cache_")
# Worker processes (multi-process and portable runners) import test kernels from here.
_here = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_here, os.path.dirname(_here), *filter(None, [os.environ.get("PYTHONPATH")])]
)

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests: "ci" (the default) runs hypothesis's usual 100 examples where a test sets
# none; HYPOTHESIS_PROFILE=deep runs ten times as many (the costly pipeline fuzz in
# tests/test_reliability.py scales with it).
settings.register_profile("ci", max_examples=100)
settings.register_profile("deep", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


# `make test` gives each file to one of its workers (pytest-xdist --dist loadfile, with
# --no-loadscope-reorder so that xdist keeps this order instead of putting the files with
# the most tests first); a worker takes the next file when it is nearly done with its own.
# The longest files go first, so that none of them starts while the other worker is
# finishing: each of these took 2 to 8 minutes of a worker in `make test` on 2 cores
# (2847fc6), and test_fused_layer.py, added since, about 2; no other file took more than
# 2. The rest keep their collection order.
LONGEST_FILES = (
    "test_curate.py",
    "test_docs_snippets.py",
    "test_dask.py",
    "test_prism.py",
    "test_reliability.py",
    "test_minilm.py",
    "test_bench_embed.py",
    "test_embed_text.py",
    "test_bench.py",
    "test_device_check.py",
    "test_fused_layer.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
    if REQUIRE_ACCELERATOR or DEVICE_TESTS_ON_CPU:
        return  # tests/test_device.py fails each test itself if the accelerator is missing
    if any(d.platform != "cpu" for d in jax.devices()):
        return
    skip = pytest.mark.skip(reason="needs an accelerator")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
