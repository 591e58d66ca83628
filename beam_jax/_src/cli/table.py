"""Rows of dicts as aligned text columns, for ``beam-jax plan`` and ``beam-jax report``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["format_table"]


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of dicts as aligned text columns (floats with two decimals)."""
    if not rows:
        return ""
    heads = list(rows[0])
    cell = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[cell(r.get(h, "")) for h in heads] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    line = lambda vs: "  ".join(v.rjust(w) for v, w in zip(vs, widths, strict=True))  # noqa: E731
    return "\n".join([line(heads), *(line(c) for c in cells)])
