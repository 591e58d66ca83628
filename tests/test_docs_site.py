"""The documentation site is whole: every page in the nav, every public name in the reference.

`make docs` (run by `make test`) builds it with `mkdocs build --strict`, which fails on a
broken link, a nav entry to a missing page or a docstring the reference cannot render;
these tests keep what strict mode cannot see.
"""

import pathlib
import re

import yaml

import beam_jax as bj
import beam_jax.internal as internal
import beam_jax.jobs as jobs
import beam_jax.runners as runners
import beam_jax.text as text
import beam_jax.yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _nav_files(entries) -> list[str]:
    files = []
    for entry in entries:
        if isinstance(entry, str):
            files.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                files += _nav_files(value) if isinstance(value, list) else [value]
    return files


def _config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def _public(module) -> set[str]:
    subpackages = {
        "core",
        "kernel",
        "engine",
        "transforms",
        "arrow",
        "inference",
        "internal",
        "testing",
        "cli",
        "jobs",
        "text",
        "runners",
        "yaml",
    }
    return {n for n in dir(module) if not n.startswith("_")} - subpackages


def _documented(page: str, prefix: str) -> set[str]:
    text = (DOCS / "reference" / page).read_text()
    return set(re.findall(rf"^::: {re.escape(prefix)}\.(\w+)\s*$", text, re.M))


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = _config()
    assert config["strict"] is True
    nav = _nav_files(config["nav"])
    assert len(nav) == len(set(nav)), "a page is listed twice"
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert set(nav) == pages, (
        f"not in mkdocs.yml's nav: {sorted(pages - set(nav))}; "
        f"in the nav but missing: {sorted(set(nav) - pages)}"
    )
    assert nav[0] == "index.md"


def test_the_reference_lists_every_public_name():
    assert _documented("api.md", "beam_jax") == _public(bj) - {"__version__"}
    assert _documented("internal.md", "beam_jax.internal") == _public(internal)
    assert _documented("jobs.md", "beam_jax.jobs") == _public(jobs)
    assert _documented("text.md", "beam_jax.text") == _public(text)
    assert _documented("runners.md", "beam_jax.runners") == _public(runners)
    assert _documented("yaml.md", "beam_jax.yaml") == _public(beam_jax.yaml)


def test_readme_links_the_site_and_says_how_to_serve_it():
    readme = (ROOT / "README.md").read_text()
    assert "(docs/index.md)" in readme
    assert "mkdocs serve" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), link


def test_ci_builds_the_site_strictly():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: .*\bdocs\b", makefile, re.M)
    assert "mkdocs build --strict" in makefile
    # --quiet would drop the warnings, so that --strict never sees them.
    docs = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert docs and "--quiet" not in docs[1] and "-q " not in docs[1], docs
    assert "site/" in (ROOT / ".gitignore").read_text().split()


def test_blocks_inside_list_items_are_indented_four_spaces():
    # Python-Markdown (MkDocs) needs 4 spaces; with 2 a code block or table falls out of its
    # list item and the items after it render as literal "* " text.
    for page in sorted(DOCS.rglob("*.md")):
        for number, line in enumerate(page.read_text().splitlines(), 1):
            assert not re.match(r"^ {2}(```|\|)", line), f"{page.name}:{number}: {line!r}"
