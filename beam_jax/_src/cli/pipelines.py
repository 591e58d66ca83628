"""``beam-jax embed`` and ``beam-jax curate``: the pipelines of ``pipelines/``, by name.

Every argument after the name goes to the pipeline's own flags (its ``--help`` lists
them, Beam's flags included), exactly as ``python -m pipelines.embed_text`` takes them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

__all__ = ["PIPELINES", "run_pipeline"]

# name -> (module, one-line help)
PIPELINES = {
    "embed": ("pipelines.embed_text", "sentence embeddings (MiniLM in JAX) of a text column"),
    "curate": ("pipelines.curate", "find mislabelled records by per-record gradient scores"),
}


def add_parsers(subparsers) -> None:
    """Lists the pipelines in ``beam-jax --help`` (their flags are the pipelines' own)."""
    for name, (module, text) in PIPELINES.items():
        subparsers.add_parser(
            name, help=f"{text} (python -m {module}; see beam-jax {name} --help)", add_help=False
        )


def run_pipeline(name: str, argv: Sequence[str]) -> int:
    """Runs pipeline ``name``'s ``main`` with ``argv``."""
    module = importlib.import_module(PIPELINES[name][0])
    module.main(list(argv))
    return 0
