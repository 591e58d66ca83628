"""The package as Dataflow ships it: built from setup.py, installed, run away from the repo.

Dataflow's ``--setup_file ./setup.py`` runs ``python setup.py sdist`` next to setup.py and
pip-installs the tarball on every worker. This test does the same into a fresh virtualenv
that sees this venv's dependencies (jax, Beam) through a ``.pth`` file but not the source
tree, then runs a small pipeline from a script in an empty directory.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("pyproject.toml", "setup.py", "README.md", "beam_jax", "pipelines")

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import apache_beam as beam
    import jax.numpy as jnp
    import numpy as np
    from apache_beam.options.pipeline_options import PipelineOptions
    import beam_jax as bj

    def kernel(params, element, lengths):
        mask = bj.length_mask(lengths["L"], element.shape[0]).astype(jnp.float32)
        return jnp.sum(element * mask) * params

    out_path = sys.argv[1]
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        results, dead = (
            p
            | beam.Create([(n, np.ones(n, np.float32)) for n in (1, 3, 5, 9)] + [(0, "bad")])
            | bj.RunKernel(
                kernel,
                spec=bj.ArraySpec(("L",), np.float32),
                bucketing=bj.Bucketing(boundaries={"L": (4, 16)}, batch_size=4),
                load_params=lambda: np.float32(2),
                keyed=True,
            ).with_exception_handling()
        )
        _ = (
            (results | beam.MapTuple(lambda k, v: json.dumps([k, float(v)])),
             dead | beam.Map(lambda d: json.dumps([d.key, d.stage])))
            | beam.Flatten()
            | beam.io.WriteToText(out_path, shard_name_template="")
        )
    print(json.dumps({"beam_jax": bj.__file__}))
    """
)


def _run(args: list[str], **kwargs) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=150, **kwargs)
    if proc.returncode:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _builds_without_isolation() -> bool:
    """Whether this venv can build a wheel offline (setuptools >= 70.1, or `wheel`)."""
    probe = (
        "import setuptools, importlib.util as u;"
        "v = tuple(int(x) for x in setuptools.__version__.split('.')[:2]);"
        "print(v >= (70, 1) or u.find_spec('wheel') is not None)"
    )
    return _run([sys.executable, "-c", probe]).strip() == "True"


def test_wheel_installs_and_runs_outside_the_repo(tmp_path):
    src, dist, wheels = tmp_path / "src", tmp_path / "dist", tmp_path / "wheels"
    src.mkdir()
    missing = [name for name in SOURCES if not os.path.exists(os.path.join(REPO, name))]
    assert not missing, f"{missing} missing from the repo; pyproject.toml needs them to build"
    for name in SOURCES:
        path = os.path.join(REPO, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)

    # What Beam's stager runs for --setup_file when the `build` module is absent.
    _run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(dist)], cwd=src)
    (sdist,) = glob.glob(str(dist / "*.tar.gz"))
    # With isolation pip fetches setuptools from PyPI; avoid that when this venv can build.
    isolation = ["--no-build-isolation"] if _builds_without_isolation() else []
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", "--no-deps", *isolation, "-w", str(wheels), sdist], cwd=tmp_path)
    (wheel,) = glob.glob(str(wheels / "beam_jax-*.whl"))

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = str(venv / "bin" / "python")
    # pip --python runs from this venv's pip, which sees this venv's packages: where the repo
    # is installed there (editable, as `make` does), it would call the wheel "already
    # satisfied" and skip it without --ignore-installed.
    _run([*pip, "--python", python, "install", "--no-deps", "--ignore-installed", wheel])
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    # The dependencies come from this venv; a path line in a .pth file adds the directory
    # but not the .pth files inside it, so an editable install of the repo stays invisible.
    with open(os.path.join(site.strip(), "project_deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "job.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["JAX_PLATFORMS"] = "cpu"
    out = json.loads(_run([python, "job.py", "out.txt"], cwd=run_dir, env=env).splitlines()[-1])

    assert os.path.realpath(out["beam_jax"]).startswith(os.path.realpath(venv)), out
    lines = (run_dir / "out.txt").read_text().splitlines()
    assert sorted(json.loads(line) for line in lines) == [
        [0, "validation"],
        [1, 2.0],
        [3, 6.0],
        [5, 10.0],
        [9, 18.0],
    ]
