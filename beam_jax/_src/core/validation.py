"""Checking one element against its spec before it is batched (pure numpy)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from beam_jax._src.core import messages
from beam_jax._src.core.dtypes import can_cast, kind
from beam_jax._src.core.spec import ArraySpec, Layout, path_str
from beam_jax._src.errors import InvalidElementError, SpecError

Casting = Literal["no", "equiv", "safe", "same_kind"]
_CASTINGS = ("no", "equiv", "safe", "same_kind")


@dataclasses.dataclass(frozen=True)
class Validation:
    """What an element must satisfy to reach the kernel.

    Examples:
        >>> Validation(nonfinite="reject", max_element_bytes=1 << 20).casting
        'same_kind'

    Args:
        casting: numpy casting rule from the element's dtype to the spec's dtype. The default
            ``"same_kind"`` accepts float64 for a float32 spec (and float32 for a bfloat16
            one), rounding, but rejects strings, objects and complex numbers for a real spec.
        nonfinite: ``"pass"`` lets NaN/Inf inputs through; ``"reject"`` dead-letters them.
        allow_empty: whether a ragged axis may have length 0.
        max_element_bytes: reject elements larger than this many bytes (after casting).
        check_outputs_finite: dead-letter elements whose kernel outputs hold NaN or Inf.
    """

    casting: Casting = "same_kind"
    nonfinite: Literal["pass", "reject"] = "pass"
    allow_empty: bool = False
    max_element_bytes: int | None = None
    check_outputs_finite: bool = False

    def __post_init__(self):
        if self.casting not in _CASTINGS:
            raise SpecError(f"casting must be one of {_CASTINGS}, got {self.casting!r}.")
        if self.nonfinite not in ("pass", "reject"):
            raise SpecError(f"nonfinite must be 'pass' or 'reject', got {self.nonfinite!r}.")
        if self.max_element_bytes is not None and self.max_element_bytes <= 0:
            raise SpecError(
                f"max_element_bytes must be positive or None, got {self.max_element_bytes!r}."
            )


@dataclasses.dataclass(frozen=True, eq=False)
class Validated:
    """An element that passed validation: cast leaves and the length of each ragged axis."""

    leaves: tuple[np.ndarray, ...]
    lengths: tuple[int, ...]


_KEY_SCALARS = (str, bytes, int, float, bool, type(None), np.integer, np.floating, np.bool_)


def check_key(key: Any) -> None:
    """Reject keys that cannot be encoded deterministically (as GroupByKey and sinks need).

    Raises:
        InvalidElementError: ``key`` is not a str, bytes, number, bool, None, or a tuple of
            those.
    """
    if isinstance(key, _KEY_SCALARS):
        return
    if isinstance(key, tuple):
        for k in key:
            check_key(k)
        return
    raise InvalidElementError(
        f"the key of a keyed element must be a str, bytes, number, bool, None or a tuple of "
        f"those, received {type(key).__name__}; convert it (e.g. str(key)) before RunKernel."
    )


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray | np.generic):
        return f"array of shape {value.shape} and dtype {value.dtype}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _expected(spec: ArraySpec) -> str:
    return f"an array of shape {spec.shape} and dtype {spec.dtype}"


def _check_structure(spec: Any, value: Any, path: tuple) -> None:
    if isinstance(spec, ArraySpec):
        return
    if isinstance(spec, Mapping):
        if not isinstance(value, Mapping):
            raise InvalidElementError(
                f"at {path_str(path)}: expected a dict with keys {sorted(spec)}, received "
                f"{_describe(value)}."
            )
        if value.keys() != spec.keys():
            missing = sorted(set(spec) - set(value), key=str)
            extra = sorted(set(value) - set(spec), key=str)
            parts = []
            if missing:
                parts.append(f"missing keys {missing}")
            if extra:
                parts.append(f"unexpected keys {extra}")
            raise InvalidElementError(
                f"at {path_str(path)}: {' and '.join(parts)}; expected exactly the keys "
                f"{sorted(spec, key=str)}, received keys {sorted(value, key=str)}."
            )
        for k, sub in spec.items():
            if not isinstance(sub, ArraySpec):
                _check_structure(sub, value[k], (*path, _DictKey(k)))
        return
    if isinstance(spec, list | tuple):
        if not isinstance(value, list | tuple) or len(value) != len(spec):
            raise InvalidElementError(
                f"at {path_str(path)}: expected a {type(spec).__name__} of {len(spec)} entries, "
                f"received {_describe(value)}."
            )
        for i, (s, v) in enumerate(zip(spec, value, strict=True)):
            _check_structure(s, v, (*path, _SeqKey(i)))
        return
    raise SpecError(f"unsupported container {type(spec).__name__} in the element spec.")


class _DictKey:
    # Mirrors jax.tree_util.DictKey for path_str without importing jax internals.
    def __init__(self, key):
        self.key = key

    def __str__(self):
        return f"[{self.key!r}]"


class _SeqKey:
    def __init__(self, idx):
        self.idx = idx

    def __str__(self):
        return f"[{self.idx}]"


def _get(value: Any, path: tuple) -> Any:
    for entry in path:
        if hasattr(entry, "key"):
            value = value[entry.key]
        else:
            value = value[entry.idx]
    return value


def validate(
    layout: Layout,
    element: Any,
    *,
    validation: Validation,
    max_sizes: Mapping[str, int],
    truncate: bool,
    too_long: Callable[..., Exception] = messages.too_long,
) -> Validated:
    """Check ``element`` against ``layout`` and return its cast leaves and ragged lengths.

    Args:
        layout: the element spec.
        element: one record, a pytree of arrays shaped like the spec.
        validation: the checks to apply.
        max_sizes: the largest bucket boundary of each ragged axis.
        truncate: cut ragged axes longer than ``max_sizes`` instead of rejecting them.
        too_long: the error of a longer one otherwise (``messages.too_long``'s arguments).

    Returns:
        The validated element.

    Raises:
        InvalidElementError: the element does not match; the message says what was received
            and what was expected.
    """
    _check_structure(layout.tree, element, ())
    lengths: dict[str, int] = {}
    first_seen: dict[str, str] = {}
    raw = []
    for i, (path, spec) in enumerate(zip(layout.paths, layout.specs, strict=True)):
        where = layout.names[i]
        value = _get(element, path) if path else element
        if value is None or not (
            isinstance(value, _ARRAYS)
            or (hasattr(value, "__array__") and hasattr(value, "shape") and hasattr(value, "dtype"))
        ):
            raise InvalidElementError(
                f"at {where}: expected {_expected(spec)}, received {_describe(value)}; "
                "pass numpy (or jax) arrays, e.g. np.asarray(x, np.float32)."
            )
        value = value if type(value) is np.ndarray else _plain_array(value, f"at {where}")
        if not can_cast(value.dtype, spec.dtype, validation.casting):
            raise messages.cannot_cast(f"at {where}", value.dtype, spec.dtype, validation.casting)
        if value.ndim != len(spec.shape):
            raise InvalidElementError(
                f"at {where}: expected rank {len(spec.shape)} (shape {spec.shape}), received "
                f"rank {value.ndim} with shape {value.shape}."
            )
        for axis, (dim, got) in enumerate(zip(spec.shape, value.shape, strict=True)):
            if isinstance(dim, str):
                if dim in lengths and lengths[dim] != got:
                    raise messages.axis_mismatch(
                        dim, first_seen[dim], lengths[dim], f"{where} axis {axis}", got
                    )
                lengths.setdefault(dim, got)
                first_seen.setdefault(dim, f"{where} axis {axis}")
            elif dim != got:
                raise InvalidElementError(
                    f"at {where}: axis {axis} must have size {dim}, received shape "
                    f"{value.shape}; expected {_expected(spec)}."
                )
        raw.append(value)

    for name, n in lengths.items():
        if n == 0 and not validation.allow_empty:
            raise messages.empty_axis(name, first_seen[name])
        if n > max_sizes[name] and not truncate:
            raise too_long(name, n, first_seen[name], max_sizes[name])
    if truncate:
        lengths = {k: min(v, max_sizes[k]) for k, v in lengths.items()}

    leaves = []
    nbytes = 0
    for i, (spec, value) in enumerate(zip(layout.specs, raw, strict=True)):
        if truncate:
            index = tuple(
                slice(0, lengths[d]) if isinstance(d, str) else slice(None) for d in spec.shape
            )
            value = value[index]
        cast, lost = cast_checked(value, spec.dtype)
        if lost is not None and lost.any():
            raise messages.does_not_fit(f"at {layout.names[i]}", value[lost], cast.dtype)
        if validation.nonfinite == "reject" and kind(cast.dtype) in "fc":
            if not np.isfinite(cast).all():
                raise messages.nonfinite(f"at {layout.names[i]}")
        if spec.valid_range is not None and cast.size:
            low, high = spec.valid_range
            lo, hi = cast.min(), cast.max()
            if lo < low or hi >= high or (kind(cast.dtype) == "f" and np.isnan(cast).any()):
                raise messages.out_of_range(f"at {layout.names[i]}", low, high, (lo, hi))
        nbytes += cast.nbytes
        leaves.append(cast)
    if validation.max_element_bytes is not None and nbytes > validation.max_element_bytes:
        raise messages.too_many_bytes("at <element>", nbytes, validation.max_element_bytes)
    return Validated(tuple(leaves), tuple(lengths[n] for n in layout.axis_names))


def cast_checked(values: np.ndarray, dtype: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """``(cast, lost)``: ``values`` in ``dtype`` (no copy where they already are), and where
    the cast lost a value rather than rounding it: an integer outside a narrower integer
    type (it wrapped around), a finite number that overflowed to infinity (NaN in float8
    types without one). ``lost`` is ``None`` where the cast cannot lose one (a safe cast);
    an overflow is not warned of.

    Example:
        >>> cast, lost = cast_checked(np.array([1, 2**32 + 5], np.int64), np.int32)
        >>> cast.tolist(), lost.tolist()
        ([1, 5], [False, True])
    """
    with np.errstate(over="ignore"):  # the caller reports it, with the values
        cast = values.astype(dtype, copy=False)
    got, want = values.dtype, cast.dtype
    if got == want or can_cast(got, want, "safe"):
        return cast, None
    if kind(got) in "iu" and kind(want) in "iu":
        info = np.iinfo(want)
        return cast, (values < info.min) | (values > info.max)
    if kind(got) in "iuf" and kind(want) == "f":
        return cast, ~np.isfinite(cast) & np.isfinite(values)
    return cast, None


_ARRAYS = (np.ndarray, np.generic, int, float, complex)  # a Python number: a 0-d array


def _plain_array(value: Any, where: str) -> np.ndarray:
    """``value`` as a plain ndarray, refusing array types whose meaning would be lost.

    A masked array's mask, a matrix's 2-D-only semantics, a record array's fields and an
    object array's per-entry arrays would be silently dropped or reinterpreted by
    ``np.asarray``: masked arrays and matrices are rejected here by name (a masked array
    with nothing masked is plain data and passes); record and object arrays by
    ``messages.cannot_cast``, which names them.
    """
    if isinstance(value, np.ma.MaskedArray):
        if np.ma.getmask(value) is np.ma.nomask or not np.ma.getmaskarray(value).any():
            return np.asarray(np.ma.getdata(value))
        raise messages.hidden_semantics(
            where,
            value,
            f"with {int(np.ma.getmaskarray(value).sum())} masked entries whose mask would be "
            "dropped",
            "Fill the masked entries (x.filled(value)) and, if the kernel must skip them, pass "
            "the mask as a leaf of its own.",
        )
    if isinstance(value, np.matrix):
        raise messages.hidden_semantics(
            where,
            value,
            "which is always 2-D and redefines * and ** as matrix operations",
            "Pass np.asarray(m) (and reshape it to the spec's shape).",
        )
    return np.asarray(value)
