"""One version everywhere: pyproject, ``beam_jax.__version__``, the image tags the docs show,
and a released CHANGELOG section in Keep-a-Changelog form."""

import pathlib
import re

import pytest

import beam_jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Keep a Changelog's section names (https://keepachangelog.com/en/1.1.0/).
KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
IMAGE_TAG = re.compile(r"beam-jax-(?:cpu|gpu):([0-9][\w.]*)")


def _pyproject_version() -> str:
    # tomllib is Python 3.11+; the project supports 3.10.
    project = (ROOT / "pyproject.toml").read_text().split("\n[project]\n", 1)[1]
    return re.search(r'^version = "([^"]+)"$', project, re.M)[1]


def test_pyproject_and_the_package_agree():
    assert _pyproject_version() == beam_jax.__version__


def _pages():
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").rglob("*.md"))


def test_every_image_tag_in_the_docs_is_this_version():
    tags = {}
    for page in _pages():
        for tag in IMAGE_TAG.findall(page.read_text()):
            tags.setdefault(tag, []).append(page.name)
    assert tags, "no page shows an image tag any more: drop this test or the pattern"
    assert set(tags) == {beam_jax.__version__}, tags


def _changelog() -> list[tuple[str, list[str]]]:
    """``[(version heading, [its ### headings])]`` in file order."""
    sections: list[tuple[str, list[str]]] = []
    for line in (ROOT / "CHANGELOG.md").read_text().splitlines():
        if line.startswith("## "):
            sections.append((line[3:], []))
        elif line.startswith("### "):
            assert sections, f"{line!r} before any version heading"
            sections[-1][1].append(line[4:])
    return sections


def test_the_changelog_has_a_released_section_for_this_version():
    sections = _changelog()
    names = [name for name, _ in sections]
    assert names[0] == "[Unreleased]", names
    released = [re.fullmatch(r"\[([\w.]+)\] - (\d{4}-\d{2}-\d{2})", n) for n in names[1:]]
    assert all(released), f"a version heading not of the form '[X.Y.Z] - YYYY-MM-DD': {names}"
    versions = [m[1] for m in released]
    assert versions[0] == beam_jax.__version__, versions
    assert len(versions) == len(set(versions)), versions
    dates = [m[2] for m in released]
    assert dates == sorted(dates, reverse=True), dates


@pytest.mark.parametrize("index", range(len(_changelog())))
def test_each_changelog_section_uses_each_kind_once(index):
    name, kinds = _changelog()[index]
    assert set(kinds) <= KINDS, f"{name}: {kinds}"
    assert len(kinds) == len(set(kinds)), f"{name}: a heading repeats: {kinds}"
