"""A built-in corpus of real English prose: the docstrings of the Python standard library.

The ``.py`` files are parsed with :mod:`ast` (no code runs); each docstring's prose
paragraphs (not code, doctests, tables or argument lists) become one passage, short or
longer than a 256-token window. Deterministic for a given Python install, no network or
data files; tests, IDLE, Tkinter and distutils are left out. :func:`builtin_corpus` gives
the passages; :func:`labelled_corpus` labels them by their top-level module, for
classification.

Example:
    >>> corpus = builtin_corpus(5)
    >>> [i for i, _ in corpus]
    [0, 1, 2, 3, 4]
    >>> classes, rows = labelled_corpus(4)
    >>> len(classes), rows[0][0], rows[0][2] in classes
    (4, 0, True)
"""

from __future__ import annotations

import ast
import collections
import functools
import hashlib
import os
import pathlib
import re
import sysconfig

__all__ = ["builtin_corpus", "labelled_corpus"]

# Test suites and vendored third-party trees: their docstrings are terse or not prose.
_SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "lib2to3", "__pycache__"}
)
_SKIP_TOP = frozenset({"idlelib", "tkinter", "turtledemo", "distutils", "ensurepip", "pydoc_data"})
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# A plain word, optionally followed by closing punctuation: "value", "it's", "end.".
_WORD = re.compile(r"^[(\"'`]?[A-Za-z][a-z]*(?:['-][a-z]+)*[)\"'`]?[.,;:!?)]*$")
_PROSE_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:'\"-()?!`"
)
_MIN_WORDS = 5


def stdlib_root() -> pathlib.Path:
    """Returns the directory holding this interpreter's pure-Python standard library."""
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def _source_files(root: pathlib.Path) -> list[pathlib.Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        skip = _SKIP_DIRS | _SKIP_TOP if pathlib.Path(dirpath) == root else _SKIP_DIRS
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        files.extend(pathlib.Path(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _docstrings(path: pathlib.Path) -> list[str]:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, UnicodeDecodeError, OSError):
        return []  # e.g. files kept deliberately invalid, or unreadable
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, _DOC_NODES):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                docs.append(doc)
    return docs


def _is_prose(lines: list[str]) -> bool:
    """Tells whether a paragraph (its raw lines) reads as English prose."""
    first_indent = len(lines[0]) - len(lines[0].lstrip())
    for line in lines:
        stripped = line.lstrip()
        # Doctests, shell sessions, rst directives and literal blocks, indented code.
        if stripped.startswith((">>>", "...", "$ ", "%", ".. ", "#", "|", "+-", "*")):
            return False
        if len(line) - len(stripped) > first_indent:
            return False
    text = " ".join(" ".join(lines).split())
    words = text.split(" ")
    if len(words) < 3 or text[-1] not in ".!?:)":
        return False
    if not text[0].isupper() or "::" in text or "==" in text or "--" in text:
        return False
    if sum(c in _PROSE_CHARS for c in text) < 0.97 * len(text):
        return False
    return sum(bool(_WORD.match(w)) for w in words) >= 0.75 * len(words)


def _passage(doc: str) -> str | None:
    """Returns the prose paragraphs of one docstring, joined, or None if too little."""
    paragraphs = []
    for block in re.split(r"\n[ \t]*\n", doc):
        lines = [line.rstrip() for line in block.split("\n") if line.strip()]
        if lines and _is_prose(lines):
            paragraphs.append(" ".join(" ".join(lines).split()))
    text = " ".join(paragraphs)
    if not text or len(text.split(" ")) < _MIN_WORDS or text[-1] not in ".!?":
        return None
    return text


def _mixed(texts) -> tuple[str, ...]:
    """``texts`` ordered by a hash: stable across runs, and any prefix is a fair sample."""
    return tuple(sorted(texts, key=lambda t: (hashlib.sha1(t.encode()).hexdigest(), t)))


@functools.lru_cache(maxsize=1)
def _passages(root: str) -> dict[str, frozenset[str]]:
    """Each passage, and the top-level modules whose files hold it."""
    base = pathlib.Path(root)
    found: dict[str, set[str]] = collections.defaultdict(set)
    for path in _source_files(base):
        module = path.relative_to(base).parts[0].removesuffix(".py")
        for doc in _docstrings(path):
            text = _passage(doc)
            if text is not None:
                found[text].add(module)
    return {text: frozenset(modules) for text, modules in found.items()}


@functools.lru_cache(maxsize=1)
def _ordered(root: str) -> tuple[str, ...]:
    return _mixed(_passages(root))


def _stdlib_passages() -> dict[str, frozenset[str]]:
    root = stdlib_root()
    passages = _passages(str(root))
    if not passages:
        raise FileNotFoundError(
            f"found no standard-library docstrings under {root}; expected the .py sources "
            "that CPython installs there. Use a Python install that ships its sources "
            "(not a zip-only or .pyc-only build)."
        )
    return passages


def builtin_corpus(n: int | None = None) -> list[tuple[int, str]]:
    """Returns ``(id, text)`` pairs of real English prose from the standard library.

    Example:
        >>> corpus = builtin_corpus()
        >>> first_id, first_text = corpus[0]
        >>> len(corpus) > 2000, first_id
        (True, 0)

    Args:
        n: How many passages to return, or None for all of them (about 4,400 on
            CPython 3.11). The passages come in a fixed, well-mixed order, so the first
            ``n`` are a fair sample of the whole: one-line sentences and long
            multi-paragraph passages alike.

    Returns:
        A list of ``(id, text)`` with ids ``0..len-1``; texts are unique and have their
        whitespace collapsed to single spaces.

    Raises:
        ValueError: If ``n`` is negative or larger than the corpus.
        FileNotFoundError: If this Python install ships no standard-library sources.
    """
    _stdlib_passages()  # raises if there are none
    passages = _ordered(str(stdlib_root()))
    if n is not None and not 0 <= n <= len(passages):
        raise ValueError(
            f"n must be between 0 and the corpus size {len(passages)}, got {n}; pass "
            "n=None for the whole corpus."
        )
    return list(enumerate(passages[:n]))


def labelled_corpus(
    num_classes: int = 10,
) -> tuple[tuple[str, ...], list[tuple[int, str, str]]]:
    """The passages of the ``num_classes`` largest top-level modules, labelled by module.

    Example:
        >>> classes, rows = labelled_corpus(3)
        >>> sorted({label for _, _, label in rows}) == list(classes)
        True

    Args:
        num_classes: How many modules to keep (the ones with the most passages; ties
            broken by name).

    Returns:
        ``(classes, rows)``: the modules' names, sorted, and ``(id, text, label)`` rows with
        ids ``0..n-1`` in a fixed, well-mixed order. A passage found in more than one
        module is left out.

    Raises:
        ValueError: If ``num_classes`` is below 2 or above the number of modules found.
        FileNotFoundError: If this Python install ships no standard-library sources.
    """
    single = {t: next(iter(m)) for t, m in _stdlib_passages().items() if len(m) == 1}
    sizes = collections.Counter(single.values())
    if not 2 <= num_classes <= len(sizes):
        raise ValueError(
            f"num_classes must be between 2 and the {len(sizes)} modules found, got {num_classes}."
        )
    ranked = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))
    classes = tuple(sorted(name for name, _ in ranked[:num_classes]))
    kept = _mixed(text for text, module in single.items() if module in classes)
    return classes, [(i, text, single[text]) for i, text in enumerate(kept)]
