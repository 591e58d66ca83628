"""A job's command line: argparse value types, a help formatter, and one parse for the
job's flags and Beam's.

:func:`parse_job_args` parses the job's own flags and passes every other flag to Beam's
``PipelineOptions`` (a runner's own options included); a flag neither knows stops the
launch with a suggestion (a misspelled ``--inptu`` or ``--id-colum`` is never dropped).
Every flag takes either spelling, ``--id_column`` or ``--id-column``.

Example:
    >>> parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    >>> _ = parser.add_argument("--sizes", type=int_list, default=(16, 32))
    >>> add_compilation_cache_flag(parser)
    >>> args, options = parse_job_args(parser, ["--sizes", "8,64", "--direct_num_workers=2"])
    >>> args.sizes, options.view_as(StandardOptions).runner
    ((8, 64), 'FnApiRunner')
    >>> args.compilation_cache_dir == os.path.expanduser(DEFAULT_COMPILATION_CACHE)
    True
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence

from apache_beam.options.pipeline_options import (
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
)

from beam_jax._src.jobs import flag_names
from beam_jax._src.jobs.console import is_local
from beam_jax._src.jobs.images import ALLOW_MISMATCH_FLAG, beam_version_mismatch
from beam_jax._src.jobs.runner_here import tpu_shared_by_processes

__all__ = [
    "DEFAULT_COMPILATION_CACHE",
    "DefaultsHelpFormatter",
    "add_compilation_cache_flag",
    "int_list",
    "non_negative",
    "parse_job_args",
    "positive_int",
    "ratio",
    "reject_unknown_flags",
]

# Runners named only by their path (Beam's ALL_KNOWN_RUNNERS lacks them). Dask is
# beam_jax's adapter over Beam's DaskRunner, which beam_jax's transforms refuse.
_RUNNERS_BY_PATH_ONLY = (
    "beam_jax.runners.DaskRunner",
    "apache_beam.runners.render.RenderRunner",
)

# Local runs keep compiled shapes across runs (JAX keys entries by the program, the JAX
# version and the device, so a stale entry is never used).
DEFAULT_COMPILATION_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", "~/.cache"), "beam_jax", "jax_compilation_cache"
)


def int_list(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated ints, at least one (``"16,32"`` -> ``(16, 32)``)."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one int, got {text!r}")
    return values


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def non_negative(text: str) -> float:
    """An argparse type: a number >= 0."""
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def ratio(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a ratio in [0, 1], got {text!r}")
    return value


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to a flag's help unless it says its default already
    (a tuple default shows comma-separated, as :func:`int_list` reads it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # A switch says what it does in its help ("--no-progress ... (default: True)" reads
        # as progress off); a default of 0 is shown as any other (0 == False in Python).
        switch = isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction)
        if (
            "default" not in text
            and not switch
            and action.default is not None
            and action.default is not argparse.SUPPRESS
            and action.option_strings
        ):
            default = action.default
            if isinstance(default, tuple):
                default = ",".join(map(str, default))
            text += f" (default: {default})"
        return text


def add_compilation_cache_flag(parser: argparse.ArgumentParser) -> None:
    """Adds ``--compilation_cache_dir``, which :func:`parse_job_args` resolves: the
    directory given, :data:`DEFAULT_COMPILATION_CACHE` on the local runners when none is,
    and ``None`` for ``none`` or on remote runners."""
    parser.add_argument(
        "--compilation_cache_dir",
        help="JAX persistent compilation cache (local or gs://), so a rerun or a new worker "
        f"loads its compiled shapes instead of compiling them; default "
        f"{DEFAULT_COMPILATION_CACHE} on the local runners, none elsewhere; 'none' turns it off",
    )


def _runner_of(argv: Sequence[str]) -> str | None:
    """The ``--runner`` in ``argv`` (the last one, as argparse takes it), if any."""
    runner = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
        elif arg == "--runner" and i + 1 < len(argv):
            runner = argv[i + 1]
    return runner


def _runner_problem(runner: str) -> str | None:
    """Why ``--runner`` names no runner Beam knows, with the closest known name."""
    if "." in runner:  # a dotted path to a runner class: its module must import
        return flag_names.runner_import_problem(runner)
    known = [path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS]
    lower = {name.lower(): name for name in known}
    name = runner.lower()
    if name in lower or f"{name}runner" in lower:  # Beam's own leniency: "direct", "fnapirunner"
        return None
    by_path = {path.rsplit(".", 1)[-1].lower(): path for path in _RUNNERS_BY_PATH_ONLY}
    path = by_path.get(name) or by_path.get(f"{name}runner")
    if path:
        return f"--runner {runner} is named by its path: --runner {path}"
    close = difflib.get_close_matches(name, list(lower), n=1, cutoff=0.6)
    close = close or difflib.get_close_matches(f"{name}runner", list(lower), n=1, cutoff=0.6)
    hint = f"did you mean {lower[close[0]]}? " if close else ""
    return (
        f"--runner {runner} is not a runner Beam knows; {hint}Beam's runners: "
        f"{', '.join(sorted(known))} (or a dotted path to a runner class, e.g. "
        f"{_RUNNERS_BY_PATH_ONLY[0]})"
    )


def _beam_rest(parser: argparse.ArgumentParser, rest: Sequence[str]) -> list[str]:
    """``rest`` with Beam's flags spelled as Beam defines them; exits through
    ``parser.error`` on a word that neither ``parser`` nor Beam takes."""
    ours = list(parser._option_string_actions)
    try:
        return flag_names.check_beam_flags(rest, ours, _runner_of(rest))
    except flag_names.UnknownFlags as e:
        hint = "; ".join(e.hints)
        parser.error(
            f"unrecognized arguments: {' '.join(e.words)} (neither this job's flags nor "
            f"Beam's PipelineOptions have them){'; ' + hint if hint else ''}"
        )
    except argparse.ArgumentError as e:
        parser.error(f"{e} (a flag of Beam's PipelineOptions)")


def reject_unknown_flags(parser: argparse.ArgumentParser, rest: Sequence[str]) -> None:
    """Exits through ``parser.error`` if ``rest`` (what ``parse_known_args`` left) holds a
    flag that neither ``parser`` nor Beam's ``PipelineOptions`` knows (a runner's own
    options included, in either spelling), suggesting the closest of ``parser``'s flags
    or Beam's.

    Raises:
        SystemExit: On such a flag (after printing the usage and the reason).
    """
    _beam_rest(parser, rest)


def parse_job_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    *,
    default_runner: str = "FnApiRunner",
) -> tuple[argparse.Namespace, PipelineOptions]:
    """Splits ``argv`` into ``parser``'s flags and Beam's ``PipelineOptions``.

    Every flag takes either spelling (``--batch_size``, ``--batch-size``). Every flag
    ``parser`` does not know must be one of Beam's (``--runner``, ``--project``,
    ``--temp_location`` ..., and a runner's own options, such as the DaskRunner's
    ``--dask_client_address``, whose module is imported to know them), which pass through
    as Beam spells them; any other is refused with the closest flag. The runner defaults to
    ``default_runner``; ``--dry_run`` is accepted only with the DataflowRunner (other
    runners ignore it and would run the whole job); a job whose workers' image holds
    another Beam than the one installed here is refused (``--allow_beam_version_mismatch``
    launches it anyway; :func:`~beam_jax._src.jobs.images.beam_version_mismatch`); so is
    a local ``multi_processing`` run of several workers on a TPU host
    (:func:`~beam_jax._src.jobs.runner_here.tpu_shared_by_processes`); a
    ``--compilation_cache_dir`` flag
    (:func:`add_compilation_cache_flag`) is resolved; ``save_main_session`` is off (workers
    import the job's code from its package); ``--version`` prints the versions and exits.
    A flag's prefix is no flag (``parser.allow_abbrev`` is turned off).

    Raises:
        SystemExit: On a flag that neither ``parser`` nor Beam knows, a worker image on
            another Beam, worker processes that would share a TPU, or a bad value
            (after printing the usage and the reason, as argparse does).
    """
    if ALLOW_MISMATCH_FLAG not in parser._option_string_actions:
        parser.add_argument(
            ALLOW_MISMATCH_FLAG,
            action="store_true",
            help="launch even where the workers' image holds another Beam than this machine's "
            "(by default such a job is refused before anything is staged)",
        )
    flag_names.add_version_flag(parser)
    parser.allow_abbrev = False  # a prefix of a job's flag must not take a Beam flag's value
    argv = list(sys.argv[1:] if argv is None else argv)
    runner = _runner_of(argv)
    if runner and (problem := _runner_problem(runner)):
        parser.error(problem)
    known = [*parser._option_string_actions, *flag_names.beam_flags()]
    args, rest = parser.parse_known_args(flag_names.respell(argv, known))
    options = PipelineOptions(_beam_rest(parser, rest))
    standard = options.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = default_runner
    if options.view_as(TestOptions).dry_run and "DataflowRunner" not in str(standard.runner):
        parser.error(f"--dry_run builds the job without running it only with --runner "
                     f"DataflowRunner, got --runner {standard.runner}")  # fmt: skip
    mismatch = beam_version_mismatch(options)
    if mismatch and not args.allow_beam_version_mismatch:
        parser.error(mismatch)
    if shared := tpu_shared_by_processes(options):
        parser.error(shared)
    if hasattr(args, "compilation_cache_dir"):
        if args.compilation_cache_dir in ("none", ""):
            args.compilation_cache_dir = None
        elif args.compilation_cache_dir is None and is_local(standard.runner):
            args.compilation_cache_dir = os.path.expanduser(DEFAULT_COMPILATION_CACHE)
    options.view_as(SetupOptions).save_main_session = False
    return args, options
