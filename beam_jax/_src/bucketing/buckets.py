"""Bucketing configuration: boundaries per ragged axis and batch sizes per bucket."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from beam_jax._src.bucketing.boundaries import plan_boundaries
from beam_jax._src.bucketing.rule import Bucket, default_boundaries
from beam_jax._src.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Bucketing:
    """How elements are grouped into padded batches.

    An element goes to the smallest boundary that fits on every ragged axis (a bucket is
    one boundary per axis), and the batch dimension is padded up to one of ``batch_sizes``,
    so every shape the kernel sees is known before the job starts.

    Examples:
        >>> b = Bucketing(boundaries={"L": 512}, batch_size=32, max_padded_size=4096)
        >>> b.boundaries["L"]
        (16, 32, 64, 128, 256, 512)

    Args:
        boundaries: per ragged-axis name, either a strictly increasing sequence of
            boundaries or one ``int`` maximum, expanded with ``default_boundaries``.
        batch_size: the most elements in one batch; an ``int`` for every bucket, or a mapping
            from bucket (a tuple with one boundary per axis, in spec order; a bare boundary
            for one axis) to ``int``.
        max_padded_size: optional budget on batch rows x padded bucket volume (e.g. padded
            tokens per batch), so long buckets get smaller batches.
        batch_sizes: the allowed sizes of the padded batch dimension; default powers of two up
            to the largest batch size, then that size. A mapping from bucket to sizes gives
            each bucket its own (as ``plan_bucketing`` does). Sizes above a bucket's
            ``batch_size`` are left out; at least one must be at most it.
        oversize: what to do with an element longer than the largest boundary:
            ``"dead_letter"`` (default) or ``"truncate"`` to the largest boundary.
    """

    boundaries: Mapping[str, Sequence[int] | int] = dataclasses.field(default_factory=dict)
    batch_size: int | Mapping[Bucket, int] = 32
    max_padded_size: int | None = None
    batch_sizes: tuple[int, ...] | Mapping[Bucket, tuple[int, ...]] | None = None
    oversize: Literal["dead_letter", "truncate"] = "dead_letter"

    def __post_init__(self):
        if not isinstance(self.boundaries, Mapping):
            raise SpecError(
                f"boundaries must map ragged-axis names to boundaries, got {self.boundaries!r}; "
                "e.g. boundaries={'L': (64, 128, 256)}."
            )
        norm = {}
        for name, value in self.boundaries.items():
            if isinstance(value, int | np.integer) and not isinstance(value, bool):
                value = default_boundaries(int(value))
            value = tuple(int(v) for v in value)
            if not value or value[0] < 1 or list(value) != sorted(set(value)):
                raise SpecError(
                    f"boundaries for axis {name!r} must be positive and strictly increasing, "
                    f"got {value}."
                )
            norm[name] = value
        object.__setattr__(self, "boundaries", norm)
        sizes = (
            self.batch_size.values() if isinstance(self.batch_size, Mapping) else [self.batch_size]
        )
        for s in sizes:
            if not isinstance(s, int | np.integer) or isinstance(s, bool) or s < 1:
                raise SpecError(f"batch_size must be a positive int, got {s!r}.")
        if isinstance(self.batch_size, Mapping):
            object.__setattr__(
                self, "batch_size", {_bucket(k): int(v) for k, v in self.batch_size.items()}
            )
        else:
            object.__setattr__(self, "batch_size", int(self.batch_size))
        if self.max_padded_size is not None and self.max_padded_size < 1:
            raise SpecError(f"max_padded_size must be positive, got {self.max_padded_size}.")
        if isinstance(self.batch_sizes, Mapping):
            object.__setattr__(
                self,
                "batch_sizes",
                {_bucket(k): _sizes(v, _bucket(k)) for k, v in self.batch_sizes.items()},
            )
        elif self.batch_sizes is not None:
            object.__setattr__(self, "batch_sizes", _sizes(self.batch_sizes))
        _check_sizes_fit(self.batch_size, self.batch_sizes)
        if self.oversize not in ("dead_letter", "truncate"):
            raise SpecError(f"oversize must be 'dead_letter' or 'truncate', got {self.oversize!r}.")

    @classmethod
    def from_sample(
        cls,
        lengths: Mapping[str, Sequence[int]],
        *,
        num_buckets: int = 8,
        max_size: int | Mapping[str, int] | None = None,
        **kwargs: Any,
    ) -> Bucketing:
        """Bucketing whose boundaries minimise padding over a sample of lengths.

        Each axis gets at most ``num_buckets`` boundaries chosen by ``plan_boundaries``, so
        the compile budget is ``num_buckets`` per axis times the batch sizes.

        Examples:
            >>> b = Bucketing.from_sample({"L": [3, 4, 4, 9, 30]}, num_buckets=2, max_size=64)
            >>> b.boundaries["L"]
            (9, 64)

        Args:
            lengths: per ragged-axis name, a sample of that axis's lengths.
            num_buckets: the most boundaries per axis.
            max_size: the largest boundary (one ``int`` for every axis, or per axis), so
                longer elements than the sample's still fit; default the sample's maximum.
            **kwargs: the other ``Bucketing`` fields (``batch_size``, ``max_padded_size``...).
        """
        if not isinstance(lengths, Mapping) or not lengths:
            raise SpecError(
                f"lengths must map ragged-axis names to samples of lengths, got "
                f"{type(lengths).__name__}; e.g. Bucketing.from_sample({{'L': lengths}})."
            )
        boundaries = {}
        for name, sample in lengths.items():
            top = max_size.get(name) if isinstance(max_size, Mapping) else max_size
            boundaries[name] = plan_boundaries(sample, num_buckets, max_size=top)
        return cls(boundaries=boundaries, **kwargs)

    def batch_sizes_for(self, bucket: Bucket) -> tuple[int, ...] | None:
        """The allowed batch sizes of ``bucket`` as given (``None``: the defaults)."""
        if isinstance(self.batch_sizes, Mapping):
            if bucket not in self.batch_sizes:
                raise SpecError(
                    f"batch_sizes has no entry for bucket {bucket}; it has "
                    f"{sorted(self.batch_sizes)}. Give every bucket its sizes."
                )
            return self.batch_sizes[bucket]
        return self.batch_sizes

    def max_batch_size(self, bucket: Bucket) -> int:
        """The largest number of elements in a batch of ``bucket``, before any budget."""
        if isinstance(self.batch_size, Mapping):
            if bucket not in self.batch_size:
                raise SpecError(
                    f"batch_size has no entry for bucket {bucket}; it has "
                    f"{sorted(self.batch_size)}. Give every bucket a size."
                )
            return self.batch_size[bucket]
        return self.batch_size


def _bucket(key: Any) -> Bucket:
    """A bucket key as a tuple: a bare boundary (``{64: 32}``) names a one-axis bucket."""
    return tuple(key) if isinstance(key, tuple) else (key,)


def _sizes(sizes, bucket=None) -> tuple[int, ...]:
    where = "" if bucket is None else f" for bucket {tuple(bucket)}"
    try:
        bs = tuple(int(b) for b in sizes)
    except (TypeError, ValueError):
        bs = ()
    if not bs or bs[0] < 1 or list(bs) != sorted(set(bs)):
        raise SpecError(
            f"batch_sizes{where} must be positive and strictly increasing ints, got {sizes!r}."
        )
    return bs


def _check_sizes_fit(batch_size, batch_sizes) -> None:
    """Refuse ``batch_sizes`` of which no size fits a bucket's ``batch_size``: the smallest
    would otherwise be used, more rows per batch than ``batch_size`` allows."""
    keys = [k for m in (batch_size, batch_sizes) if isinstance(m, Mapping) for k in m]
    for bucket in keys or [None]:
        top = batch_size.get(bucket) if isinstance(batch_size, Mapping) else batch_size
        sizes = batch_sizes.get(bucket) if isinstance(batch_sizes, Mapping) else batch_sizes
        if top is not None and sizes is not None and sizes[0] > top:
            where = "" if bucket is None else f" for bucket {bucket}"
            raise SpecError(
                f"batch_sizes{where} are {sizes}, all larger than batch_size {top} (the most "
                f"elements in one batch); allow a size of at most {top}, or raise batch_size "
                f"to {sizes[0]}."
            )
