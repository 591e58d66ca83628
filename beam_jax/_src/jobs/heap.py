"""A job's launch objects out of the garbage collector's way while the job runs.

A job's process holds hundreds of thousands of objects before it reads a row (jax, Beam,
pyarrow and the job's own modules), and every full pass of Python's cyclic garbage
collector walks them all, a noticeable part of a launch (bench/RESULTS.md). They live as
long as the process, so :func:`freeze_startup_objects` moves them out of the
collector's passes (``gc.freeze``) while the job runs, and gives them back when it ends
(``gc.unfreeze``), so a process that runs many jobs (a test suite, a notebook) still frees
what it no longer uses.

Example:
    >>> import gc
    >>> with freeze_startup_objects():
    ...     gc.get_freeze_count() > 0
    True
    >>> gc.get_freeze_count()
    0
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["freeze_startup_objects"]


@contextlib.contextmanager
def freeze_startup_objects() -> Iterator[None]:
    """Leaves the objects alive when the block starts out of the garbage collector's passes
    until it ends (also as a decorator: ``@freeze_startup_objects()``).

    Objects the block creates are collected as usual. If objects are frozen already (by the
    caller, or a job run inside another), nothing is frozen or unfrozen here.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
