"""The ``beam-jax`` console script: one subcommand per module of ``beam_jax._src.cli``.

Example:
    >>> main(["plan", "--input", "data.parquet", "--column", "tokens"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from beam_jax._src.cli import pipelines, plan, report

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="beam-jax",
        description="Plan buckets for your data, run the pipelines, and read their reports.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    plan.add_parser(subparsers)
    report.add_parser(subparsers)
    pipelines.add_parsers(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one subcommand; returns its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in pipelines.names():
        # The pipelines parse their own flags (and Beam's), so they get argv untouched.
        return pipelines.run_pipeline(argv[0], argv[1:])
    args = _parser().parse_args(argv)
    return args.main(args)


if __name__ == "__main__":
    sys.exit(main())
