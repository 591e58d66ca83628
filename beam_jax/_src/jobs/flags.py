"""A runnable job's command line: flag types, help with defaults, and Beam's flags beside
the job's own.

A job parses its own flags with ``parse_known_args`` and hands the rest to Beam's
``PipelineOptions``; :func:`reject_unknown_flags` then refuses what neither knows (a typo
would otherwise be passed to Beam and ignored), suggesting the closest of the job's flags.

Example:
    >>> parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    >>> _ = parser.add_argument("--passes", type=positive_int, default=3, help="passes")
    >>> args, rest = parser.parse_known_args(["--passes", "2", "--runner=FnApiRunner"])
    >>> reject_unknown_flags(parser, rest)
    >>> args.passes, rest
    (2, ['--runner=FnApiRunner'])
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

__all__ = [
    "DEFAULT_COMPILATION_CACHE",
    "DefaultsHelpFormatter",
    "int_list",
    "positive_int",
    "reject_unknown_flags",
]

# Local runs keep compiled shapes across runs (JAX keys entries by the program, the JAX
# version and the device, so a stale entry is never used).
DEFAULT_COMPILATION_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", "~/.cache"), "beam_jax", "jax_compilation_cache"
)


def positive_int(text: str) -> int:
    """An argparse type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated ints, at least one (``"16,32,64"``)."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one int, got {text!r}")
    return values


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to a flag's help unless it says its default already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" not in text
            and action.default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
        ):
            default = action.default
            if isinstance(default, tuple):
                default = ",".join(map(str, default))
            text += f" (default: {default})"
        return text


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


def reject_unknown_flags(parser: argparse.ArgumentParser, rest: Sequence[str]) -> None:
    """Exits through ``parser.error`` if ``rest`` (what ``parse_known_args`` left) holds a
    flag that neither ``parser`` nor Beam's ``PipelineOptions`` knows, or a stray word,
    suggesting the closest of ``parser``'s flags.

    Raises:
        SystemExit: On such a flag (after printing the usage and the reason).
    """
    unknown = _unknown_flags(rest)
    if unknown:
        ours = [a for action in parser._actions for a in action.option_strings]
        hints = {u: difflib.get_close_matches(u, ours, n=1, cutoff=0.6) for u in unknown}
        hint = "; ".join(f"did you mean {h[0]} for {u}?" for u, h in hints.items() if h)
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)} (neither this job's flags nor "
            f"Beam's PipelineOptions have them){'; ' + hint if hint else ''}"
        )
