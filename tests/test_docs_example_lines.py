"""docs/embed_text.md's example summary line and dead letter read as the job writes them:
the job is run on a small input with a null text, and the page's lines must have the same
shape (numbers aside) and the same message."""

from __future__ import annotations

import json
import pathlib
import re

import pyarrow as pa
import pyarrow.parquet as pq

from tests import flagship as ft

PAGE = pathlib.Path(__file__).parent.parent / "docs" / "embed_text.md"


def _shape(line: str) -> str:
    """The line with numbers as N, the per-stage dead-letter counts left out, the
    batching (packed or bucketed, chosen at launch) as B, and each counted noun as its
    count wants it (``1 dead letter``, ``2 dead letters``) written singular."""
    line = re.sub(r" \((?:[a-z]+ \d+(?:, )?)+\)", "", line)
    line = re.sub(r"\b(?:packed|bucketed),", "B,", line)
    line = re.sub(
        r"\b(\d[\d,]*) ((?:dead |unreadable |compiled )?[a-z]{3,})\b",
        lambda m: f"{m[1]} {_singular(m[2])}",
        line,
    )
    return re.sub(r"\d[\d,]*(?:\.\d+)?", "N", line)


def _singular(word: str) -> str:
    return word[:-2] if word.endswith("ches") else word.removesuffix("s")


def _page_block(start: str) -> str:
    """The page's first fenced block that starts with ``start``."""
    blocks, block = [], None
    for line in PAGE.read_text().splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block = []
            else:
                blocks.append("\n".join(block))
                block = None
        elif block is not None:
            block.append(line)
    return next(b for b in blocks if b.lstrip().startswith(start))


def test_the_page_s_summary_line_and_dead_letter_are_the_job_s(tmp_path, capsys):
    source = tmp_path / "part-3.parquet"
    pq.write_table(pa.table({"id": [1206, 1207], "text": ["A fine text.", None]}), source)
    ft.run(source, tmp_path / "out", "--no-progress")
    line = next(r for r in capsys.readouterr().out.splitlines() if " rows -> " in r)
    page_line = _page_block("embed_text: ").strip()
    assert _shape(page_line) == _shape(line), (page_line, line)
    real = json.loads(ft.dead_letter_lines(tmp_path / "out")[0])
    shown = json.loads(_page_block('{"key"').replace('"traceback": "..."', '"traceback": ""'))
    assert set(shown) == set(real)
    for field in ("key_type", "stage", "error_type", "message", "element"):
        assert shown[field] == real[field], field
