"""The ``beam-jax`` console script: one subcommand per module of ``beam_jax._src.cli``.

Example:
    >>> main(["plan", "--input", "data.parquet", "--column", "tokens"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence

from beam_jax._src.cli import pipelines, plan, report
from beam_jax._src.jobs import flag_names

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="beam-jax",
        description="Plan buckets for your data, run the pipelines, and read their reports.",
        epilog="Every flag takes either spelling: --max_buckets or --max-buckets.",
        allow_abbrev=False,
    )
    flag_names.add_version_flag(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (plan.add_parser(subparsers), report.add_parser(subparsers)):
        flag_names.add_version_flag(command)
    pipelines.add_parsers(subparsers)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one subcommand; returns its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in pipelines.names():
        # The pipelines parse their own flags (and Beam's), so they get argv untouched.
        return pipelines.run_pipeline(argv[0], argv[1:])
    parser = _parser()
    commands = _subcommands(parser)
    if argv and argv[0] in commands:
        # The subcommand's own parse: either spelling of a flag, a suggestion for a typo.
        args = flag_names.parse_flags(commands[argv[0]], argv[1:])
        return args.main(args)
    if argv and not argv[0].startswith("-"):
        close = difflib.get_close_matches(argv[0], list(commands), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        parser.error(f"no command {argv[0]!r}{hint} (commands: {', '.join(commands)})")
    args = parser.parse_args(argv)
    return args.main(args)


if __name__ == "__main__":
    sys.exit(main())
