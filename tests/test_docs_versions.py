"""Beam versions the pages name are the locked one, unless they say when a fact was seen.

A page that says what Beam does now names the version ``requirements/lock.txt`` pins; a
minimum (``Beam 2.77 or newer``) is a floor ``pyproject.toml`` declares; any other version
is a record of a measurement: ``measured on Beam 2.77``, ``2.77's DirectRunner``, or a
version in parentheses, ``(2.77.0)``. A new lock then fails here on every page that would
go stale, instead of leaving "on Beam 2.77 the DirectRunner ..." behind."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
MENTION = re.compile(
    r"(?:Beam|Prism|beam|sdk:|prism-v|job-server-|job-server/|DirectRunner|Beam's)"
    r"[^.\n]{0,25}?(?<![\d.])(?P<version>2\.\d\d(?:\.\d+)?)(?![\d])"
)


def _locked() -> str:
    return re.search(r"^apache-beam==(\S+)$", (ROOT / "requirements/lock.txt").read_text(), re.M)[1]


def _floors() -> set[str]:
    return set(
        re.findall(r"apache-beam(?:\[[\w,]+\])?>=([\d.]+)", (ROOT / "pyproject.toml").read_text())
    )


def _pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _stale(text: str, locked: str, floors: set[str]) -> list[str]:
    """The mentions in ``text`` of a Beam version that is neither the lock's nor a floor nor
    marked as a record, each with its context."""
    out = []
    for m in MENTION.finditer(text):
        version = m["version"]
        before = text[max(0, m.start() - 80) : m.start("version")]
        after = text[m.end("version") : m.end("version") + 12]
        sentence = before.rsplit(". ", 1)[-1]
        if locked == version or locked.startswith(f"{version}."):
            continue
        floor = after.startswith((" or newer", " or later")) or before.endswith(">=")
        if floor and version in floors:
            continue
        if (
            "measured" in sentence.lower()
            or after.startswith("'s")
            or (before.endswith(("(", "(Beam ")) and after.startswith(")"))
        ):
            continue
        out.append(text[max(0, m.start() - 30) : m.end() + 30].replace("\n", " "))
    return out


def test_every_page_names_the_locked_beam_or_says_when_a_fact_was_seen():
    locked, floors = _locked(), _floors()
    stale = {p.name: s for p in _pages() if (s := _stale(p.read_text(), locked, floors))}
    assert not stale, (locked, stale)


def test_the_images_are_built_on_the_locked_beam():
    locked = _locked()
    for dockerfile in sorted((ROOT / "docker").glob("Dockerfile*")):
        tags = re.findall(r"^FROM apache/beam_python[\d.]+_sdk:(\S+)", dockerfile.read_text(), re.M)
        assert tags == [locked], (dockerfile.name, tags)


def test_the_check_finds_a_stale_mention_and_passes_the_marked_ones():
    text = (
        "On Beam 2.77 the DirectRunner downloads Prism. Beam 2.78.0 holds it. Beam 2.60 or "
        "newer. Measured on Beam 2.75: slow. Beam 2.74's runner. Prism (2.73.0) fires."
    )
    (stale,) = _stale(text, "2.78.0", {"2.60"})
    assert stale.startswith("On Beam 2.77 the DirectRunner"), stale
