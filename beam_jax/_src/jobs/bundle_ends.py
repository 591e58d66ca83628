"""Bundles that end when their work does, on workers in this process.

Each bundle a Beam SDK worker runs starts a state sampler: a thread that times the
bundle's steps, sleeping between samples, its sleep growing from 2 ms to 200 ms over the
bundle's first second. The bundle ends only once that thread has woken and seen it is done,
so a bundle longer than a second ends up to 200 ms after its last step.
:func:`prompt_bundle_ends` caps the sleep while a job runs.

Example:
    >>> from apache_beam.runners.worker import statesampler
    >>> with prompt_bundle_ends(period_ms=10):
    ...     statesampler.StateSampler("stage", None).sampling_period_ms
    10
    >>> statesampler.StateSampler("stage", None).sampling_period_ms
    200
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from beam_jax._src.compat.beam import default_sampling_period

__all__ = ["prompt_bundle_ends"]


@contextlib.contextmanager
def prompt_bundle_ends(period_ms: int = 10) -> Iterator[None]:
    """State samplers started in this process while the block runs sleep at most
    ``period_ms`` between samples (Beam's default: 200 ms), so each bundle ends at most that
    long after its last step (also as a decorator: ``@prompt_bundle_ends()``).

    Only workers in this process are affected (the in-process DirectRunner and FnApiRunner);
    a sample costs a wake-up of a sleeping thread. If samplers are set otherwise already (by
    the caller, a job run inside another, or a Beam whose default differs), nothing changes.

    Raises:
        ValueError: ``period_ms`` is not a positive int.
    """
    if isinstance(period_ms, bool) or not isinstance(period_ms, int) or period_ms < 1:
        raise ValueError(f"period_ms must be a positive int (milliseconds), got {period_ms!r}")
    with default_sampling_period(period_ms):
        yield
