"""Counts and articles in messages: "1 dead letter", "2 dead letters", "an int".

Example:
    >>> counted(1, "dead letter"), counted(12_000, "compiled shape"), counted(0, "batch")
    ('1 dead letter', '12,000 compiled shapes', '0 batches')
    >>> f"{article('int')} {'int'}, {article('str')} {'str'}"
    'an int, a str'
"""

from __future__ import annotations

__all__ = ["article", "counted", "plural"]

_ES = ("s", "x", "z", "ch", "sh")


def plural(noun: str, n: int = 2) -> str:
    """``noun`` as the count ``n`` wants it (the last word made plural unless ``n`` is 1):
    ``batch`` -> ``batches``, ``entry`` -> ``entries``, ``dead letter`` -> ``dead letters``."""
    if n == 1:
        return noun
    if noun.endswith(_ES):
        return f"{noun}es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return f"{noun[:-1]}ies"
    return f"{noun}s"


def counted(n: int, noun: str, plural_form: str | None = None) -> str:
    """``n`` (thousands separated) and ``noun``, plural unless ``n`` is 1 (``plural_form``
    where the plural is irregular)."""
    word = noun if n == 1 else (plural_form or plural(noun))
    return f"{n:,} {word}"


def article(word: str) -> str:
    """``a`` or ``an`` before ``word``, by its first letter (type names: an int, a str,
    an ndarray)."""
    return "an" if word[:1].lower() in "aeiou" or word.startswith("nd") else "a"
