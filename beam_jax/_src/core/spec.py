"""Element specs: what one record looks like, and which of its axes are ragged."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from beam_jax._src.core.dtypes import kind
from beam_jax._src.errors import SpecError

Dim = int | str


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """The shape, dtype and pad value of one leaf of an element.

    A dimension is either a fixed ``int`` or the ``str`` name of a ragged axis. Axes that
    share a name share one length per element (e.g. token ids and an attention mask).

    Examples:
        >>> import numpy as np
        >>> spec = ArraySpec(("L", 64), np.float32)
        >>> spec.ragged_axes
        ((0, 'L'),)

    Args:
        shape: one entry per axis: an ``int`` for a fixed size, a name for a ragged axis.
        dtype: the dtype the kernel receives (numeric, bool, or a JAX float type such as
            ``jnp.bfloat16``); inputs are cast to it (see ``casting``).
            ``None`` is allowed only in output specs, where it means "any".
        pad_value: the value written into padding.
        valid_range: optional ``(low, high)``; every value must satisfy ``low <= v < high``
            (e.g. ``(0, vocab_size)`` for token ids that index an embedding table, where an
            out-of-range id would silently gather garbage on an accelerator).
    """

    shape: tuple[Dim, ...]
    dtype: Any = np.float32
    pad_value: Any = 0
    valid_range: tuple[float, float] | None = None

    def __post_init__(self):
        if not isinstance(self.shape, Sequence) or isinstance(self.shape, str):
            raise SpecError(
                f"ArraySpec.shape must be a tuple of ints and axis names, got {self.shape!r}; "
                "e.g. ArraySpec(('L', 64))."
            )
        shape = tuple(self.shape)
        for dim in shape:
            ok_int = isinstance(dim, int | np.integer) and not isinstance(dim, bool) and dim >= 0
            ok_name = isinstance(dim, str) and dim.isidentifier()
            if not (ok_int or ok_name):
                raise SpecError(
                    f"ArraySpec.shape entries must be non-negative ints or identifier names of "
                    f"ragged axes, got {dim!r} in shape {shape!r}."
                )
        object.__setattr__(self, "shape", tuple(d if isinstance(d, str) else int(d) for d in shape))
        if self.dtype is not None:
            try:
                dtype = np.dtype(self.dtype)
            except TypeError as e:
                raise SpecError(f"ArraySpec.dtype {self.dtype!r} is not a numpy dtype.") from e
            if kind(dtype) in "OUSV":
                raise SpecError(
                    f"ArraySpec.dtype must be numeric or bool (bfloat16 and float8 included), "
                    f"got {dtype}; encode strings as integer ids before the kernel, and give "
                    "each field of a record its own leaf."
                )
            object.__setattr__(self, "dtype", dtype)
            try:
                given = np.asarray(self.pad_value)
                with np.errstate(over="ignore", invalid="ignore"):
                    pad = given.astype(dtype)
            except (TypeError, ValueError, OverflowError) as e:
                raise SpecError(
                    f"pad_value {self.pad_value!r} cannot be represented as {dtype}."
                ) from e
            # Rounding a float is fine; an integer cut, wrapped or turned to bool, or a
            # float overflowed to infinity (NaN in float8 types without one), would pad with
            # another value than the one given.
            if kind(given.dtype) not in "biufc":
                lost = False
            elif kind(dtype) in "biu":
                lost = np.any(pad != given)
            else:
                lost = np.any(~np.isfinite(pad) & np.isfinite(given))
            if lost:
                raise SpecError(
                    f"pad_value {self.pad_value!r} cannot be represented as {dtype}: it would "
                    f"pad with {pad.tolist()!r}. Give a value of the dtype's range (and an "
                    "integer for an integer dtype)."
                )

        if self.valid_range is not None:
            ok = (
                isinstance(self.valid_range, tuple)
                and len(self.valid_range) == 2
                and self.valid_range[0] < self.valid_range[1]
            )
            if not ok:
                raise SpecError(
                    f"valid_range must be a (low, high) tuple with low < high, got "
                    f"{self.valid_range!r}."
                )

    @property
    def ragged_axes(self) -> tuple[tuple[int, str], ...]:
        """``(axis, name)`` for each ragged axis."""
        return tuple((i, d) for i, d in enumerate(self.shape) if isinstance(d, str))

    def resolve(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The concrete shape with every ragged axis set to ``sizes[name]``."""
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.shape)


def _is_spec(x: Any) -> bool:
    return isinstance(x, ArraySpec)


def path_str(path: tuple) -> str:
    """A readable path such as ``['tokens'][0]``; ``<element>`` for the root."""
    return "".join(str(k) for k in path) if path else "<element>"


@dataclasses.dataclass(frozen=True)
class Layout:
    """A flattened pytree of ``ArraySpec``: leaves, their paths and the ragged axes.

    Args:
        tree: a pytree (dicts, lists, tuples) whose leaves are ``ArraySpec``.
    """

    tree: Any

    def __post_init__(self):
        leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(
            self.tree, is_leaf=_is_spec
        )
        if not leaves_with_path:
            raise SpecError(f"the element spec has no ArraySpec leaves: {self.tree!r}.")
        for path, leaf in leaves_with_path:
            if not isinstance(leaf, ArraySpec):
                raise SpecError(
                    f"every leaf of an element spec must be an ArraySpec, got {leaf!r} at "
                    f"{path_str(path)}; wrap it, e.g. ArraySpec(('L', 64), np.float32)."
                )
        object.__setattr__(self, "paths", tuple(p for p, _ in leaves_with_path))
        object.__setattr__(self, "specs", tuple(s for _, s in leaves_with_path))
        object.__setattr__(self, "treedef", treedef)
        object.__setattr__(self, "names", tuple(path_str(p) for p in self.paths))
        names: list[str] = []
        for spec in self.specs:
            for _, name in spec.ragged_axes:
                if name not in names:
                    names.append(name)
        object.__setattr__(self, "axis_names", tuple(names))

    paths: tuple = dataclasses.field(init=False, repr=False, compare=False)
    specs: tuple[ArraySpec, ...] = dataclasses.field(init=False, repr=False, compare=False)
    treedef: Any = dataclasses.field(init=False, repr=False, compare=False)
    names: tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)
    axis_names: tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        return self.treedef.unflatten(list(leaves))


def as_layout(spec: Any) -> Layout:
    """Accept a ``Layout``, a single ``ArraySpec`` or a pytree of them."""
    return spec if isinstance(spec, Layout) else Layout(spec)
