"""What a pipeline run shows on the terminal: progress, quiet logs, one line on failure.

Unless ``--verbose`` is given, a local run sends Beam's, JAX's and the worker processes'
log output to a log file (``OUTPUT/_unfinished/run.log`` for a local ``--output``, kept
with the unfinished parts when the job fails), so the terminal shows the progress line and
the summary only. A job that fails writes its traceback to the same file, and
``failure_line`` says in one line what failed and where to look.

Example:
    >>> parser = argparse.ArgumentParser()
    >>> add_flags(parser)
    >>> args, rest = parser.parse_known_args(["--no-progress", "--runner=FnApiRunner"])
    >>> try:
    ...     with RunConsole("my_job", args, PipelineOptions(rest), "out") as console:
    ...         raise ValueError("bad row")  # the pipeline's run
    ... except ValueError as error:
    ...     print(failure_line("my_job", error))
    my_job failed: ValueError: bad row (traceback and worker logs in out/_unfinished/run.log)
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_jax._src.jobs import progress
from beam_jax._src.jobs.inputs import RowCount

__all__ = ["RunConsole", "add_flags", "failure_line", "is_local", "prog", "verbose_requested"]

LOG_NAME = "run.log"
_QUIET_LOGGERS = ("apache_beam", "jax", "absl")
_STEP = re.compile(r"while running '([^']+)'")
# Runners whose workers share the driver's machine (and disk): progress files and the log
# file work there.
_LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


def is_local(runner: Any) -> bool:
    """Whether ``runner`` (a name, dotted or not, or a runner object) runs on this machine.

    Example:
        >>> is_local("FnApiRunner"), is_local("DataflowRunner")
        (True, False)
    """
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1] in _LOCAL_RUNNERS


def add_flags(parser: argparse.ArgumentParser, *, progress: bool = True) -> None:
    """Adds ``--verbose``, and with ``progress`` ``--no-progress`` and ``--progress_seconds``."""
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Beam's and JAX's logs (and the workers') on the terminal; by default a "
        "local run writes them to a log file in OUTPUT",
    )
    if not progress:
        return
    parser.add_argument(
        "--no-progress",
        "--no_progress",
        dest="progress",
        action="store_false",
        help="turn off the progress line a local run prints every --progress_seconds "
        "(by default it is shown)",
    )
    parser.add_argument(
        "--progress_seconds",
        type=float,
        default=2.0,
        help="seconds between progress lines (default 2)",
    )


def prog(module: str, command: str) -> str:
    """The name a pipeline's usage line shows: ``beam-jax COMMAND`` when the ``beam-jax``
    console script runs it, else ``python -m MODULE``."""
    script = os.path.normpath(sys.argv[0]) if sys.argv else ""
    by_script = os.path.basename(script) == "beam-jax"
    by_module = script.endswith(os.path.join("beam_jax", "__main__.py"))  # python -m beam_jax
    return f"beam-jax {command}" if by_script or by_module else f"python -m {module}"


def verbose_requested(argv: list[str] | None) -> bool:
    """Whether ``argv`` (``sys.argv[1:]`` when ``None``) asks for ``--verbose``: for the
    error path of a job whose flags could not be parsed."""
    return "--verbose" in (sys.argv[1:] if argv is None else argv)


class RunConsole:
    """Progress files, the log redirection and the failure record of one pipeline run.

    Args:
        name: The job's name, e.g. ``"embed_text"``, at the start of progress lines.
        args: The job's flags (``verbose``, ``progress``, ``progress_seconds``).
        options: Beam's options (the runner decides whether the run is local).
        output: The job's output directory; a local one holds the log.
        log_name: The log's path under ``output``.
        count_progress: Whether workers count records for a progress line (a job of one
            pipeline); a job of several stages prints a line per stage with ``say``.
        total: The rows the run will see, as far as its launch knows: the progress line
            then shows the share done and the time left.

    Attributes:
        progress_dir: Where the workers' ``CountProgress`` files go (fields ``"done"`` and
            ``"dead"``); ``None`` when no progress line is shown (not local, switched off,
            or not ``count_progress``).
        log_path: The log file Beam's and the workers' logs go to (``None``: the terminal).
        local: Whether the runner runs on this machine.
    """

    def __init__(
        self,
        name: str,
        args: argparse.Namespace,
        options: PipelineOptions,
        output: str,
        log_name: str = f"_unfinished/{LOG_NAME}",
        *,
        count_progress: bool = True,
        total: RowCount | None = None,
    ):
        self.name = name
        self.total = total or RowCount()
        self.verbose = bool(getattr(args, "verbose", False))
        self.local = is_local(options.view_as(StandardOptions).runner)
        self.seconds = float(getattr(args, "progress_seconds", 2.0))
        self.show_progress = self.local and bool(getattr(args, "progress", False))
        self.progress_dir = (
            tempfile.mkdtemp(prefix=f"{name}-progress-")
            if self.show_progress and count_progress
            else None
        )
        self.terminal: Any = sys.stderr
        self.log_path = None
        if self.local and not self.verbose:
            if "://" in output:
                handle, self.log_path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
                os.close(handle)
            else:
                self.log_path = os.path.join(output, *log_name.split("/"))
        self.printer: progress.ProgressPrinter | None = None
        self._saved_fd: int | None = None
        self._levels: dict[str, int] = {}

    def __enter__(self) -> RunConsole:
        terminal = sys.stderr
        root = logging.getLogger()
        self._root_level = root.level
        if self.verbose:  # INFO from Beam and JAX, as Beam's own examples show it
            if not root.handlers:
                logging.basicConfig()
            root.setLevel(logging.INFO)
        else:
            for name in _QUIET_LOGGERS:
                logger = logging.getLogger(name)
                self._levels[name] = logger.level
                logger.setLevel(logging.WARNING)
        if self.log_path is not None:
            sys.stderr.flush()
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
            self._saved_fd = os.dup(2)
            log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, 2)  # worker processes inherit fd 2: their logs go to the file too
            os.close(log)
            terminal = os.fdopen(os.dup(self._saved_fd), "w", buffering=1)
            for name in _QUIET_LOGGERS:  # the file gets Beam's INFO lines, the terminal not
                logging.getLogger(name).setLevel(self._levels.get(name, logging.NOTSET))
        self.terminal = terminal
        if self.progress_dir is not None:
            self.printer = progress.ProgressPrinter(
                self.name, self.progress_dir, terminal, self.seconds, total=self.total
            ).start()
        return self

    def say(self, line: str) -> None:
        """Prints ``line`` on the terminal (not into the log), unless progress is off."""
        if not self.show_progress:
            return
        try:
            self.terminal.write(f"{line}\n")
            self.terminal.flush()
        except (OSError, ValueError):
            pass  # the terminal went away; the run goes on

    def __exit__(self, kind, error, tb) -> None:
        if self.printer is not None:
            self.printer.stop()
        if self.terminal is not sys.stderr:
            self.terminal.close()
        self.terminal = sys.stderr
        if error is not None and self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(f"\n{time.strftime('%Y-%m-%d %H:%M:%S')} {self.name} failed:\n")
                traceback.print_exception(kind, error, tb, file=f)
        if error is not None:  # for failure_line
            error.run_log = self.log_path
            error.run_local = self.local
        if self._saved_fd is not None:
            sys.stderr.flush()
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
            self._saved_fd = None
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
        logging.getLogger().setLevel(self._root_level)
        if self.progress_dir is not None:
            shutil.rmtree(self.progress_dir, ignore_errors=True)


def failure_line(name: str, error: BaseException) -> str:
    """One line: what failed, in which step, and where the details are.

    The error's first line is kept whole, however long: a launch error's fix is at its end.
    """
    message = str(error).strip().splitlines()
    first = message[0] if message else ""
    step = _STEP.findall(str(error))
    where = f" in step '{step[-1]}'" if step else ""
    log: Any = getattr(error, "run_log", None)
    if log:
        details = f"traceback and worker logs in {log}"
    elif getattr(error, "run_local", True):
        details = "rerun with --verbose for details"
    else:
        details = "the workers' logs are with the runner, e.g. Dataflow's job page, Logs"
    return f"{name} failed{where}: {type(error).__name__}: {first} ({details})"
