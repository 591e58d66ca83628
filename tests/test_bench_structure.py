"""The benchmarks stay readable: no module of ``bench/`` over 520 lines as ``ruff format``
writes it; a longer one is split by concept (as ``bench/embed_text.py`` is into its variants,
the runs, the figures and the printing), with what they share in ``bench/harness.py``."""

from __future__ import annotations

import pathlib

from tests.test_pipelines_structure import _formatted_lines

BENCH = pathlib.Path(__file__).parent.parent / "bench"
MAX_LINES = 520


def test_every_bench_module_stays_under_520_lines_as_ruff_formats_it():
    lines = {p.name: _formatted_lines(p) for p in sorted(BENCH.glob("*.py"))}
    assert "embed_text.py" in lines and "harness.py" in lines
    over = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not over, over
