"""The documentation and the API agree: every metric the docs name is readable."""

import dataclasses
import pathlib
import re

import beam_jax as bj
from beam_jax._src.engine.metrics import FLUSH_CAUSES, WAIT_BOUNDS_MS, KernelMetrics

GUIDE = pathlib.Path(__file__).parent.parent / "docs" / "guide.md"


def _metrics_table() -> list[tuple[list[str], list[str]]]:
    text = GUIDE.read_text()
    section = text[text.index("## Metrics") :]
    section = section[: section.index("\n## ", 4)]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows.append((re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+)`", cells[1])))
    return rows


def test_every_documented_metric_is_counted_and_read_into_summary():
    rows = _metrics_table()
    assert rows, "the guide lost its metrics table"
    documented_fields = {f for _, fields in rows for f in fields}
    summary_fields = {f.name for f in dataclasses.fields(bj.Summary)}
    assert documented_fields == summary_fields
    counters = set(vars(KernelMetrics("test_docs")))
    counters |= {f"dead_letters_{s}" for s in bj.Stage.ALL}
    # Cross-bundle mode's counters (BufferMetrics).
    counters |= {f"flushes_{c}" for c in FLUSH_CAUSES} | {"buffer_wait_ms", "buffer_wait_ms_over"}
    counters |= {f"buffer_wait_ms_le_{b}" for b in WAIT_BOUNDS_MS}
    for names, _ in rows:
        for name in names:
            expanded = name.replace("<stage>", bj.Stage.VALIDATION)
            expanded = expanded.replace("<cause>", "full").replace("<bound>", "1")
            assert expanded in counters, name
    assert {n for names, _ in rows for n in names} >= {
        c
        for c in vars(KernelMetrics("test_docs"))
        if c != "dead_letters_by_stage" and not c.startswith("_")  # _: the per-bucket ones
    }
