"""The built-in corpus, now :func:`beam_jax.text.builtin_corpus`; this name stays while
``pipelines/embed`` imports it from here."""

from beam_jax.text import builtin_corpus

__all__ = ["builtin_corpus"]
