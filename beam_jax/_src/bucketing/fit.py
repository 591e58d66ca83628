"""Batch sizes that fit by construction: the policy, and the search over analysed bytes.

Pure numpy: the search takes a callback that analyses one ``(bucket, batch size)`` shape
(``kernel/memory.py`` reads XLA's memory analysis). Per bucket it bisects the allowed batch
sizes for the largest whose bytes fit the budget: bytes grow with the batch size, so at most
``ceil(log2 n) + 1`` analyses per bucket decide ``n`` sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from beam_jax._src.errors import SpecError

Bucket = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class FitToMemory:
    """Per bucket, the largest allowed batch size whose compiled program fits in memory.

    At worker start each bucket's batch sizes are compiled and analysed by XLA (per device,
    replicated parameters included), and the bucket's batch limit becomes the largest size
    within the budget. The out-of-memory back-off stays as the safety net.

    Example:
        >>> fit = FitToMemory(budget_bytes=256 << 20)
        >>> fit.budget_bytes, fit.device_fraction
        (268435456, 0.8)

    Args:
        budget_bytes: bytes per device a batch's program may use. Required on CPU, whose
            devices do not report their memory; on GPU/TPU it overrides the default.
        device_fraction: without ``budget_bytes``, this fraction of each device's free
            memory at worker start (the parameters' own bytes added back).
        one_size: pad every batch of a bucket to its chosen size, so the run compiles one
            shape per bucket.
    """

    budget_bytes: int | None = None
    device_fraction: float = 0.8
    one_size: bool = False

    def __post_init__(self):
        b = self.budget_bytes
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise SpecError(
                f"budget_bytes must be a positive int (bytes per device) or None, got {b!r}; "
                "e.g. FitToMemory(budget_bytes=2 << 30) for 2 GiB."
            )
        f = self.device_fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 < f <= 1.0:
            raise SpecError(
                f"device_fraction must be within (0, 1], got {f!r}; e.g. 0.8 leaves a fifth "
                "of the free device memory to other allocations."
            )
        if not isinstance(self.one_size, bool):
            raise SpecError(f"one_size must be a bool, got {self.one_size!r}.")


@dataclasses.dataclass(frozen=True)
class ShapeBytes:
    """The memory one compiled batch shape needs, per device, in bytes.

    Attributes:
        argument: inputs, the parameters included (each device holds a full copy).
        output: outputs.
        temp: temporaries XLA's buffer assignment allocates.
        generated_code: the compiled code (on GPU/TPU it lives in device memory).
        alias: outputs that reuse argument buffers (counted once).
        hidden: an estimate of buffers XLA's analysis does not see (on CPU, inside XNNPACK
            fusions: ``kernel/memory.py``); 0 where the analysis is complete.
    """

    argument: int
    output: int
    temp: int
    generated_code: int = 0
    alias: int = 0
    hidden: int = 0

    @property
    def total(self) -> int:
        """What running the shape holds at once: arguments, outputs, temporaries (seen and
        estimated) and code, less outputs that reuse argument buffers."""
        return (
            self.argument + self.output + self.temp + self.hidden + self.generated_code
        ) - self.alias

    @property
    def trusted(self) -> bool:
        """Whether the total is XLA's own figure, with nothing estimated."""
        return self.hidden == 0


@dataclasses.dataclass(frozen=True)
class FitRow:
    """One analysed ``(bucket, batch size)`` shape of the fit search: a plan-table row.

    Attributes:
        bucket: one boundary per ragged axis.
        size: the padded batch size (the whole batch, over all devices).
        analysed: the shape's bytes, per device.
        budget: the budget per device.
        limit: the bucket's chosen batch limit (the same on every row of the bucket).
        compiled: False where the shape failed to compile (it then does not fit).
    """

    bucket: Bucket
    size: int
    analysed: ShapeBytes
    budget: int
    limit: int
    compiled: bool = True

    @property
    def total(self) -> int:
        return self.analysed.total

    @property
    def fits(self) -> bool:
        return self.compiled and self.total <= self.budget

    def as_dict(self) -> dict:
        """Plain values, for tables and JSON."""
        a = self.analysed
        return {
            "bucket": list(self.bucket),
            "batch_size": self.size,
            "argument_bytes": a.argument,
            "output_bytes": a.output,
            "temp_bytes": a.temp,
            "hidden_bytes": a.hidden,
            "generated_code_bytes": a.generated_code,
            "alias_bytes": a.alias,
            "total_bytes": a.total,
            "budget_bytes": self.budget,
            "trusted": a.trusted,
            "compiled": self.compiled,
            "fits": self.fits,
            "limit": self.limit,
            "chosen": self.size == self.limit,
        }


def search_limits(
    buckets: Sequence[Bucket],
    sizes: Mapping[Bucket, Sequence[int]],
    analyse: Callable[[Bucket, int], ShapeBytes | None],
    budget: int,
) -> tuple[dict[Bucket, int], list[FitRow]]:
    """Per bucket, the largest of ``sizes[bucket]`` whose analysed bytes fit ``budget``.

    A bucket whose smallest size does not fit gets that smallest size (the out-of-memory
    back-off then decides); its rows show ``fits=False``.

    Example:
        >>> analyse = lambda bucket, n: ShapeBytes(argument=n * bucket[0], output=0, temp=0)
        >>> search_limits([(4,), (8,)], {(4,): (1, 2, 4), (8,): (1, 2, 4)}, analyse, 16)[0]
        {(4,): 4, (8,): 2}

    Args:
        buckets: the buckets.
        sizes: per bucket, its allowed batch sizes, smallest first.
        analyse: ``analyse(bucket, size)`` -> ``ShapeBytes``, or ``None`` where the shape
            failed to compile (it then counts as not fitting); called once per shape.
        budget: bytes per device.

    Returns:
        ``(limits, rows)``: per bucket its chosen size; every analysed shape's row.
    """
    done: dict[tuple[Bucket, int], ShapeBytes | None] = {}

    def fits(bucket: Bucket, size: int) -> bool:
        if (bucket, size) not in done:
            done[bucket, size] = analyse(bucket, size)
        a = done[bucket, size]
        return a is not None and a.total <= budget

    limits = {}
    for bucket in buckets:
        options = list(sizes[bucket])
        if not options:
            raise SpecError(f"bucket {bucket} has no batch sizes to choose from.")
        best = 0
        if fits(bucket, options[0]):
            lo, hi = 0, len(options)  # options[lo] fits; options[hi:] do not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if fits(bucket, options[mid]):
                    lo = mid
                else:
                    hi = mid
            best = lo
        limits[bucket] = options[best]
    rows = [
        FitRow(b, s, a or ShapeBytes(0, 0, 0), budget, limits[b], compiled=a is not None)
        for (b, s), a in done.items()
    ]
    return limits, sorted(rows, key=lambda r: (r.bucket, r.size))
