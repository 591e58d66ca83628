"""Work ahead: a DoFn's heavy step for one element runs in a background thread while the
outputs of the elements before it go downstream.

Beam runs a bundle's fused steps one element at a time on one thread, so a step waiting on
native code that releases the GIL (reading a file, a Rust tokenizer) leaves the stage idle.
:class:`WorkAhead` runs such work on a thread of its own and emits each element's outputs
one or more elements later, so it overlaps the Python work downstream.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from apache_beam import pvalue
from apache_beam.transforms.window import BoundedWindow
from apache_beam.utils.windowed_value import WindowedValue

__all__ = ["WorkAhead"]


@dataclasses.dataclass(frozen=True)
class _Pending:
    future: concurrent.futures.Future
    then: Callable[[Any], Iterable[Any]]
    window: Any
    timestamp: Any


class WorkAhead:
    """Runs each element's ``work`` in background threads, up to ``depth`` elements ahead.

    A DoFn calls :meth:`setup`, :meth:`start_bundle`, :meth:`finish_bundle` and
    :meth:`teardown` from its own, and hands each element's work to :meth:`submit` with
    ``then``, which turns its result into outputs. ``work`` runs in the background and must
    not touch Beam (metrics are per thread); ``then`` runs on the bundle's thread, in order,
    and may count and yield as ``process`` does. An exception in ``work`` is raised where its
    element is emitted. Without :meth:`setup` (a unit test) ``work`` runs at once.

    Example:
        >>> ahead = WorkAhead("square")
        >>> ahead.setup(); ahead.start_bundle()
        >>> list(ahead.submit(lambda: 2 * 2, lambda y: [y]))  # emitted after the next one
        []
        >>> list(ahead.submit(lambda: 3 * 3, lambda y: [y]))
        [4]
        >>> list(ahead.finish_bundle())
        [9]
        >>> ahead.teardown()

    Args:
        name: The background threads' name (shown by profilers and in thread dumps).
        depth: How many elements' work may run or wait beyond the one being emitted; more
            holds more elements' results in memory at once.
        workers: Threads that run the work (up to ``min(workers, depth + 1)`` elements at
            once); outputs keep the elements' order whatever finishes first.

    Raises:
        ValueError: ``depth`` or ``workers`` is not a positive int.
    """

    def __init__(self, name: str, depth: int = 1, workers: int = 1):
        for what, value in (("depth", depth), ("workers", workers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{what} must be a positive int, got {value!r}")
        self.name = name
        self.depth = depth
        self.workers = workers
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: collections.deque[_Pending] = collections.deque()

    def __getstate__(self):  # a DoFn is pickled before setup: never a pool or pending work
        return {"name": self.name, "depth": self.depth, "workers": self.workers}

    def __setstate__(self, state):
        self.__init__(state["name"], state["depth"], state.get("workers", 1))

    def setup(self) -> None:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.workers, thread_name_prefix=self.name
            )

    def start_bundle(self) -> None:
        # Whatever a failed bundle left behind is dropped (its work still finishes).
        self._pending.clear()

    def submit(
        self,
        work: Callable[..., Any],
        then: Callable[[Any], Iterable[Any]],
        window: Any = None,
        timestamp: Any = None,
    ) -> Iterator[Any]:
        """Starts ``work`` and yields the outputs of the elements now ``depth`` behind.

        Args:
            work: The element's native work, called with no arguments in the background.
            then: The element's outputs from ``work``'s result, run on the bundle's thread.
            window: The element's window (``beam.DoFn.WindowParam``), for outputs emitted
                later.
            timestamp: The element's timestamp (``beam.DoFn.TimestampParam``).

        Yields:
            The outputs of earlier elements, each as a ``WindowedValue`` of its own element's
            window and timestamp (as ``then`` gave them without a window).
        """
        if self._pool is None:
            yield from then(work())
            return
        if window is not None and not isinstance(window, BoundedWindow):
            raise TypeError(
                f"window must be the element's window or None, got {window!r}; declare it in "
                "process (window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam) "
                "and pass both on"
            )
        self._pending.append(_Pending(self._pool.submit(work), then, window, timestamp))
        while len(self._pending) > self.depth:
            yield from self._emit(self._pending.popleft())

    def finish_bundle(self) -> Iterator[Any]:
        """Waits for the bundle's remaining work and yields its outputs, in order."""
        while self._pending:
            yield from self._emit(self._pending.popleft())

    def teardown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    @staticmethod
    def _emit(pending: _Pending) -> Iterator[Any]:
        outputs = pending.then(pending.future.result())
        if pending.window is None:
            yield from outputs
            return
        for out in outputs:
            if isinstance(out, pvalue.TaggedOutput):
                value = WindowedValue(out.value, pending.timestamp, (pending.window,))
                yield pvalue.TaggedOutput(out.tag, value)
            else:
                yield WindowedValue(out, pending.timestamp, (pending.window,))
