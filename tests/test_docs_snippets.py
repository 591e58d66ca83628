"""The documentation's code runs: every ```python block of docs/, and every docstring example.

Each page runs in a fresh Python interpreter, in a scratch directory: its blocks in page
order, in one namespace (a page reads as one session), with nothing the reader cannot see on
the page (no hidden set-up, no module imported for it). JAX's dtype promotion is
``"strict"`` there, as docs/testing.md recommends for kernels: a kernel that multiplies
floats by a bool mask, or divides by an int length, fails the page. A block preceded by
the line ``<!-- docs-test: skip -->`` is not run; keep that rare (a block that needs a cloud
project or a cluster).
"""

import doctest
import importlib
import json
import os
import pathlib
import pkgutil
import re
import subprocess
import sys

import jax
import pytest

import beam_jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP = "<!-- docs-test: skip -->"
# A fence at the start of a line (blocks nested in lists are indented and are shell or
# config text on these pages), with the marker line, if any, just above it.
BLOCK = re.compile(
    r"^(?P<skip><!-- docs-test: skip -->\n)?```python\n(?P<code>.*?)^```", re.M | re.S
)
MAX_SKIPPED = 3
PAGE_TIMEOUT_S = 600
# What the fresh interpreter runs: the page's blocks, in order, in one namespace, each
# compiled under its own name so that a traceback names the page and the block.
RUNNER = """
import json, sys
import jax
jax.config.update("jax_numpy_dtype_promotion", "strict")
page, blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for i, code in blocks:
    exec(compile(code, f"{page} (python block {i})", "exec"), namespace)
"""


def python_blocks(page: pathlib.Path) -> list[tuple[str, bool]]:
    """``(code, skipped)`` for each ```python block of ``page``, in order."""
    return [(m["code"], bool(m["skip"])) for m in BLOCK.finditer(page.read_text())]


PAGES = sorted(p for p in DOCS.rglob("*.md") if any(not s for _, s in python_blocks(p)))


def run_page(page: pathlib.Path, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """Runs ``page``'s blocks in a fresh interpreter in ``cwd``, as a reader would."""
    blocks = [(i + 1, code) for i, (code, skipped) in enumerate(python_blocks(page)) if not skipped]
    env = dict(os.environ)
    # The project root on the path, as for a reader in the activated virtual environment
    # of an editable install; nothing else of the test set-up.
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps([str(page.relative_to(ROOT)), blocks]),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_page_snippets_run_in_a_fresh_interpreter(page, tmp_path):
    proc = run_page(page, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_a_kernel_that_multiplies_floats_by_a_bool_mask_fails_a_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nimport jax.numpy as jnp\nimport beam_jax as bj\n```\n\n"
        "```python\n(jnp.ones((4, 2)) * bj.length_mask(3, 4)[:, None]).sum()\n```\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(["page.md", [(i + 1, c) for i, (c, _) in enumerate(python_blocks(page))]]),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
    )
    assert proc.returncode != 0 and "page.md (python block 2)" in proc.stderr, proc.stderr


def test_few_blocks_are_skipped_and_every_marker_is_on_a_block():
    skipped = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        blocks = python_blocks(page)
        assert text.count(SKIP) == sum(s for _, s in blocks), (
            f"{page.name}: a {SKIP} marker not directly above a ```python fence"
        )
        skipped += [page.name for _, s in blocks if s]
    assert len(skipped) <= MAX_SKIPPED, f"too many blocks not run: {skipped}"


def test_no_page_hides_its_set_up():
    for page in sorted(DOCS.rglob("*.md")):
        assert "docs-test: setup" not in page.read_text(), (
            f"{page.name}: a hidden set-up block; show the set-up in a ```python block"
        )


def test_the_pages_that_promise_runnable_snippets_have_them():
    pages = {p.name for p in PAGES}
    for name in (
        "quickstart.md",
        "guide.md",
        "pitfalls.md",
        "dead_letters.md",
        "testing.md",
        "troubleshooting.md",
        "which_transform.md",
        "faq.md",
    ):
        assert name in pages, name


@pytest.fixture
def reader_jax_config():
    """JAX's default promotion rules for the duration of a test, as a reader has them."""
    saved = {
        name: getattr(jax.config, name)
        for name in ("jax_numpy_rank_promotion", "jax_numpy_dtype_promotion")
    }
    jax.config.update("jax_numpy_rank_promotion", "allow")
    jax.config.update("jax_numpy_dtype_promotion", "standard")
    yield
    for name, value in saved.items():
        jax.config.update(name, value)


MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(beam_jax.__path__, prefix="beam_jax.")
    if not m.name.split(".")[-1].startswith("__")
) + ["beam_jax"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch, reader_jax_config):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):  # only what the module itself defines
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
