"""Flag names on a command line: either spelling of a flag, Beam's flags (a runner's own
among them), and a suggestion for a flag that nothing knows.

Every command takes ``--a_b`` and ``--a-b`` alike (:func:`respell` writes either as the
spelling its parser defines). Beam's flags are those of every ``PipelineOptions`` subclass
imported so far, which is why a runner's own options (``--dask_client_address`` of Beam's
DaskRunner) exist only once its module is imported: :func:`beam_flags` imports the runner
``--runner`` names by its path and, when a flag is still unknown, the modules of
:data:`RUNNER_OPTION_MODULES`. A flag unknown after that is refused, with the closest flag
of the command's or Beam's, or with the package that would define it.

Example:
    >>> flags = ["--id_column", "--temp_location"]
    >>> respell(["--id-column", "doc", "--temp-location=gs://b/t"], flags)
    ['--id_column', 'doc', '--temp_location=gs://b/t']
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import re
from collections.abc import Iterable, Sequence
from importlib import metadata

from apache_beam.options.pipeline_options import PipelineOptions

__all__ = [
    "RUNNER_OPTION_MODULES",
    "UnknownFlags",
    "add_version_flag",
    "beam_flags",
    "check_beam_flags",
    "closest_flag",
    "parse_flags",
    "respell",
    "runner_import_problem",
    "version_line",
]

# Beam modules (outside apache_beam.options) whose PipelineOptions subclasses register only
# once imported, with what installs what they import. tests/test_new_user_launch.py checks
# this list against the installed Beam's sources, so a new one is not missed.
RUNNER_OPTION_MODULES: dict[str, str | None] = {
    "apache_beam.runners.dask.dask_runner": "apache-beam[dask]",
    "apache_beam.runners.render": None,
    "apache_beam.yaml.options": None,
}
_FLAG_IN_SOURCE = re.compile(r"""['"](--[A-Za-z][A-Za-z0-9_-]*)['"]""")
_FLAG = re.compile(r"^-(-|[A-Za-z])")  # not a negative number
_imported_runner_modules: dict[str, str | None] = {}  # module -> why it did not import


def _key(flag: str) -> str:
    """What both spellings of ``flag`` share: ``--a-b`` and ``--a_b`` give ``a_b``."""
    return flag[2:].replace("-", "_")


def respell(argv: Sequence[str], flags: Iterable[str]) -> list[str]:
    """``argv`` with each ``--a-b`` or ``--a_b`` that is not in ``flags`` but whose other
    spelling is written as in ``flags`` (the first of ``flags`` wins where two share a
    spelling). Values (``--x=--y``) and everything after ``--`` are left as they are."""
    flags = [f for f in flags if f.startswith("--")]
    exact = set(flags)
    by_key: dict[str, str] = {}
    for flag in flags:
        by_key.setdefault(_key(flag), flag)
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        if name.startswith("--") and name not in exact and _key(name) in by_key:
            out[i] = f"{by_key[_key(name)]}{eq}{value}"
    return out


def _beam_parser() -> argparse.ArgumentParser:
    """The parser Beam builds from every ``PipelineOptions`` subclass imported so far."""
    captured: list[argparse.ArgumentParser] = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=captured.append)
    parser = captured[0]
    parser.exit_on_error = False  # a bad value raises, for the command's own usage line
    return parser


def _import_runner_modules(runner: str | None) -> None:
    """Imports :data:`RUNNER_OPTION_MODULES` and the module of a dotted ``runner``, once
    each, remembering why one did not import."""
    modules = list(RUNNER_OPTION_MODULES)
    if runner and "." in runner:
        modules.append(runner.rsplit(".", 1)[0])
    for module in modules:
        if module not in _imported_runner_modules:
            try:
                importlib.import_module(module)
                _imported_runner_modules[module] = None
            except Exception as e:  # noqa: BLE001 - any failure: the flag is then explained
                _imported_runner_modules[module] = f"{type(e).__name__}: {e}"


def runner_import_problem(runner: str) -> str | None:
    """Why the module of a dotted ``--runner`` does not import here, else ``None``."""
    _import_runner_modules(runner)
    module = runner.rsplit(".", 1)[0]
    why = _imported_runner_modules.get(module)
    if why is None:
        return None
    extra = RUNNER_OPTION_MODULES.get(module)
    fix = f"; install {extra}" if extra else ""
    return f"--runner {runner}: its module {module} does not import ({why}){fix}"


def beam_flags() -> dict[str, argparse.Action]:
    """Beam's flags now: those of every ``PipelineOptions`` subclass imported so far."""
    return dict(_beam_parser()._option_string_actions)


def _flags_of_missing_modules() -> dict[str, str]:
    """The flags that the modules of :data:`RUNNER_OPTION_MODULES` which did not import
    would define (read from their source), each with why it is missing and the fix."""
    out: dict[str, str] = {}
    for module, why in _imported_runner_modules.items():
        if why is None or module not in RUNNER_OPTION_MODULES:
            continue
        try:
            with open(importlib.util.find_spec(module).origin, encoding="utf-8") as f:
                defined = _FLAG_IN_SOURCE.findall(f.read())
        except (ImportError, AttributeError, OSError, TypeError):
            continue
        extra = RUNNER_OPTION_MODULES[module]
        fix = f"; install {extra}" if extra else ""
        for flag in defined:
            out.setdefault(
                flag, f"is an option of {module}, which does not import here ({why}){fix}"
            )
    return out


def _hint(word: str, ours: Sequence[str], beams: Sequence[str]) -> str | None:
    """What to say about ``word``, a flag nobody knows: the closest flag, or the module
    (not importable here) that would define it."""
    if not word.startswith("--"):
        return None
    missing = _flags_of_missing_modules()
    close = closest_flag(word, ours, beams, missing)
    if close in missing:
        also = "" if _key(close) == _key(word) else f"did you mean {close}? "
        return f"{also}{close} {missing[close]}"
    return f"did you mean {close} for {word}?" if close else None


def closest_flag(flag: str, *flag_lists: Iterable[str]) -> str | None:
    """The flag of ``flag_lists`` closest to ``flag`` in either spelling (the earlier list
    on a tie), written as it is defined; ``None`` when none is close."""
    best, best_score = None, 0.0
    for flags in flag_lists:
        for f in flags:
            if not f.startswith("--"):
                continue
            score = difflib.SequenceMatcher(None, _key(flag), _key(f)).ratio()
            if score >= 0.6 and score > best_score:
                best, best_score = f, score
    return best


class UnknownFlags(Exception):
    """What no parser knows in an argument list: the words, and the hints for them."""

    def __init__(self, words: Sequence[str], hints: Sequence[str]):
        self.words = list(words)
        self.hints = list(hints)
        super().__init__(" ".join(self.words))


def _leftovers(parser: argparse.ArgumentParser, rest: Sequence[str]) -> list[str]:
    """The words of ``rest`` that ``parser`` does not take: unknown flags (the word after
    one, when it has no ``=``, taken as its value), single-dash flags and stray words."""
    _, extras = parser.parse_known_args(list(rest))
    bad = []
    for i, word in enumerate(extras):
        previous = extras[i - 1] if i else ""
        if not word.startswith("-") and previous.startswith("--") and "=" not in previous:
            continue  # the value of the unknown flag before it
        bad.append(word.split("=", 1)[0] if word.startswith("-") else word)
    return bad


def check_beam_flags(
    rest: Sequence[str], ours: Iterable[str] = (), runner: str | None = None
) -> list[str]:
    """``rest`` (what a command's own parser left) with Beam's flags written as Beam spells
    them, after checking that Beam knows each one.

    Args:
        rest: The words left.
        ours: The command's own flags, for suggestions.
        runner: The ``--runner`` given, whose module (a dotted path) defines options too.

    Raises:
        UnknownFlags: Naming the flags neither the command nor Beam knows.
        argparse.ArgumentError: A Beam flag's value is bad (``--direct_num_workers x``).
    """
    if runner and "." in runner:
        _import_runner_modules(runner)
    rest = respell(rest, beam_flags())
    unknown = _leftovers(_beam_parser(), rest)
    if unknown and any(w.startswith("--") for w in unknown):
        _import_runner_modules(runner)  # a runner's options register on import
        rest = respell(rest, beam_flags())
        unknown = _leftovers(_beam_parser(), rest)
    if unknown:
        ours, beams = list(ours), list(beam_flags())
        hints = [hint for word in unknown if (hint := _hint(word, ours, beams))]
        raise UnknownFlags(unknown, hints)
    return rest


def parse_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)`` for a command without Beam's flags: either spelling of
    each flag, no prefix taken for a flag, and an unknown flag refused with the closest one.

    Raises:
        SystemExit: On an unknown flag or a bad value (after the usage and the reason).
    """
    parser.allow_abbrev = False  # as for a job's flags: a prefix is no flag
    flags = list(parser._option_string_actions)
    argv = respell(argv, flags)
    # Unknown flags first: a misspelled --colum is the news, not the --column it leaves out.
    words = argv[: argv.index("--")] if "--" in argv else argv
    unknown = [w for w in words if _FLAG.match(w) and w.split("=", 1)[0] not in flags]
    if not unknown:
        args, unknown = parser.parse_known_args(argv)
        if not unknown:
            return args
    hints = []
    for word in unknown:
        name = word.split("=", 1)[0]
        if name.startswith("--") and (close := closest_flag(name, flags)):
            hints.append(f"did you mean {close} for {name}?")
    hint = f"; {'; '.join(hints)}" if hints else ""
    parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


def version_line() -> str:
    """``beam-jax VERSION`` with the versions of Beam, JAX and Python it runs with."""
    import platform

    import beam_jax

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"beam-jax {beam_jax.__version__} (apache-beam {installed('apache-beam')}, "
        f"jax {installed('jax')}, Python {platform.python_version()})"
    )


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        kwargs.setdefault("help", "print the versions of beam-jax, Beam, JAX and Python, and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """Adds ``--version`` (:func:`version_line`), unless ``parser`` has it."""
    if "--version" not in parser._option_string_actions:
        parser.add_argument("--version", action=_VersionAction)
