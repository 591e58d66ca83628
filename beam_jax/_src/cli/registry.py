"""Names the ``beam-jax`` command loads by ``module:attr`` or by a short registered name.

beam_jax never imports the packages that use it: a package registers its pipelines,
kernels and tokenizers under Python entry-point groups (``beam_jax.pipelines``,
``beam_jax.kernels``, ``beam_jax.tokenizers``) in its ``pyproject.toml``, e.g.
``mine = "mypackage.commands:my_kernel"``, and ``--kernel mine`` loads it. (The sentence
encoders of ``beam_jax.text``, ``minilm`` or a model directory, need no entry point.)
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

__all__ = ["PIPELINES", "KERNELS", "TOKENIZERS", "load", "registered"]

PIPELINES = "beam_jax.pipelines"
KERNELS = "beam_jax.kernels"
TOKENIZERS = "beam_jax.tokenizers"


def registered(group: str) -> dict[str, metadata.EntryPoint]:
    """The names registered under entry-point ``group``, sorted."""
    found = {ep.name: ep for ep in metadata.entry_points(group=group)}
    return dict(sorted(found.items()))


def load(group: str, name: str, flag: str, builtins: str = "") -> Any:
    """The object ``name`` refers to: ``module:attr``, or a name registered in ``group``.

    Args:
        builtins: What else ``flag`` accepts, for the error message (e.g. "'minilm', a
            model directory").

    Raises:
        ValueError: ``name`` is neither, or it does not import; the message names ``flag``,
            the registered names and ``builtins``.
    """
    names = registered(group)
    try:
        if name in names:
            return names[name].load()
        module, _, attr = name.partition(":")
        if module and attr:
            return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{flag} {name!r}: {e}") from e
    known = ", ".join(repr(n) for n in names) or "none installed"
    also = f"{builtins}, " if builtins else ""
    raise ValueError(
        f"{flag} {name!r} is neither {also}a registered name ({known}) nor 'module:attr'"
    )
