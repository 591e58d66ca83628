"""Every ``>>>`` example in ``pipelines/`` runs and shows what it says, as in beam_jax.

The same runner as ``test_docs_snippets.test_docstring_examples_run``: in a scratch
directory, under JAX's default promotion rules (a reader's), only what each module itself
defines.
"""

import doctest
import importlib
import pathlib

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for path in (ROOT / "pipelines").rglob("*.py")
    if not path.stem.startswith("__") and ">>>" in path.read_text()
)


@pytest.fixture
def reader_jax_config():
    """JAX's default promotion rules for the duration of a test, as a reader has them."""
    names = ("jax_numpy_rank_promotion", "jax_numpy_dtype_promotion")
    saved = {name: getattr(jax.config, name) for name in names}
    jax.config.update("jax_numpy_rank_promotion", "allow")
    jax.config.update("jax_numpy_dtype_promotion", "standard")
    yield
    for name, value in saved.items():
        jax.config.update(name, value)


def test_the_pipelines_with_examples_are_found():
    assert "pipelines.curate.model" in MODULES and len(MODULES) >= 10


@pytest.mark.parametrize("name", MODULES)
def test_pipelines_docstring_examples_run(name, tmp_path, monkeypatch, reader_jax_config):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, name) if t.examples]
    assert tests, f"{name} has '>>>' in its source but no example doctest finds"
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
