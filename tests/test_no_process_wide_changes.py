"""Importing beam_jax changes nothing process-wide: Beam's state samplers and the garbage
collector are touched only by a job's explicit call (``jobs.prompt_bundle_ends``,
``jobs.freeze_startup_objects``), and given back when it ends."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.processes import worker_env

_STATE = """
import gc
from apache_beam.runners.worker import statesampler

def state():
    return {
        "sampler_defaults": list(statesampler.StateSampler.__init__.__defaults__ or ()),
        "gc_enabled": gc.isenabled(),
        "gc_threshold": list(gc.get_threshold()),
        "gc_frozen": gc.get_freeze_count() > 0,
    }
"""

_IMPORTS = """
import json, pkgutil, importlib
before = state()
import beam_jax
public = [m.name for m in pkgutil.iter_modules(beam_jax.__path__, "beam_jax.")
          if not m.name.rsplit(".", 1)[1].startswith("_")]
for name in public:
    importlib.import_module(name)
import pipelines.curate, pipelines.embed, pipelines.embed_yaml  # imported, not run
print(json.dumps({"modules": public, "before": before, "after": state()}))
"""

_EXPLICIT = """
import json
from beam_jax import jobs
before = state()
with jobs.freeze_startup_objects(), jobs.prompt_bundle_ends(period_ms=10):
    during = state()
print(json.dumps({"before": before, "during": during, "after": state()}))
"""


def _run(script: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _STATE + script],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_beam_jax_and_its_public_modules_leaves_samplers_and_gc_alone():
    got = _run(_IMPORTS)
    assert {"beam_jax.jobs", "beam_jax.internal", "beam_jax.text"} <= set(got["modules"])
    assert got["after"] == got["before"]
    assert not got["before"]["gc_frozen"]


def test_a_job_s_explicit_calls_change_both_while_it_runs_and_give_them_back():
    got = _run(_EXPLICIT)
    assert got["during"]["sampler_defaults"] == [10] != got["before"]["sampler_defaults"]
    assert got["during"]["gc_frozen"] and not got["before"]["gc_frozen"]
    assert got["after"] == got["before"]
