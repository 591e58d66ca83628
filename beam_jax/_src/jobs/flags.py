"""A job's command line: argparse value types, a help formatter, and one parse for the
job's flags and Beam's.

:func:`parse_job_args` parses the job's own flags and passes every other flag to Beam's
``PipelineOptions``; a flag neither knows stops the launch with a suggestion (a misspelled
``--inptu`` is not dropped with a warning).

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
from collections.abc import Sequence

from apache_beam.options.pipeline_options import (
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
)

from beam_jax._src.jobs.console import is_local
from beam_jax._src.jobs.images import ALLOW_MISMATCH_FLAG, beam_version_mismatch

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


def _unknown_flags(rest: Sequence[str]) -> list[str]:
    """The flags in ``rest`` that Beam's PipelineOptions do not know either."""
    known = set(PipelineOptions([]).get_all_options())
    parsed = PipelineOptions(list(rest)).get_all_options(retain_unknown_options=True)
    unknown = {f"--{name}" for name in set(parsed) - known}
    bad = []
    for i, arg in enumerate(rest):
        name = arg.split("=", 1)[0]
        if name in unknown or (arg.startswith("-") and not arg.startswith("--")):
            bad.append(name)
        elif not arg.startswith("-") and (i == 0 or not rest[i - 1].startswith("--")
                                          or "=" in rest[i - 1]):  # fmt: skip
            bad.append(arg)  # a word that is no flag's value
    return bad


def _closest(name: str, choices: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(name, choices, n=1, cutoff=0.6)


def _runner_problem(runner: str) -> str | None:
    """Why ``--runner`` names no runner Beam knows, with the closest known name."""
    known = [path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS]
    if "." in runner:  # a dotted path to a runner class of one's own: Beam imports it
        return None
    lower = {name.lower(): name for name in known}
    name = runner.lower()
    if name in lower or f"{name}runner" in lower:  # Beam's own leniency: "direct", "fnapirunner"
        return None
    close = _closest(name, list(lower)) or _closest(f"{name}runner", list(lower))
    hint = f"did you mean {lower[close[0]]}? " if close else ""
    return (
        f"--runner {runner} is not a runner Beam knows; {hint}Beam's runners: "
        f"{', '.join(sorted(known))} (or a dotted path to a runner class)"
    )


def reject_unknown_flags(parser: argparse.ArgumentParser, rest: Sequence[str]) -> None:
    """Exits through ``parser.error`` if ``rest`` (what ``parse_known_args`` left) holds a
    flag that neither ``parser`` nor Beam's ``PipelineOptions`` knows, suggesting the
    closest of ``parser``'s flags.

    Raises:
        SystemExit: On such a flag (after printing the usage and the reason).
    """
    unknown = _unknown_flags(rest)
    if unknown:
        ours = [a for action in parser._actions for a in action.option_strings]
        # Beam's own options too: a misspelled --runer is as likely as a misspelled --inptu.
        beams = [f"--{name}" for name in PipelineOptions([]).get_all_options()]
        hints = {u: _closest(u, ours) or _closest(u, beams) for u in unknown}
        hint = "; ".join(f"did you mean {h[0]} for {u}?" for u, h in hints.items() if h)
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)} (neither this job's flags nor "
            f"Beam's PipelineOptions have them){'; ' + hint if hint else ''}"
        )


def parse_job_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    *,
    default_runner: str = "FnApiRunner",
) -> tuple[argparse.Namespace, PipelineOptions]:
    """Splits ``argv`` into ``parser``'s flags and Beam's ``PipelineOptions``.

    Every flag ``parser`` does not know must be one of Beam's (``--runner``, ``--project``,
    ``--temp_location`` ...), which pass through unchanged. The runner defaults to
    ``default_runner``; ``--dry_run`` is accepted only with the DataflowRunner (other
    runners ignore it and would run the whole job); a job whose workers' image holds
    another Beam than the one installed here is refused (``--allow_beam_version_mismatch``
    launches it anyway; ``beam_jax.jobs.beam_version_mismatch``); a ``--compilation_cache_dir`` flag
    (:func:`add_compilation_cache_flag`) is resolved; ``save_main_session`` is off (workers
    import the job's code from its package).

    Raises:
        SystemExit: On a flag that neither ``parser`` nor Beam knows, a worker image on
            another Beam, or a bad value
            (after printing the usage and the reason, as argparse does).
    """
    if ALLOW_MISMATCH_FLAG not in parser._option_string_actions:
        parser.add_argument(
            ALLOW_MISMATCH_FLAG,
            action="store_true",
            help="launch even where the workers' image holds another Beam than this machine's "
            "(by default such a job is refused before anything is staged)",
        )
    args, rest = parser.parse_known_args(argv)
    reject_unknown_flags(parser, rest)
    options = PipelineOptions(rest)
    standard = options.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = default_runner
    elif isinstance(standard.runner, str) and (problem := _runner_problem(standard.runner)):
        parser.error(problem)
    if options.view_as(TestOptions).dry_run and "DataflowRunner" not in str(standard.runner):
        parser.error(f"--dry_run builds the job without running it only with --runner "
                     f"DataflowRunner, got --runner {standard.runner}")  # fmt: skip
    mismatch = beam_version_mismatch(options)
    if mismatch and not args.allow_beam_version_mismatch:
        parser.error(mismatch)
    if hasattr(args, "compilation_cache_dir"):
        if args.compilation_cache_dir in ("none", ""):
            args.compilation_cache_dir = None
        elif args.compilation_cache_dir is None and is_local(standard.runner):
            args.compilation_cache_dir = os.path.expanduser(DEFAULT_COMPILATION_CACHE)
    options.view_as(SetupOptions).save_main_session = False
    return args, options
