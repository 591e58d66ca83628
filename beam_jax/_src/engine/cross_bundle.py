"""CrossBundle: the settings of batches that outlive a bundle (a frozen, validated dataclass)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any, Literal

from beam_jax._src.errors import SpecError

WHEN = ("always", "unbounded")


@dataclasses.dataclass(frozen=True)
class CrossBundle:
    """Buffer elements in Beam state across bundles until a batch is full or has waited long
    enough.

    Bundle mode (the default) flushes every buffer at the end of each bundle, wasteful where
    bundles hold a handful of elements (Dataflow streaming, Flink). Cross-bundle mode keys
    elements by ``(bucket, shard)`` in ``BagState`` per window, and a batch runs when full,
    when its oldest element has waited ``max_wait_s``, or when its window ends
    (docs/streaming.md).

    Example:
        >>> config = CrossBundle(max_wait_s=0.5, shards=4, when="unbounded")
        >>> config.max_wait_s, config.shards
        (0.5, 4)

    Args:
        max_wait_s: the longest an element waits in a buffer before its batch runs (seconds
            of processing time; the runner fires timers best-effort, so add one timer
            firing delay).
        shards: keys per bucket, spread round-robin so a hot bucket runs on as many workers
            (about the number of workers is a good start; each fills ``shards`` times slower).
        when: ``"always"``, or ``"unbounded"`` to use the mode only on unbounded input
            (``pcoll.is_bounded`` false, i.e. streaming) and bundle mode on bounded input.
        clock: processing time in seconds; the default is ``time.time``. Tests pass the
            runner's test clock so waits are measured in ``TestStream`` time.
    """

    max_wait_s: float = 1.0
    shards: int = 1
    when: Literal["always", "unbounded"] = "always"
    clock: Callable[[], float] = time.time

    def __post_init__(self):
        wait = self.max_wait_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
            raise SpecError(f"max_wait_s must be a finite number of seconds, got {wait!r}.")
        if wait <= 0:
            raise SpecError(
                f"max_wait_s must be > 0, got {wait}; use bundle mode (no CrossBundle) to "
                "flush at the end of each bundle instead."
            )
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 1:
            raise SpecError(f"shards must be an int >= 1, got {self.shards!r}.")
        if self.when not in WHEN:
            raise SpecError(f"when must be one of {WHEN}, got {self.when!r}.")
        if not callable(self.clock):
            raise SpecError(
                f"clock must be a zero-argument callable returning seconds, got {self.clock!r}."
            )

    def applies_to(self, pcoll: Any) -> bool:
        """Whether ``pcoll`` is batched across bundles (``when`` and ``pcoll.is_bounded``)."""
        return self.when == "always" or not pcoll.is_bounded
