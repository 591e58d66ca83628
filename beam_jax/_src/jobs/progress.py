"""Progress of a local run, counted by the workers and printed by the driver.

The multi-process runner's workers are separate processes, and the local runners report
Beam metrics only once the pipeline has finished, so the workers write their counts to
files instead: :class:`CountProgress` counts the elements of a PCollection into one small
file per DoFn instance (rewritten at most twice a second, and at the end of each bundle),
and :class:`ProgressPrinter`, a thread on the driver, sums those files and prints a line.
This works on the runners whose workers share the driver's disk (FnApiRunner in process,
``multi_threading`` and ``multi_processing``); elsewhere the runner's own UI shows progress.
The counts are a running estimate (a retried bundle counts twice); the final summary is
exact, from Beam's metrics.

Example:
    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> with beam.Pipeline("FnApiRunner") as p:
    ...     _ = p | beam.Create(range(5)) | beam.ParDo(CountProgress(directory, "done"))
    >>> read_counts(directory)
    {'done': 5}
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import apache_beam as beam

__all__ = ["CountProgress", "ProgressPrinter", "read_counts"]

# How often a worker rewrites its file, at most: cheap (one small file) and fresh enough
# for a line printed every second or more.
_WRITE_SECONDS = 0.5


class CountProgress(beam.DoFn):
    """Counts elements (or ``size(element)``) into ``directory/FIELD-*.json``; emits nothing.

    Args:
        directory: A local directory the driver reads.
        field: What is counted, e.g. ``"done"`` or ``"dead"``.
        size: How much one element counts (default 1), e.g. ``len`` for batches.
    """

    def __init__(self, directory: str, field: str, size: Callable[[Any], int] | None = None):
        self._directory = directory
        self._field = field
        self._size = size

    def setup(self):
        name = f"{self._field}-{os.getpid()}-{uuid.uuid4().hex}.json"
        self._path = os.path.join(self._directory, name)
        self._count = 0
        self._written = 0.0

    def process(self, element):
        self._count += 1 if self._size is None else self._size(element)
        if time.monotonic() - self._written > _WRITE_SECONDS:
            self._write()
        return ()

    def finish_bundle(self):
        self._write()

    def _write(self) -> None:
        self._written = time.monotonic()
        temporary = f"{self._path}.tmp"
        try:
            with open(temporary, "w") as f:
                f.write(str(self._count))
            os.replace(temporary, self._path)
        except OSError:
            pass  # the driver removed the directory: the run is over, progress is moot


def read_counts(directory: str) -> dict[str, int]:
    """``{field: sum over the workers' files}`` of ``directory``; ``{}`` if it is gone.

    A file being replaced while it is read is skipped (counted next time).
    """
    totals: dict[str, int] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return totals
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                value = int(json.loads(f.read() or "0"))
        except (OSError, ValueError):
            continue  # replaced while being read: counted next time
        field = name.split("-", 1)[0]
        totals[field] = totals.get(field, 0) + value
    return totals


class ProgressPrinter:
    """A driver thread that prints ``done`` and ``dead`` counts every ``seconds``.

    On a terminal the line is rewritten in place; elsewhere (a log, a pipe) a new line is
    printed whenever the counts changed.

    Args:
        name: The job's name, at the start of each line.
        directory: Where the workers' ``CountProgress`` files are.
        stream: Where lines go (the terminal's stderr).
        seconds: Time between lines.
        fields: ``(done field, dead field)``.
    """

    def __init__(
        self,
        name: str,
        directory: str,
        stream: TextIO | None = None,
        seconds: float = 2.0,
        fields: Sequence[str] = ("done", "dead"),
    ):
        self.name = name
        self.directory = directory
        self.stream = stream or sys.stderr
        self.seconds = seconds
        self.fields = tuple(fields)
        self.lines: list[str] = []  # every line printed, for tests and the final newline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="beam_jax-progress", daemon=True)
        self._started = time.monotonic()
        self._last: tuple[int, int] | None = None
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def start(self) -> ProgressPrinter:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Prints the last counts, ends the line, and stops the thread."""
        self._stop.set()
        self._thread.join()
        self._print()
        if self._tty and self.lines:
            self.stream.write("\n")
            self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds):
            self._print()

    def _print(self) -> None:
        counts = read_counts(self.directory)
        done, dead = (counts.get(f, 0) for f in self.fields)
        if (done, dead) == self._last or done + dead == 0:
            return
        self._last = (done, dead)
        elapsed = time.monotonic() - self._started
        rate = (done + dead) / elapsed if elapsed > 0 else 0.0
        line = (
            f"{self.name}: {done + dead:,} records done ({rate:,.1f}/s), "
            f"{dead:,} dead letters so far, {elapsed:.0f} s"
        )
        self.lines.append(line)
        try:
            self.stream.write(f"\r{line}\x1b[K" if self._tty else f"{line}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # the terminal went away; the run goes on
