"""Which Arrow columns feed which leaves of an element spec (the columnar path's mapping)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from beam_jax._src.core.spec import Layout
from beam_jax._src.errors import SpecError


def leaf_key(path: tuple) -> str:
    """A leaf's name for column mappings: dict keys and indices joined by ``.``."""
    parts = []
    for entry in path:
        for attr in ("key", "idx", "name"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return ".".join(parts)


@dataclasses.dataclass(frozen=True)
class ArrowColumns:
    """Which Arrow columns feed which leaves of the element spec, and which names a row.

    A leaf of spec ``(A0, d1, ..., dk)`` (``A0`` ragged or fixed) reads a column of
    ``D`` nested lists, ``1 <= D <= k + 1``: the outer list runs along ``A0``, each further
    level along the next axis, and the innermost list holds the remaining axes row-major.
    So an ``("L", 64)`` leaf reads ``list<list<float>>``, ``list<fixed_size_list<float,
    64>>`` or a flat ``list<float>`` of ``64 * L`` values; a scalar leaf reads a plain column.

    Examples:
        >>> cols = ArrowColumns(leaves={"x": "embedding"}, id="doc_id")
        >>> cols.leaves["x"]
        'embedding'

    Args:
        leaves: the column of each spec leaf, keyed by the leaf's name (dict keys and list
            indices joined by ``.``, e.g. ``"x"`` or ``"inputs.ids"``); a single ``str`` for
            a spec that is one ``ArraySpec``. Default: each leaf reads the column of its name.
        id: a column copied to every output batch and used as the dead letters' ``key``, so
            results and failures can be joined back to their rows. ``None`` leaves it out.
    """

    leaves: str | Mapping[str, str] | None = None
    id: str | None = None

    def __post_init__(self):
        if self.leaves is not None and not isinstance(self.leaves, str | Mapping):
            raise SpecError(
                f"ArrowColumns.leaves must be a column name or a mapping from leaf name to "
                f"column name, got {self.leaves!r}."
            )
        if isinstance(self.leaves, Mapping):
            object.__setattr__(self, "leaves", dict(self.leaves))
        if self.id is not None and not isinstance(self.id, str):
            raise SpecError(f"ArrowColumns.id must be a column name, got {self.id!r}.")

    def resolve(self, layout: Layout) -> tuple[str, ...]:
        """The column name of every leaf of ``layout``, in leaf order.

        Raises:
            SpecError: a leaf has no column, or the mapping names leaves the spec lacks.
        """
        keys = [leaf_key(p) for p in layout.paths]
        for i, spec in enumerate(layout.specs):
            if any(axis > 0 for axis, _ in spec.ragged_axes):
                raise SpecError(
                    f"leaf {keys[i] or '<element>'!r} has shape {spec.shape}: Arrow columns "
                    "carry a ragged axis only as a leaf's first axis. Reorder the axes, or use "
                    "RunKernel for this spec."
                )
        if isinstance(self.leaves, str):
            if len(keys) != 1:
                raise SpecError(
                    f"one column name {self.leaves!r} for a spec of {len(keys)} leaves "
                    f"{keys}; give a mapping, e.g. ArrowColumns(leaves={{{keys[0]!r}: ...}})."
                )
            return (self.leaves,)
        mapping = self.leaves or {}
        unknown = sorted(set(mapping) - set(keys))
        if unknown:
            raise SpecError(
                f"ArrowColumns.leaves names {unknown}, but the spec's leaves are {keys}."
            )
        out = []
        for key in keys:
            column = mapping.get(key, key)
            if not column:
                raise SpecError(
                    "the spec is a single ArraySpec: name its column, e.g. "
                    "ArrowColumns(leaves='x')."
                )
            out.append(column)
        return tuple(out)
