"""Compile a kernel's listed batch shapes in background threads, several at once.

XLA releases the GIL while it compiles, so compiles in threads run in parallel with each
other and with the worker reading and tokenizing. A batch whose shape is not ready waits
for that shape alone (``Kernel._executable``); one whose shape no thread has started yet
compiles it itself, so the background never makes a batch wait longer than a compile.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Sequence
from typing import Any

from beam_jax._src.kernel.compiled import Kernel


def default_threads() -> int:
    """Compile threads: one per CPU this process may use, at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


class BackgroundCompile:
    """Compiles ``shapes`` in order, on ``threads`` daemon threads, starting now.

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
        count = min(threads or default_threads(), max(1, len(shapes)))
        self._threads = [
            threading.Thread(target=self._work, name=f"beam_jax-compile-{i}", daemon=True)
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
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
