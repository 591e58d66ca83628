"""A labelled text set built at run time: standard-library docstring passages and their module.

The passages are those of :mod:`pipelines.corpus` (the prose of the docstrings that every
CPython install ships), each labelled by the top-level module or package of the file it
comes from (``asyncio``, ``email``, ``logging``...). Passages found in files of more than
one module are left out, since their label would be ambiguous, and only the
``num_classes`` modules with the most passages are kept, so that every class has enough
examples to learn from (about 100 to 280 each for the default 10).

Like the corpus, the result is deterministic for a given Python install, needs no network
and no data files, and differs slightly between Python versions.

Example:
    >>> classes, rows = labelled_passages(4)
    >>> len(classes), rows[0][0], rows[0][2] in classes
    (4, 0, True)
"""

from __future__ import annotations

import collections
import functools
import hashlib
import pathlib

from pipelines import corpus

__all__ = ["DEFAULT_CLASSES", "labelled_passages"]

DEFAULT_CLASSES = 10


@functools.lru_cache(maxsize=1)
def _passages_by_module(root: str) -> dict[str, frozenset[str]]:
    """Each passage, and the top-level modules whose files hold it."""
    base = pathlib.Path(root)
    found: dict[str, set[str]] = collections.defaultdict(set)
    # The corpus's own reading and prose filter, file by file, so the two stay in step.
    for path in corpus._source_files(base):
        module = path.relative_to(base).parts[0].removesuffix(".py")
        for doc in corpus._docstrings(path):
            text = corpus._passage(doc)
            if text is not None:
                found[text].add(module)
    return {text: frozenset(modules) for text, modules in found.items()}


def labelled_passages(
    num_classes: int = DEFAULT_CLASSES,
) -> tuple[tuple[str, ...], list[tuple[int, str, str]]]:
    """The passages of the ``num_classes`` largest modules, labelled by their module.

    Args:
        num_classes: How many modules (classes) to keep, the largest first; at least 2.

    Returns:
        ``(classes, rows)``: the module names, sorted, and ``(id, text, label)`` rows with
        ids ``0..len-1`` in a fixed, well-mixed order (by a hash of the text).

    Raises:
        ValueError: If ``num_classes`` is below 2 or above the number of modules found.
        FileNotFoundError: If this Python install ships no standard-library sources.
    """
    root = corpus.stdlib_root()
    by_text = _passages_by_module(str(root))
    if not by_text:
        raise FileNotFoundError(
            f"found no standard-library docstrings under {root}; use a Python install that "
            "ships its .py sources."
        )
    single = {text: next(iter(mods)) for text, mods in by_text.items() if len(mods) == 1}
    sizes = collections.Counter(single.values())
    if not 2 <= num_classes <= len(sizes):
        raise ValueError(
            f"num_classes must be between 2 and the {len(sizes)} modules found, got {num_classes}."
        )
    # Ties in size are broken by name, so the choice does not depend on dict order.
    ranked = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))
    classes = tuple(sorted(name for name, _ in ranked[:num_classes]))
    kept = sorted(
        (text for text, module in single.items() if module in classes),
        key=lambda t: (hashlib.sha1(t.encode()).hexdigest(), t),
    )
    return classes, [(i, text, single[text]) for i, text in enumerate(kept)]
