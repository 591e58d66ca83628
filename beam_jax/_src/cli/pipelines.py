"""``beam-jax NAME``: the pipelines packages register (``beam-jax embed``, ``beam-jax curate``).

A package registers a pipeline under the ``beam_jax.pipelines`` entry-point group as
``NAME = "package.module:ATTR"``, where ``ATTR`` is ``(module whose main(argv) runs it,
one-line help)``. Every argument after the name goes to the pipeline's own flags (its
``--help`` lists them, Beam's flags included), exactly as ``python -m MODULE`` takes them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from beam_jax._src.cli import registry

__all__ = ["names", "run_pipeline"]


def names() -> dict[str, tuple[str, str]]:
    """``{name: (module, one-line help)}`` of the registered pipelines."""
    return {name: ep.load() for name, ep in registry.registered(registry.PIPELINES).items()}


def add_parsers(subparsers) -> None:
    """Lists the pipelines in ``beam-jax --help`` (their flags are the pipelines' own)."""
    for name, (module, text) in names().items():
        subparsers.add_parser(
            name, help=f"{text} (python -m {module}; see beam-jax {name} --help)", add_help=False
        )


def run_pipeline(name: str, argv: Sequence[str]) -> int:
    """Runs pipeline ``name``'s ``main`` with ``argv`` (a package's, from its ``__main__``)."""
    module = importlib.import_module(names()[name][0])
    if not hasattr(module, "main"):
        module = importlib.import_module(f"{module.__name__}.__main__")
    module.main(list(argv))
    return 0
