"""A job's command-line entry point: run it, and end in one line when it fails.

Example:
    >>> def run(argv):
    ...     raise OutputExistsError("out/ holds files; pass --overwrite")
    >>> try:
    ...     run_main("my_job", run, [])
    ... except SystemExit as e:
    ...     print(e)
    my_job: OutputExistsError: out/ holds files; pass --overwrite
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from beam_jax._src.jobs.console import failure_line, verbose_requested
from beam_jax._src.jobs.output_dir import OutputExistsError

__all__ = ["run_main"]


def run_main(
    name: str,
    run: Callable[[Sequence[str] | None], Any],
    argv: Sequence[str] | None = None,
    *,
    user_errors: tuple[type[BaseException], ...] = (),
) -> None:
    """Runs ``run(argv)`` as a command's ``main``: Beam's and JAX's info logs off, and a
    failure ends the process with one line instead of a traceback.

    An error about the user's own files (``OutputExistsError``, and ``user_errors``) ends
    with ``NAME: TYPE: MESSAGE``, since its message says what to do; any other error with
    :func:`failure_line` (where it failed, where the details are), unless ``argv`` asks
    for ``--verbose``, which shows the traceback.

    Args:
        name: The job's name, first on the line.
        run: The job's ``run(argv)``.
        argv: The command-line flags; ``sys.argv[1:]`` when ``None``.
        user_errors: More exception types whose message is for the user as it is.

    Raises:
        SystemExit: When ``run`` raises (and no ``--verbose`` was asked for).
    """
    logging.getLogger().setLevel(logging.WARNING)
    try:
        run(argv)
    except (OutputExistsError, *user_errors) as e:
        sys.exit(f"{name}: {type(e).__name__}: {e}")
    except Exception as e:
        if verbose_requested(argv):
            raise
        sys.exit(failure_line(name, e))
