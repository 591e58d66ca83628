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

from beam_jax._src.core.wording import counted
from beam_jax._src.jobs.inputs import RowCount

__all__ = ["CountProgress", "ProgressPrinter", "progress_line", "read_counts"]

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


def progress_line(
    name: str,
    done: int,
    dead: int,
    elapsed: float,
    total: RowCount | None = None,
    unreadable: int = 0,
    final: bool = False,
) -> str:
    """One progress line: rows done (every outcome: results and dead letters), of how many
    and what share when the total is known, the dead letters among them, the time, and
    while running the time left at the rate so far.

    Example:
        >>> progress_line("job", 60, 6, 30.0, RowCount(100, exact=True))
        'job: 66 of 100 rows (66%), 6 dead letters, 30 s, about 15 s left'
        >>> progress_line("job", 71, 7, 41.0, RowCount(80), unreadable=1, final=True)
        'job: 78 rows, 7 dead letters, 1 unreadable file, 41 s'
    """
    rows, total = done + dead, total or RowCount()
    # At the end, the count alone unless it is the exact total (an estimate was only that).
    shown = total.rows and (not final or (total.exact and rows == total.rows))
    if shown:
        share = rows / total.rows if final else min(rows / total.rows, 0.99)
        whole = f"{'' if total.exact else '~'}{total.rows:,}"
        head = f"{rows:,} of {whole} {'row' if total.rows == 1 else 'rows'} ({share:.0%})"
    else:
        head = counted(rows, "row")
    parts = [head, counted(dead, "dead letter")]
    if unreadable:
        parts.append(counted(unreadable, "unreadable file"))
    parts.append(f"{elapsed:.0f} s")
    if not final and total.rows and 0 < rows < total.rows and elapsed > 0:
        parts.append(f"about {_duration((total.rows - rows) * elapsed / rows)} left")
    return f"{name}: {', '.join(parts)}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class ProgressPrinter:
    """A driver thread that prints the workers' counts every ``seconds``
    (:func:`progress_line`): ``done`` and ``dead`` (every row ends as one of them), of the
    ``total`` the launch knows, and ``unreadable`` files, where workers count them.

    On a terminal the line is rewritten in place; elsewhere (a log, a pipe) a new line is
    printed whenever the counts changed. :meth:`stop` prints the final counts, which
    equal the run's summary.

    Args:
        name: The job's name, at the start of each line.
        directory: Where the workers' ``CountProgress`` files are.
        stream: Where lines go (the terminal's stderr).
        seconds: Time between lines.
        fields: ``(done field, dead field, unreadable field)``.
        total: The rows the run will see, as far as known.
    """

    def __init__(
        self,
        name: str,
        directory: str,
        stream: TextIO | None = None,
        seconds: float = 2.0,
        fields: Sequence[str] = ("done", "dead", "unreadable"),
        total: RowCount | None = None,
    ):
        self.name = name
        self.directory = directory
        self.stream = stream or sys.stderr
        self.seconds = seconds
        self.fields = tuple(fields)
        self.total = total or RowCount()
        self.lines: list[str] = []  # every line printed, for tests and the final newline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="beam_jax-progress", daemon=True)
        self._started = time.monotonic()
        self._last: tuple[int, ...] | None = None
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def start(self) -> ProgressPrinter:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Prints the last counts, ends the line, and stops the thread."""
        self._stop.set()
        self._thread.join()
        self._print(final=True)
        if self._tty and self.lines:
            self.stream.write("\n")
            self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds):
            self._print()

    def _print(self, final: bool = False) -> None:
        counts = read_counts(self.directory)
        done, dead, *more = (counts.get(f, 0) for f in self.fields)
        unreadable = more[0] if more else 0
        now = (done, dead, unreadable)
        if (now == self._last and not final) or done + dead + unreadable == 0:
            return
        self._last = now
        elapsed = time.monotonic() - self._started
        line = progress_line(self.name, done, dead, elapsed, self.total, unreadable, final)
        self.lines.append(line)
        try:
            self.stream.write(f"\r{line}\x1b[K" if self._tty else f"{line}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # the terminal went away; the run goes on
