"""Checking a whole batch of elements against the spec at once (numpy over the batch).

``validate_many`` gives exactly what ``validate`` gives element by element (the same
``Validated``, the same leaf objects, the same errors), at a few microseconds per element
instead of about fifteen: the checks run once per batch over the elements' shapes
(structure by the pytree definition, leaf types and dtypes, ranks, fixed sizes, ragged
lengths that agree, empty and too-long axes, element bytes), and only an element that does
not pass them all goes through ``validate`` itself, which then casts, truncates or explains.
So a bad element costs its own exact check and never changes its batch-mates' results.

Checks that read every value (``Validation(nonfinite="reject")``, an ``ArraySpec``'s
``valid_range``) run per element, through ``validate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from beam_jax._src.core.spec import Layout
from beam_jax._src.core.validation import Validated, Validation, validate


def _batch_checkable(layout: Layout, validation: Validation) -> bool:
    """Whether the batch checks decide every element of this spec (no per-value check)."""
    if validation.nonfinite == "reject":
        return False
    return all(spec.valid_range is None and spec.dtype is not None for spec in layout.specs)


def _fast_rows(
    layout: Layout,
    flat: list[list[Any] | None],
    validation: Validation,
    max_sizes: Mapping[str, int],
) -> tuple[np.ndarray, np.ndarray]:
    """``(ok, lengths)``: which elements pass every batch check (``bool[n]``) and their
    ragged lengths (``int64[n, num_axes]``, axes in ``layout.axis_names`` order)."""
    n = len(flat)
    ok = np.fromiter((leaves is not None for leaves in flat), bool, n)
    names = layout.axis_names
    lengths = np.zeros((n, len(names)), np.int64)
    seen = np.zeros(len(names), bool)
    nbytes = np.zeros(n, np.int64)
    rows = np.flatnonzero(ok)
    for j, spec in enumerate(layout.specs):
        want, rank = spec.dtype, len(spec.shape)
        leaves = [flat[i][j] for i in rows]
        # Exactly an ndarray of the spec's dtype: validate would return it as it is.
        typed = [type(x) is np.ndarray and x.dtype == want and x.ndim == rank for x in leaves]
        ok[rows[~np.asarray(typed, bool)]] = False
        rows = np.flatnonzero(ok)
        if not len(rows):
            break
        shapes = np.asarray([flat[i][j].shape for i in rows], np.int64).reshape(len(rows), rank)
        good = np.ones(len(rows), bool)
        for axis, dim in enumerate(spec.shape):
            got = shapes[:, axis]
            if isinstance(dim, str):
                k = names.index(dim)
                if seen[k]:
                    good &= lengths[rows, k] == got
                else:
                    lengths[rows, k] = got
                    seen[k] = True
            else:
                good &= got == dim
        nbytes[rows] += np.prod(shapes, axis=1) * want.itemsize
        ok[rows[~good]] = False
        rows = np.flatnonzero(ok)
    if names:
        limits = np.asarray([max_sizes[name] for name in names], np.int64)
        fits = (lengths <= limits).all(axis=1)
        if not validation.allow_empty:
            fits &= (lengths > 0).all(axis=1)
        ok &= fits
    if validation.max_element_bytes is not None:
        ok &= nbytes <= validation.max_element_bytes
    return ok, lengths


def validate_many(
    layout: Layout,
    elements: Sequence[Any],
    *,
    validation: Validation,
    max_sizes: Mapping[str, int],
    truncate: bool,
) -> list[Validated | Exception]:
    """``validate`` of each element, checked a batch at once: per element its
    ``Validated``, or the exception ``validate`` raises for it.

    Example:
        >>> from beam_jax import ArraySpec
        >>> from beam_jax._src.core.spec import as_layout
        >>> layout = as_layout({"x": ArraySpec(("L", 2), np.float32)})
        >>> good, bad = {"x": np.ones((3, 2), np.float32)}, {"x": np.ones((3, 5), np.float32)}
        >>> out = validate_many(layout, [good, bad], validation=Validation(),
        ...                     max_sizes={"L": 8}, truncate=False)
        >>> out[0].lengths, type(out[1]).__name__
        ((3,), 'InvalidElementError')

    Args:
        layout, validation, max_sizes, truncate: as for ``validate``.
        elements: the elements, in order.

    Returns:
        One entry per element, in order.
    """
    results: list[Validated | Exception] = [None] * len(elements)  # type: ignore[list-item]
    if _batch_checkable(layout, validation) and len(elements):
        treedef = layout.treedef
        flat: list[list[Any] | None] = []
        for element in elements:
            leaves, structure = jax.tree_util.tree_flatten(element)
            flat.append(leaves if structure == treedef else None)
        ok, lengths = _fast_rows(layout, flat, validation, max_sizes)
        rows = lengths.tolist()
        for i in np.flatnonzero(ok).tolist():
            results[i] = Validated(tuple(flat[i]), tuple(rows[i]))
        todo = np.flatnonzero(~ok).tolist()
    else:
        todo = range(len(elements))
    for i in todo:
        try:
            results[i] = validate(
                layout,
                elements[i],
                validation=validation,
                max_sizes=max_sizes,
                truncate=truncate,
            )
        except Exception as e:  # noqa: BLE001 - each invalid element is its caller's to report
            results[i] = e
    return results
