"""docs/troubleshooting.md quotes the jobs' messages as the code writes them: each message
quoted in its table of the jobs' command lines and inputs is found, in its parts, in the
sources of beam_jax and the pipelines (or is one Beam or argparse writes)."""

from __future__ import annotations

import argparse
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
# Words around the quoted parts that only an example holds (a path, a value, a count).
_EXAMPLE = re.compile(
    "|".join(
        [
            r"\.\.\.|\(\.\.\.\)",  # elided
            r"(?<![A-Za-z])'[^']*'|\[[^\]]*\]",  # quoted values and lists
            r"\b[A-Z]+\b|\d+|--[\w-]+",  # placeholders, numbers, flags
            r"\b\w+(?:\.\w+){2,}\b|[\w-]+\[\w+\]",  # module paths, packages[extras]
            r"\b(?:an? )?(?:int|float|str|number|string|int64)\b",  # types
        ]
    )
)


def _sources() -> str:
    """The sources, strings joined across lines (``"a " f"b"`` reads ``a b``) and each
    f-string's fields cut out (a message's parts between them are checked apart)."""
    paths = [*(ROOT / "beam_jax").rglob("*.py"), *(ROOT / "pipelines").rglob("*.py")]
    paths.append(pathlib.Path(argparse.__file__))  # its messages for a flag's bad value
    text = "\n".join(" ".join(p.read_text().split()) for p in paths)
    text = re.sub(r"\"\s*f?\"", "", text)
    return re.sub(r'\{[^{}"]*\}', "\x00", text)  # (a dict literal holds quotes: kept)


def _quoted_messages() -> list[str]:
    text = PAGE.read_text()
    section = text.split("## The jobs' command lines and inputs", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return [re.findall(r"`([^`]+)`", row.split(" | ")[0])[0] for row in rows[1:]]


def test_every_message_the_page_quotes_is_one_the_code_writes():
    sources = _sources()
    messages = _quoted_messages()
    assert len(messages) >= 12, messages
    for message in messages:
        # The message's fixed words, between what an example fills in.
        fixed = _EXAMPLE.split(message.removeprefix("dead letter "))
        pieces = [p.strip(" :;,.()?") for part in fixed for p in re.split(r"; |, or ", part)]
        pieces = [p for p in pieces if len(p) >= 12]
        assert pieces, message
        for piece in pieces:
            assert piece in sources, (message, piece)
