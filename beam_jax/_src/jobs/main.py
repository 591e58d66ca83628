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

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
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

    While ``run`` runs, a command is no IPython session, so ``import IPython`` fails unless
    IPython was imported before (:func:`no_ipython`).

    Raises:
        SystemExit: When ``run`` raises (and no ``--verbose`` was asked for).
    """
    logging.getLogger().setLevel(logging.WARNING)
    try:
        with no_ipython():
            run(argv)
    except (OutputExistsError, *user_errors) as e:
        sys.exit(f"{name}: {type(e).__name__}: {e}")
    except Exception as e:
        if verbose_requested(argv):
            raise
        sys.exit(failure_line(name, e))


@contextlib.contextmanager
def no_ipython() -> Iterator[None]:
    """Within it, ``import IPython`` fails, unless IPython was imported before it.

    Beam asks whether it runs in an IPython session as each transform is applied and as
    the pipeline runs, and asks by importing IPython: about 1 s of a job's launch wherever
    IPython is installed, the session or not. Without IPython imported there is no session,
    so Beam's answer is the same, without the import.

    Example:
        >>> with no_ipython():
        ...     try:
        ...         import IPython
        ...     except ImportError:
        ...         print("not imported")
        not imported
    """
    if "IPython" in sys.modules:  # imported: maybe a session, which Beam must see
        yield
        return
    sys.modules["IPython"] = None  # type: ignore[assignment]  # import halts: ImportError
    try:
        yield
    finally:
        if "IPython" in sys.modules and sys.modules["IPython"] is None:
            del sys.modules["IPython"]
