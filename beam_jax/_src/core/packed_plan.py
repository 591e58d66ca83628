"""``PackedPlan``: a worker's plan when a transform packs (pure numpy).

It answers the engine's questions the way ``Plan`` does for buckets: the element
validation, the compile set (one ``((row_length,), rows)`` pair per listed shape), batch
sizes per row length, the kernel's input structure (the packed element and its
``SegmentInfo``), and the output check (one output per segment, gathered per record). Its
batches are ``PackedBatch``es, laid out by its ``Packer``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from beam_jax._src.bucketing.packing import Packing
from beam_jax._src.bucketing.rule import Bucket, round_up
from beam_jax._src.core import messages
from beam_jax._src.core.outputs import BatchOutputs, check_outputs
from beam_jax._src.core.packed_batch import PackedBatch, Packer, SegmentInfo, segment_outputs
from beam_jax._src.core.plan import OwnRows, PlanBase, cut_batch_sizes
from beam_jax._src.core.spec import Layout, as_layout
from beam_jax._src.core.validation import Validated, Validation
from beam_jax._src.errors import SpecError


class SharedRows(OwnRows):
    """Packing's batch rows: a buffer's records share rows (``PackedPlan.row_policy``); its
    ``row_of`` gives each record's batch row, non-decreasing."""

    shares_rows = True

    def units(self, buffer: Any, rows: np.ndarray | None = None) -> int:
        chosen = buffer.row_of if rows is None else buffer.row_of[rows]
        if len(chosen) < 2:
            return len(chosen)
        steps = np.diff(chosen)
        if (steps >= 0).all():  # in row order, as the packer makes them: no sort
            return 1 + int(np.count_nonzero(steps))
        return len(np.unique(chosen))

    def take(self, buffer: Any, rows: np.ndarray, limit: int) -> int:
        chosen = buffer.row_of[rows]
        new = np.ones(len(chosen), bool)
        new[1:] = chosen[1:] != chosen[:-1]
        # A row's records are adjacent: cut after ``limit`` rows (at least one record).
        return max(1, int(np.searchsorted(np.cumsum(new), limit, side="right")))


class PackedPlan(PlanBase):
    """Everything about packed batches that can be decided before the job starts.

    Built by ``make_plan`` when a transform is given ``packing=``; ``shapes()`` lists the
    complete compile set as ``((row_length,), rows)`` pairs (``Plan.shapes()``'s form).

    Example:
        >>> import numpy as np
        >>> from beam_jax import ArraySpec, Packing
        >>> plan = PackedPlan(ArraySpec(("L",)), Packing(row_lengths=(64, 128), rows_per_batch=8))
        >>> plan.shapes()
        [((64,), 8), ((128,), 8)]

    Args:
        spec: the element spec: exactly one ragged axis name.
        packing: a ``Packing``, or what ``plan_packing`` returned (its ``buffer_size``
            becomes the number of records packed together).
        validation: input checks.
        output_spec: the per-record outputs' structure; named axes are refused (a record's
            output is one value per segment, not a sequence).
        num_devices: rows per batch are rounded up to a multiple of this.

    Raises:
        SpecError: the spec has no ragged axis or several, a leaf repeats it, or the
            ``output_spec`` names an axis.
    """

    row_policy = SharedRows()
    truncate = False  # a record longer than the longest row is refused
    too_long = staticmethod(messages.too_long_to_pack)

    def __init__(
        self,
        spec: Any,
        packing: Any,
        *,
        validation: Validation | None = None,
        output_spec: Any = None,
        num_devices: int = 1,
    ):
        self.buffer_size: int | None = getattr(packing, "buffer_size", None)
        packing = getattr(packing, "packing", packing)
        if not isinstance(packing, Packing):
            raise SpecError(
                f"packing must be a Packing or what plan_packing returned, got {packing!r}."
            )
        self.num_devices = int(num_devices)
        sizes = {
            n: tuple(sorted({round_up(s, self.num_devices) for s in packing.sizes_for(n)}))
            for n in packing.row_lengths
        }
        self.packing = dataclasses.replace(packing, rows_per_batch=sizes)
        self._spec = spec
        self.packer = Packer(spec, self.packing)
        self.layout: Layout = self.packer.layout
        self.axis = self.packer.axis
        self.validation = validation or Validation()
        self.output_layout = None if output_spec is None else as_layout(output_spec)
        if self.output_layout is not None and self.output_layout.axis_names:
            raise SpecError(
                f"with packing a kernel returns one output per record (segment), so output_spec "
                f"cannot name axes; got axes {list(self.output_layout.axis_names)}. Give fixed "
                "shapes, or use bucketing for per-position outputs."
            )
        self.max_sizes = {self.axis: self.packing.max_row_length}
        self.buckets: tuple[Bucket, ...] = tuple((n,) for n in self.packing.row_lengths)
        element = self.layout.treedef.unflatten([0] * len(self.layout.specs))
        self.kernel_treedef = jax.tree_util.tree_structure((element, SegmentInfo(0, 0, 0, 0)))
        self.kernel_axis_names: tuple[str, ...] = ()

    # --- the compile set and batch sizes -----------------------------------------------

    def bucket_for(self, lengths: Sequence[int]) -> Bucket:
        """The one key records of every length share (packing mixes lengths in rows): the
        longest row length. Cross-bundle mode buffers records under it."""
        return self.buckets[-1]

    def records_per_flush(self, bucket: Bucket, limit: int) -> int:
        """Records that make a cross-bundle buffer full: the planner's ``buffer_size``
        when given, else as many as ``limit`` rows can hold (``max_segments`` each)."""
        return self.buffer_size or limit * self.packing.max_segments

    def batch_sizes(self, bucket: Bucket) -> tuple[int, ...]:
        """The rows per batch of row length ``bucket[0]``, smallest first."""
        return self.packing.sizes_for(bucket[0])

    def with_batch_limits(self, limits: Mapping[Bucket, int], *, one_size: bool = False):
        """This plan with the rows per batch of each row length cut at ``limits[bucket]``
        (one of its sizes); with ``one_size``, that size alone. Used when batch limits are
        fitted to memory (``FitToMemory``), as ``Plan.with_batch_limits``.
        """
        sizes = {
            n: cut_batch_sizes(
                self.packing.sizes_for(n), limits.get((n,)), one_size, f"row length {n}"
            )
            for (n,) in self.buckets
        }
        out = copy.copy(self)
        out.packing = dataclasses.replace(self.packing, rows_per_batch=sizes)
        out.packer = Packer(self._spec, out.packing)
        return out

    def shapes(self) -> list[tuple[Bucket, int]]:
        """Every ``((row_length,), rows)`` the kernel can see: the complete compile set."""
        return [((n,), s) for n, s in self.packing.shapes()]

    def leaf_shapes(self, bucket: Bucket, size: int) -> list[tuple[tuple[int, ...], Any]]:
        """The shape and dtype of every kernel leaf (element, then segments) of one shape."""
        n, m = bucket[0], self.packing.max_segments
        i32 = np.dtype(np.int32)
        segments = [((size, n), i32), ((size, n), i32), ((size,), i32), ((size, m), i32)]
        return [*self.packer.leaf_shapes(n, size), *segments]

    # --- elements and outputs -----------------------------------------------------------

    def lay_out(
        self, items: Sequence[Validated], rows: Sequence[int], row_length: int
    ) -> PackedBatch:
        """``items`` as one packed batch, in the rows given (``Packer.lay_out``)."""
        return self.packer.lay_out(
            [it.leaves for it in items], rows, row_length, [it.lengths[0] for it in items]
        )

    def row_outputs(self, outputs: Any, batch: PackedBatch) -> tuple[BatchOutputs, np.ndarray]:
        """The outputs of ``batch`` checked and gathered per record (``[records, ...]``),
        and the records' lengths (``int[records, 1]``).

        Raises:
            KernelError: an output leaf does not start with ``[rows, max_segments]``, or the
                outputs differ from ``output_spec``.
        """
        gathered = segment_outputs(outputs, batch)
        checked = check_outputs(gathered, batch.num_records, self.output_layout, ())
        return checked, batch.lengths_matrix(())
