"""Arrow columns as spec leaves: decode and validate whole record batches (vectorised numpy).

A record batch is never turned into per-row Python objects: each leaf's column becomes one
flat numpy array of values plus, per row, where its values start and its length along the
leaf's first axis, computed from the Arrow list offsets. Checks run over whole columns, and
only rows that fail get a message.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from beam_jax._src.core import messages
from beam_jax._src.core.dtypes import can_cast, kind
from beam_jax._src.core.spec import ArraySpec, Layout
from beam_jax._src.core.validation import cast_checked
from beam_jax._src.errors import InvalidElementError, SpecError


@dataclasses.dataclass
class ColumnLeaf:
    """One leaf of a decoded record batch.

    Attributes:
        values: every value of the column, flat (rows that failed may hold anything).
        start: per row, the index in ``values`` of its first value.
        item: how many values one step along the leaf's first axis holds.
    """

    values: np.ndarray
    start: np.ndarray
    item: int


@dataclasses.dataclass
class DecodedBatch:
    """A record batch as leaves, lengths and per-row failures.

    Attributes:
        num_rows: rows in the batch.
        ids: the id column (``None`` without one).
        leaves: one ``ColumnLeaf`` per spec leaf.
        lengths: ``int64[num_rows, num_axes]``, the length of each ragged axis (after
            truncation when ``oversize="truncate"``).
        failed: ``bool[num_rows]``: the row goes to the dead letters.
        describe_failure: ``row -> exception`` for a failed row.
    """

    num_rows: int
    ids: pa.Array | None
    leaves: list[ColumnLeaf]
    lengths: np.ndarray
    failed: np.ndarray
    describe_failure: Callable[[int], Exception]
    _id_values: np.ndarray | None | bool = dataclasses.field(default=False, repr=False)

    def row_key(self, row: int) -> Any:
        return None if self.ids is None else self.ids[row].as_py()

    def id_values(self) -> np.ndarray | None:
        """The id column as numpy (no copy) when it is integers or floats without nulls,
        so rows' ids are gathered with numpy; else ``None`` (use ``ids``)."""
        if self._id_values is False:
            ids = self.ids
            numeric = ids is not None and ids.null_count == 0
            numeric = numeric and (pa.types.is_integer(ids.type) or pa.types.is_floating(ids.type))
            self._id_values = ids.to_numpy(zero_copy_only=False) if numeric else None
        return self._id_values

    def ids_of(self, rows: np.ndarray) -> np.ndarray | pa.Array | None:
        """The ids of ``rows``: a numpy gather where :meth:`id_values` allows, else an
        Arrow take; ``None`` without an id column."""
        if self.ids is None:
            return None
        numeric = self.id_values()
        return self.ids.take(pa.array(rows)) if numeric is None else numeric[rows]


class _Checks:
    """Per-row failures in priority order; the first failing check names the row's error."""

    def __init__(self, n: int):
        self.failed = np.zeros(n, bool)
        self.first = np.full(n, -1, np.int32)
        self.messages: list[Callable[[int], Exception]] = []

    def add(self, mask: np.ndarray, message: Callable[[int], Exception]) -> None:
        mask = np.asarray(mask, bool)
        if not mask.any():
            return
        new = mask & ~self.failed
        self.first[new] = len(self.messages)
        self.failed |= mask
        self.messages.append(message)

    def describe(self, row: int) -> Exception:
        return self.messages[self.first[row]](row)


def _range_any(flags: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per row, whether any of ``flags[lo:hi]`` is set (vectorised with one cumsum).

    Flags are usually all clear (a check that every value passed): that is found with one
    ``any`` and no cumsum (whose cast of every flag holds the interpreter lock).
    """
    if not flags.any():
        return np.zeros(len(lo), bool)
    counts = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    return counts[hi] - counts[lo] > 0


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _valid(array: pa.Array) -> np.ndarray | None:
    if array.null_count == 0:
        return None
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), bool)


def _offsets(array: pa.Array) -> np.ndarray:
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        return (np.arange(len(array) + 1, dtype=np.int64) + array.offset) * size
    return np.asarray(array.offsets, np.int64)


def _primitive_values(array: pa.Array) -> np.ndarray:
    if array.null_count:
        array = array.fill_null(False if pa.types.is_boolean(array.type) else 0)
    return np.asarray(array.to_numpy(zero_copy_only=False))


def decode_leaf(
    column: pa.Array,
    spec: ArraySpec,
    name: str,
    checks: _Checks,
    ids: Callable[[int], str],
    *,
    casting: str,
    nonfinite: str,
) -> tuple[ColumnLeaf, np.ndarray]:
    """Decode one column for ``spec``; returns the leaf and each row's first-axis length.

    Failures are added to ``checks``; the returned arrays are meaningful for other rows.
    """
    n = len(column)
    rank = len(spec.shape)
    item = math.prod(spec.shape[1:]) if rank else 1
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        decoded = _binary_layout(column, spec, name, checks, ids, item)
    else:
        decoded = _list_layout(column, spec, name, checks, ids, item, casting)
    if decoded is None:  # the column's type cannot hold this leaf: every row fails
        zeros = np.zeros(n, np.int64)
        return ColumnLeaf(np.zeros(0, spec.dtype), zeros, item), zeros
    given, lo, hi, count = decoded
    values, lost = cast_checked(given, spec.dtype)
    if lost is not None and lost.any():
        checks.add(
            _range_any(lost, lo, hi),
            lambda r: messages.does_not_fit(
                f"{ids(r)}, column {name!r}", given[lo[r] : hi[r]][lost[lo[r] : hi[r]]], spec.dtype
            ),
        )
    if rank and not isinstance(spec.shape[0], str):
        checks.add(count != spec.shape[0], _fixed(name, ids, spec.shape, count))
    if nonfinite == "reject" and kind(values.dtype) in "fc":
        checks.add(
            _range_any(~np.isfinite(values), lo, hi),
            lambda r: messages.nonfinite(f"{ids(r)}, column {name!r}"),
        )
    if spec.valid_range is not None and len(values):
        low, high = spec.valid_range
        outside = (values < low) | (values >= high)
        if kind(values.dtype) == "f":
            outside |= np.isnan(values)
        checks.add(
            _range_any(outside, lo, hi),
            lambda r: messages.out_of_range(f"{ids(r)}, column {name!r}", low, high),
        )
    return ColumnLeaf(values, lo, item), count


def _fail_all(column, name, checks, ids, reason: str) -> None:
    checks.add(
        np.ones(len(column), bool),
        lambda r: InvalidElementError(
            f"{ids(r)}: column {name!r} has type {column.type}; {reason}"
        ),
    )


def _list_layout(column, spec, name, checks, ids, item, casting):
    """Nested lists: ``(values, lo, hi, count)`` with rows' value ranges ``[lo, hi)``."""
    rank = len(spec.shape)
    levels: list[tuple[np.ndarray, np.ndarray | None, pa.DataType]] = []
    array = column
    while _is_list(array.type):
        levels.append((_offsets(array), _valid(array), array.type))
        array = array.values
    depth = len(levels)
    if (rank == 0 and depth) or (rank and not 1 <= depth <= rank) or _not_numeric(array.type):
        what = "a plain column" if rank == 0 else f"1 to {rank} nested lists"
        _fail_all(
            column,
            name,
            checks,
            ids,
            f"expected {what} of {spec.dtype} (or binary) for shape {spec.shape}.",
        )
        return None
    if rank == 0:
        if column.null_count:
            checks.add(~_valid(column), _null(name, ids))
        lo = np.arange(len(column), dtype=np.int64)
        hi, count = lo + 1, np.ones(len(column), np.int64)
    else:
        off0, valid0, _ = levels[0]
        if valid0 is not None:
            checks.add(~valid0, _null(name, ids))
        lo, hi = off0[:-1], off0[1:]
        count = hi - lo
        for j in range(1, depth):
            off, valid, level_type = levels[j]
            want = spec.shape[j] if j < depth - 1 else math.prod(spec.shape[j:])
            if pa.types.is_fixed_size_list(level_type):
                bad = np.full(len(off) - 1, level_type.list_size != want)
            else:
                bad = np.diff(off) != want
            if valid is not None:
                bad |= ~valid
            checks.add(_range_any(bad, lo, hi), _inner(name, ids, j, want, spec.shape))
            lo, hi = off[lo], off[hi]
        if depth == 1 and item > 1:
            checks.add(count % item != 0, _flat(name, ids, item, spec.shape, count))
            count = count // item
    values = _primitive_values(array)
    if array.null_count:
        null_values = ~np.asarray(array.is_valid().to_numpy(zero_copy_only=False), bool)
        checks.add(_range_any(null_values, lo, hi), _null_values(name, ids))
    if not can_cast(values.dtype, spec.dtype, casting):
        checks.add(
            np.ones(len(column), bool),
            lambda r: messages.cannot_cast(
                f"{ids(r)}, column {name!r} of type {column.type}",
                values.dtype,
                spec.dtype,
                casting,
            ),
        )
        return None
    return values, lo, hi, count


def _binary_layout(column, spec, name, checks, ids, item):
    """Raw bytes of the spec's dtype, row-major: ``(values, lo, hi, count)``.

    The data buffer is viewed without a copy when every usable row starts on a multiple
    of the dtype's size. Otherwise (a row of the wrong byte length earlier in the batch
    shifts the rows after it) the usable rows' bytes are gathered once into an aligned
    buffer, so only the rows that are wrong fail.
    """
    size = spec.dtype.itemsize
    n = len(column)
    width = np.dtype(np.int64 if pa.types.is_large_binary(column.type) else np.int32)
    _, offsets_buffer, data = column.buffers()
    offsets = np.frombuffer(
        offsets_buffer, width, count=n + 1, offset=column.offset * width.itemsize
    ).astype(np.int64)
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    valid = _valid(column)
    if valid is not None:
        checks.add(~valid, _null(name, ids))
    nbytes = offsets[1:] - offsets[:-1]
    want = item * size
    bad = nbytes % want != 0
    if not spec.shape:
        bad |= nbytes != size
    checks.add(
        bad,
        lambda r: InvalidElementError(
            f"{ids(r)}: column {name!r} holds {int(nbytes[r])} bytes; as raw {spec.dtype} "
            f"values of shape {spec.shape} it needs {_bytes_wanted(spec, want)}."
        ),
    )
    usable = ~bad if valid is None else ~bad & valid
    shifted = offsets[:-1] % size != 0
    if raw.ctypes.data % spec.dtype.alignment:
        shifted[:] = True
    if (usable & shifted).any():
        raw, offsets = _gather_rows(raw, offsets, usable)
    values = raw[: len(raw) // size * size].view(spec.dtype)
    lo, hi = offsets[:-1] // size, offsets[1:] // size
    return values, lo, hi, (hi - lo) // item


def _bytes_wanted(spec: ArraySpec, want: int) -> str:
    if not spec.shape:
        return f"exactly {want} bytes"
    if isinstance(spec.shape[0], str):
        return f"a multiple of {want} bytes"
    return f"{want * spec.shape[0]} bytes"


def _gather_rows(raw: np.ndarray, offsets: np.ndarray, keep: np.ndarray):
    """The bytes of the ``keep`` rows, one after another in a new buffer (numpy's, so
    aligned), and every row's offsets into it (rows not kept are empty)."""
    nbytes = np.where(keep, offsets[1:] - offsets[:-1], 0)
    new_offsets = np.zeros(len(offsets), np.int64)
    np.cumsum(nbytes, out=new_offsets[1:])
    total = int(new_offsets[-1])
    # Byte j of the new buffer is byte ``j - new_start + old_start`` of its row.
    shift = np.repeat(offsets[:-1] - new_offsets[:-1], nbytes)
    return raw[np.arange(total, dtype=np.int64) + shift], new_offsets


def _not_numeric(t: pa.DataType) -> bool:
    return not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _null(name, ids):
    return lambda r: InvalidElementError(
        f"{ids(r)}: column {name!r} is null; expected a value. Filter nulls out first."
    )


def _null_values(name, ids):
    return lambda r: InvalidElementError(
        f"{ids(r)}: column {name!r} holds null values; expected numbers everywhere."
    )


def _inner(name, ids, level, want, shape):
    return lambda r: InvalidElementError(
        f"{ids(r)}: column {name!r} has a null or wrong-sized list at nesting level {level}; "
        f"expected every such list to hold {want} entries for shape {shape}."
    )


def _flat(name, ids, item, shape, count):
    return lambda r: InvalidElementError(
        f"{ids(r)}: column {name!r} holds {int(count[r])} values, not a multiple of {item}; "
        f"a flat list for shape {shape} needs {item} values per step of the first axis."
    )


def _fixed(name, ids, shape, count):
    return lambda r: InvalidElementError(
        f"{ids(r)}: column {name!r} has {int(count[r])} entries along axis 0; expected "
        f"{shape[0]} for shape {shape}."
    )


def decode_batch(
    batch: pa.RecordBatch,
    *,
    layout: Layout,
    columns: tuple[str, ...],
    id_column: str | None,
    validation: Any,
    max_sizes: Mapping[str, int],
    truncate: bool,
    too_long: Callable[..., Exception] = messages.too_long,
) -> DecodedBatch:
    """Decode and validate every row of ``batch`` against the element spec.

    Raises:
        SpecError: a mapped column is missing from the batch.
    """
    names = batch.schema.names
    for column in (*columns, *([id_column] if id_column else [])):
        if column not in names:
            raise SpecError(
                f"column {column!r} is not in the record batch, whose columns are {names}; "
                "fix ArrowColumns or the columns read."
            )
    n = batch.num_rows
    ids = batch.column(id_column) if id_column else None

    def where(row: int) -> str:
        key = "?" if ids is None else repr(ids[row].as_py())
        return f"row {row} (id {key})" if ids is not None else f"row {row}"

    checks = _Checks(n)
    leaves = []
    axis_lengths: dict[str, np.ndarray] = {}
    first_seen: dict[str, str] = {}
    for spec, column_name in zip(layout.specs, columns, strict=True):
        leaf, count = decode_leaf(
            batch.column(column_name),
            spec,
            column_name,
            checks,
            where,
            casting=validation.casting,
            nonfinite=validation.nonfinite,
        )
        leaves.append(leaf)
        if spec.ragged_axes:
            axis = spec.shape[0]
            if axis in axis_lengths:
                other, prev = first_seen[axis], axis_lengths[axis]
                checks.add(
                    count != prev,
                    lambda r, a=axis, o=other, c=column_name, p=prev, q=count: (
                        messages.axis_mismatch(
                            a, f"{where(r)}, column {o!r}", int(p[r]), f"column {c!r}", int(q[r])
                        )
                    ),
                )
            else:
                axis_lengths[axis] = count
                first_seen[axis] = column_name
    lengths = (
        np.stack([axis_lengths[a] for a in layout.axis_names], axis=1)
        if layout.axis_names
        else np.zeros((n, 0), np.int64)
    )
    for k, axis in enumerate(layout.axis_names):
        col = lengths[:, k]
        if not validation.allow_empty:
            checks.add(
                col == 0,
                lambda r, a=axis: messages.empty_axis(a, f"{where(r)}, column {first_seen[a]!r}"),
            )
        top = max_sizes[axis]
        if truncate:
            lengths[:, k] = np.minimum(col, top)
        else:
            checks.add(
                col > top,
                lambda r, a=axis, c=col, t=top: too_long(
                    a, int(c[r]), f"{where(r)}, column {first_seen[a]!r}", t
                ),
            )
    if validation.max_element_bytes is not None:
        nbytes = np.zeros(n, np.int64)
        for spec, leaf in zip(layout.specs, leaves, strict=True):
            steps = (
                lengths[:, layout.axis_names.index(spec.shape[0])]
                if spec.ragged_axes
                else (spec.shape[0] if spec.shape else 1)
            )
            nbytes += steps * leaf.item * spec.dtype.itemsize
        limit = validation.max_element_bytes
        checks.add(
            nbytes > limit, lambda r: messages.too_many_bytes(where(r), int(nbytes[r]), limit)
        )
    return DecodedBatch(n, ids, leaves, lengths, checks.failed, checks.describe)
