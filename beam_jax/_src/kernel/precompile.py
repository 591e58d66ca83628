"""Compile a kernel's listed batch shapes in background threads, several at once.

XLA releases the GIL while it compiles, so compiles in threads run in parallel with each
other and with the worker reading and tokenizing. Lowering a shape (tracing the kernel)
holds the GIL, so the kernel lowers one shape at a time, in the order the threads take
them: the shape listed first is ready first. A batch whose shape is not ready waits
for that shape alone (``Kernel.executable``); one whose shape no thread has started yet
compiles it itself, so the background never makes a batch wait longer than a compile.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from beam_jax._src.cores import usable_cores
from beam_jax._src.kernel.compiled import Kernel


def default_threads() -> int:
    """Compile threads: one per CPU this process may use, at most 4."""
    return max(1, min(4, usable_cores()))


# Compiles running when the interpreter exits: each thread finishes the shape it compiles
# and takes no other. The threads are not daemons: a daemon thread inside XLA when the
# interpreter finalizes is cut off as it returns (its C++ frames unwound by force), which
# aborted the process at exit (status 134, "terminate called after throwing", or 139)
# after a job failed while its shapes compiled; exit now waits for the compiles running.
_RUNNING: weakref.WeakSet[BackgroundCompile] = weakref.WeakSet()
# Set as the interpreter starts to exit: a compile started after that (by a worker still
# being built, which exit waits for) compiles nothing.
_EXITING = threading.Event()


def _stop_all() -> None:
    _EXITING.set()
    for job in list(_RUNNING):
        job.stop()


# Called as the interpreter starts to exit, before it joins non-daemon threads (as
# concurrent.futures does for its workers).
threading._register_atexit(_stop_all)


class BackgroundCompile:
    """Compiles ``shapes`` in order, on ``threads`` threads, starting now; at the
    interpreter's exit, only the shapes being compiled are finished.

    Example:
        >>> import numpy as np
        >>> kernel = Kernel(lambda p, x, lengths: x.sum(), devices=[0])  # one device
        >>> job = BackgroundCompile(kernel, None, [([((2, 3), np.float32)], ())], None)
        >>> job.wait(), kernel.compiles
        (True, 1)

    Args:
        kernel: the kernel to compile.
        params: its parameters, already placed.
        shapes: ``(leaf_shapes, length_names)`` per shape, the ones needed first first.
        treedef: the element's tree structure.
        threads: compiles at once; default ``default_threads()``.
    """

    def __init__(
        self,
        kernel: Kernel,
        params: Any,
        shapes: Sequence[tuple[Any, Sequence[str]]],
        treedef: Any,
        threads: int | None = None,
    ):
        self._kernel = kernel
        self._params = params
        self._treedef = treedef
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        for shape in shapes:
            self._todo.put(shape)
        self._stopped = _EXITING.is_set()
        count = min(threads or default_threads(), max(1, len(shapes)))
        self._threads = [
            threading.Thread(target=self._work, name=f"beam_jax-compile-{i}", daemon=False)
            for i in range(count)
        ]
        _RUNNING.add(self)
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Compile no more shapes than those being compiled now."""
        self._stopped = True

    def _work(self) -> None:
        while not self._stopped:
            try:
                shape = self._todo.get_nowait()
            except queue.Empty:
                return
            # A failed shape is recorded in the kernel; its batches dead-letter with it.
            self._kernel.precompile(self._params, [shape], self._treedef, background=True)

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every shape is compiled (or failed); returns whether all are."""
        for thread in self._threads:
            thread.join(timeout)
        return self.done()
