"""The documentation's code runs: every ```python block of docs/, and every docstring example.

A page's blocks run in order in one namespace (a page reads as one session), in a scratch
directory, under JAX's default promotion rules (a reader's, not conftest's strict ones). A
block preceded by the line ``<!-- docs-test: skip -->`` is not run; keep that rare (a block
that needs a cloud project or a cluster).

A page whose examples read what a reader already has (a flagship pipeline's output
directory ``OUTPUT``) may make it in a hidden setup block: one HTML comment before the
page's first ```python block, holding a ```python block of its own::

    <!-- docs-test: setup
    ```python
    from pipelines import embed_text
    embed_text.run(["--builtin_texts", "20", "--output", "OUTPUT", "--no-progress"])
    ```
    -->

MkDocs renders the comment as nothing; the test runs its code first, in the same namespace
and directory. Keep it rare (at most ``MAX_SETUP`` pages) and small: whatever a page's
readers need to define themselves belongs in a visible block.
"""

import doctest
import importlib
import pathlib
import pkgutil
import re

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
# A hidden setup block: an HTML comment holding one ```python block (see the docstring).
SETUP = re.compile(r"^<!-- docs-test: setup\n```python\n(?P<code>.*?)^```\n-->$\n?", re.M | re.S)
MAX_SKIPPED = 3
MAX_SETUP = 2


def setup_blocks(page: pathlib.Path) -> list[str]:
    """The code of each hidden setup block of ``page``, in order."""
    return [m["code"] for m in SETUP.finditer(page.read_text())]


def python_blocks(page: pathlib.Path) -> list[tuple[str, bool]]:
    """``(code, skipped)`` for each visible ```python block of ``page``, in order."""
    text = SETUP.sub("", page.read_text())
    return [(m["code"], bool(m["skip"])) for m in BLOCK.finditer(text)]


PAGES = sorted(p for p in DOCS.rglob("*.md") if any(not s for _, s in python_blocks(p)))


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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_page_snippets_run(page, tmp_path, monkeypatch, reader_jax_config):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for code in setup_blocks(page):
        exec(compile(code, f"{page.relative_to(ROOT)} (setup)", "exec"), namespace)  # noqa: S102
    for i, (code, skipped) in enumerate(python_blocks(page)):
        if skipped:
            continue
        source = compile(code, f"{page.relative_to(ROOT)} (python block {i + 1})", "exec")
        exec(source, namespace)  # noqa: S102 - the documentation's own code


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


def test_setup_blocks_are_rare_and_come_first():
    pages = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        setups = list(SETUP.finditer(text))
        assert text.count("docs-test: setup") == len(setups), (
            f"{page.name}: a docs-test: setup comment not of the form the docstring shows"
        )
        if setups:
            assert len(setups) == 1, f"{page.name}: more than one setup block"
            first = BLOCK.search(text, setups[0].end())
            assert first and not BLOCK.search(text, 0, setups[0].start()), (
                f"{page.name}: the setup block must come before the first ```python block"
            )
            pages.append(page.name)
    assert len(pages) <= MAX_SETUP, f"too many pages with a hidden setup block: {pages}"


def test_the_pages_that_promise_runnable_snippets_have_them():
    pages = {p.name for p in PAGES}
    for name in (
        "quickstart.md",
        "guide.md",
        "pitfalls.md",
        "dead_letters.md",
        "testing.md",
        "troubleshooting.md",
    ):
        assert name in pages, name


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
