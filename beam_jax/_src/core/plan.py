"""The batching plan: buckets, batch sizes, padding and unpadding (pure numpy)."""

from __future__ import annotations

import abc
import bisect
import copy
import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from beam_jax._src.bucketing.buckets import Bucketing
from beam_jax._src.bucketing.rule import Bucket, bucket_index, default_batch_sizes, round_up
from beam_jax._src.core import messages
from beam_jax._src.core.batch_validation import validate_many
from beam_jax._src.core.outputs import BatchOutputs, check_outputs, split_rows
from beam_jax._src.core.spec import Layout, as_layout
from beam_jax._src.core.validation import Validated, Validation, validate
from beam_jax._src.errors import SpecError

_ALIGN = 64
_BUCKET_MEMO_SIZE = 1 << 16


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """``np.empty`` with the data 64-byte aligned: XLA:CPU reads an aligned host array in
    place, so a batch is not copied again on its way to the kernel (numpy aligns to 16)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def aligned_full(shape: tuple[int, ...], value: Any, dtype: Any) -> np.ndarray:
    """``np.full`` with the data 64-byte aligned (see ``aligned_empty``)."""
    out = aligned_empty(shape, dtype)
    out.fill(value)
    return out


def pad_leaf(shape: tuple[int, ...], spec: Any, values: Sequence[np.ndarray]) -> np.ndarray:
    """``values`` (validated leaves of one spec leaf) as the leading rows of one aligned
    array of ``shape``, everything else ``spec.pad_value``.

    With at most one ragged axis each byte is written once: the values, then only the
    padding (each row's tail past its length, then the unused rows).
    """
    n = len(values)
    ragged = [axis for axis, _ in spec.ragged_axes]
    if len(ragged) > 1:
        out = aligned_full(shape, spec.pad_value, spec.dtype)
        for i, value in enumerate(values):
            out[(i, *(slice(0, d) for d in value.shape))] = value
        return out
    out = aligned_empty(shape, spec.dtype)
    pad = spec.pad_value
    if not ragged:
        if n:
            np.stack(values, out=out[:n])
    elif ragged[0] == 0:
        full = shape[1]
        for i, value in enumerate(values):
            length = len(value)
            out[i, :length] = value
            if length < full:
                out[i, length:] = pad
    else:
        axis = ragged[0]
        full, lead = shape[axis + 1], (slice(None),) * axis
        for i, value in enumerate(values):
            length = value.shape[axis]
            out[(i, *lead, slice(0, length))] = value
            if length < full:
                out[(i, *lead, slice(length, None))] = pad
    if n < shape[0]:
        out[n:] = pad
    return out


@dataclasses.dataclass(frozen=True)
class PaddedBatch:
    """One padded batch, ready for the kernel.

    Attributes:
        bucket: one boundary per ragged axis.
        leaves: the padded leaves, each with a leading batch dimension of ``size``.
        lengths: per ragged-axis name, ``int32[size]`` true lengths (0 on padded rows).
        num_real: how many leading rows are real elements.
        size: the padded batch dimension.
    """

    bucket: Bucket
    leaves: tuple[np.ndarray, ...]
    lengths: dict[str, np.ndarray]
    num_real: int
    size: int

    @property
    def padded_volume(self) -> int:
        """Batch rows times the bucket's volume: the work the kernel does."""
        return self.size * math.prod(self.bucket)

    @property
    def real_volume(self) -> int:
        """The real rows' volumes summed: the work that was asked for."""
        if not self.lengths:
            return self.num_real
        if len(self.lengths) == 1:
            (only,) = self.lengths.values()
            return int(only[: self.num_real].sum(dtype=np.int64))
        stacked = np.stack([v[: self.num_real] for v in self.lengths.values()], axis=1)
        return int(np.prod(stacked.astype(np.int64), axis=1).sum())

    def lengths_matrix(self, names: Sequence[str]) -> np.ndarray:
        """``int[num_real, len(names)]``: the real rows' lengths, axes in ``names`` order."""
        if not names:
            return np.zeros((self.num_real, 0), np.int64)
        return np.stack([self.lengths[n][: self.num_real] for n in names], axis=1)


class OwnRows:
    """Bucketing's batch rows, ``Plan.row_policy``: each record of a buffer (anything with a
    ``size``) is one batch row. The engine asks it how many batch rows records take."""

    shares_rows = False
    """Whether records share a batch row (and so its computation)."""

    def units(self, buffer: Any, rows: np.ndarray | None = None) -> int:
        """Batch rows that records ``rows`` of ``buffer`` (all by default) take."""
        return buffer.size if rows is None else len(rows)

    def take(self, buffer: Any, rows: np.ndarray, limit: int) -> int:
        """How many leading records ``rows`` of ``buffer`` fit in ``limit`` batch rows."""
        return min(limit, len(rows))


def cut_batch_sizes(
    allowed: tuple[int, ...], limit: int | None, one_size: bool, where: str
) -> tuple[int, ...]:
    """``allowed`` batch sizes (ascending) cut at ``limit``, one of them (``None``: the
    largest); with ``one_size``, ``limit`` alone. ``where`` names the bucket in the error.

    Example:
        >>> cut_batch_sizes((8, 16, 32), 16, False, "bucket (64,)")
        (8, 16)

    Raises:
        SpecError: ``limit`` is not one of ``allowed``.
    """
    limit = allowed[-1] if limit is None else limit
    if limit not in allowed:
        raise SpecError(
            f"batch limit {limit} of {where} is not one of its allowed batch sizes {allowed}."
        )
    return (limit,) if one_size else tuple(s for s in allowed if s <= limit)


class PlanBase(abc.ABC):
    """What ``Plan`` and ``PackedPlan`` answer alike, from their ``layout``, ``validation``,
    ``max_sizes``, ``truncate`` and ``batch_sizes(bucket)``."""

    too_long = staticmethod(messages.too_long)  # the error of an element over ``max_sizes``
    layout: Layout
    validation: Validation
    max_sizes: dict[str, int]
    truncate: bool

    @abc.abstractmethod
    def batch_sizes(self, bucket: Bucket) -> tuple[int, ...]:
        """The batch dimensions ``bucket``'s batches may have, smallest first."""

    def max_batch(self, bucket: Bucket) -> int:
        """How many rows fill a batch of ``bucket``."""
        return self.batch_sizes(bucket)[-1]

    def padded_batch_size(self, bucket: Bucket, n: int) -> int:
        """The smallest allowed batch dimension holding ``n`` rows."""
        sizes = self.batch_sizes(bucket)
        i = bisect.bisect_left(sizes, n)
        if i == len(sizes):
            raise SpecError(f"{n} rows exceed the largest batch size {sizes[-1]}.")
        return sizes[i]

    def _checks(self) -> dict[str, Any]:
        return {
            "validation": self.validation,
            "max_sizes": self.max_sizes,
            "truncate": self.truncate,
            "too_long": self.too_long,
        }

    def validate(self, element: Any) -> Validated:
        """Validate one element; see ``beam_jax.Validation``."""
        return validate(self.layout, element, **self._checks())

    def validate_many(self, elements: Sequence[Any]) -> list[Validated | Exception]:
        """``validate`` of each element, checked a batch at once (``validate_many``): its
        ``Validated`` or the exception ``validate`` raises for it."""
        return validate_many(self.layout, elements, **self._checks())

    def split_outputs(
        self, outputs: BatchOutputs, rows: Sequence[int], items: Sequence[Validated]
    ) -> list[Any]:
        """Checked batch outputs (``row_outputs``) as one pytree for each of ``rows``, whose
        elements are ``items``: axes named in ``output_spec`` cut to each one's length."""
        return split_rows(outputs, rows, items)


class Plan(PlanBase):
    """Everything about batching that can be decided before the job starts.

    Examples:
        >>> import numpy as np
        >>> from beam_jax import ArraySpec, Bucketing
        >>> plan = Plan(ArraySpec(("L",)), Bucketing(boundaries={"L": (4, 8)}, batch_size=2))
        >>> plan.bucket_for((5,)), len(plan.shapes())
        ((8,), 4)

    Args:
        spec: the element spec (an ``ArraySpec`` or a pytree of them).
        bucketing: bucket boundaries and batch sizes.
        validation: input checks.
        output_spec: optional pytree of ``ArraySpec`` matching the kernel's per-element
            output; its named axes are cut back to each element's own length.
        num_devices: batch sizes are rounded up to a multiple of this, so batches shard
            evenly over the worker's devices.
    """

    row_policy = OwnRows()

    def __init__(
        self,
        spec: Any,
        bucketing: Bucketing | None = None,
        *,
        validation: Validation | None = None,
        output_spec: Any = None,
        num_devices: int = 1,
    ):
        self.layout: Layout = as_layout(spec)
        self.bucketing = bucketing or Bucketing()
        self.validation = validation or Validation()
        self.output_layout = None if output_spec is None else as_layout(output_spec)
        self.num_devices = int(num_devices)
        names = self.layout.axis_names
        missing = [n for n in names if n not in self.bucketing.boundaries]
        if missing:
            raise SpecError(
                f"ragged axes {missing} have no bucket boundaries; give them, e.g. "
                f"Bucketing(boundaries={{{missing[0]!r}: 512}}) for the default powers of two "
                "up to 512, or plan them from a sample with plan_boundaries()."
            )
        unknown = [n for n in self.bucketing.boundaries if n not in names]
        if unknown:
            raise SpecError(
                f"Bucketing names axes {unknown} that no leaf of the spec uses; the spec's "
                f"ragged axes are {list(names)}."
            )
        if self.output_layout is not None:
            out_unknown = [n for n in self.output_layout.axis_names if n not in names]
            if out_unknown:
                raise SpecError(
                    f"output_spec names axes {out_unknown} that are not ragged input axes "
                    f"{list(names)}."
                )
        self.boundaries = tuple(self.bucketing.boundaries[n] for n in names)
        self._bounds = tuple(np.asarray(b, np.int64) for b in self.boundaries)
        self._bucket_memo: dict[tuple[int, ...], Bucket] = {}
        self.max_sizes = {n: b[-1] for n, b in zip(names, self.boundaries, strict=True)}
        self.buckets: tuple[Bucket, ...] = tuple(itertools.product(*self.boundaries))
        self._sizes = {b: self._batch_sizes_for(b) for b in self.buckets}

    def _batch_sizes_for(self, bucket: Bucket) -> tuple[int, ...]:
        top = self.bucketing.max_batch_size(bucket)
        base = self.bucketing.batch_sizes_for(bucket) or default_batch_sizes(top)
        sizes = sorted({round_up(s, self.num_devices) for s in base if s <= top})
        budget = self.bucketing.max_padded_size
        if budget is not None:
            volume = math.prod(bucket)
            if volume > budget:
                raise SpecError(
                    f"bucket {bucket} pads each element to {volume} positions, more than "
                    f"max_padded_size={budget} allows in a whole batch; raise max_padded_size to "
                    f"at least {volume}, or lower the largest boundary."
                )
            # One row fits: the smallest size is over budget only rounded up to the devices.
            sizes = [s for s in sizes if s * volume <= budget] or sizes[:1]
        return tuple(sizes)

    def batch_sizes(self, bucket: Bucket) -> tuple[int, ...]:
        """The padded batch sizes ``bucket`` can use, smallest first."""
        return self._sizes[bucket]

    def with_batch_limits(self, limits: Mapping[Bucket, int], *, one_size: bool = False) -> Plan:
        """This plan with each bucket's batch sizes cut at ``limits[bucket]`` (one of them),
        as ``FitToMemory`` fits them; with ``one_size``, one shape per bucket."""
        sizes = {
            bucket: cut_batch_sizes(allowed, limits.get(bucket), one_size, f"bucket {bucket}")
            for bucket, allowed in self._sizes.items()
        }
        out = copy.copy(self)
        out._sizes = sizes
        return out

    def records_per_flush(self, bucket: Bucket, limit: int) -> int:
        """Elements that make a cross-bundle buffer of ``bucket`` full: its batch limit."""
        return limit

    def shapes(self) -> list[tuple[Bucket, int]]:
        """Every ``(bucket, batch size)`` the kernel can see: the complete compile set."""
        return [(b, s) for b in self.buckets for s in self._sizes[b]]

    def leaf_shapes(self, bucket: Bucket, size: int) -> list[tuple[tuple[int, ...], np.dtype]]:
        """The padded shape and dtype of every leaf for one batch shape."""
        sizes = dict(zip(self.layout.axis_names, bucket, strict=True))
        return [((size, *s.resolve(sizes)), s.dtype) for s in self.layout.specs]

    def bucket_indices(self, lengths: np.ndarray) -> np.ndarray:
        """Per row of ``lengths`` (``int[n, num_axes]``), the index of its bucket in
        ``buckets``: the smallest boundary that fits, on every axis."""
        return bucket_index(self._bounds, lengths)

    def bucket_for(self, lengths: Sequence[int]) -> Bucket:
        """The smallest bucket that fits ``lengths`` (one per ragged axis): the per-element
        path, memoised (a dict lookup instead of numpy calls on the hot path)."""
        key = tuple(lengths)
        bucket = self._bucket_memo.get(key)
        if bucket is None:
            row = np.asarray([key], np.int64).reshape(1, len(self.boundaries))
            bucket = self.buckets[int(self.bucket_indices(row)[0])]
            if len(self._bucket_memo) < _BUCKET_MEMO_SIZE:
                self._bucket_memo[key] = bucket
        return bucket

    @property
    def truncate(self) -> bool:
        """Elements longer than the largest bucket are cut to it (``oversize="truncate"``)."""
        return self.bucketing.oversize == "truncate"

    @property
    def kernel_treedef(self) -> Any:
        """The structure of the kernel's element argument (the spec's)."""
        return self.layout.treedef

    @property
    def kernel_axis_names(self) -> tuple[str, ...]:
        """The names the kernel's ``lengths`` argument holds (the ragged axes)."""
        return self.layout.axis_names

    def row_outputs(self, outputs: Any, batch: PaddedBatch) -> tuple[BatchOutputs, np.ndarray]:
        """The outputs of ``batch`` checked (one row per element) and the real rows' lengths
        (``int[num_real, num_axes]``): what the per-row output check needs."""
        checked = self.check_outputs(outputs, batch.size)
        return checked, batch.lengths_matrix(self.layout.axis_names)

    def check_outputs(self, outputs: Any, size: int) -> BatchOutputs:
        """Check one batch's outputs against the output contract (see ``core.outputs``)."""
        return check_outputs(outputs, size, self.output_layout, self.layout.axis_names)

    def pad(self, bucket: Bucket, items: Sequence[Validated]) -> PaddedBatch:
        """Pad ``items`` (all of ``bucket``) into one batch of an allowed size."""
        return self.pad_columns(
            bucket,
            [[it.leaves[j] for it in items] for j in range(len(self.layout.specs))],
            [[it.lengths[k] for it in items] for k in range(len(self.layout.axis_names))],
        )

    def pad_columns(
        self,
        bucket: Bucket,
        leaves: Sequence[Sequence[np.ndarray]],
        lengths: Sequence[Sequence[int]],
    ) -> PaddedBatch:
        """``pad`` of elements given as columns: per spec leaf, the elements' validated
        leaves; per ragged axis, their lengths (a list, or a column of ``int[n, num_axes]``).
        """
        n = len(leaves[0])
        size = self.padded_batch_size(bucket, n)
        sizes = dict(zip(self.layout.axis_names, bucket, strict=True))
        padded = tuple(
            pad_leaf((size, *spec.resolve(sizes)), spec, leaves[j])
            for j, spec in enumerate(self.layout.specs)
        )
        columns = {}
        for k, name in enumerate(self.layout.axis_names):
            col = np.zeros((size,), np.int32)
            col[:n] = lengths[k]
            columns[name] = col
        return PaddedBatch(bucket, padded, columns, n, size)

    def unbatch(self, outputs: Any, batch: PaddedBatch, items: Sequence[Validated]) -> list[Any]:
        """Check batched kernel outputs and split them into one pytree per real element.

        Raises:
            KernelError: the outputs break the contract (see ``check_outputs``).
        """
        checked = self.check_outputs(outputs, batch.size)
        return self.split_outputs(checked, np.arange(len(items)), items)
