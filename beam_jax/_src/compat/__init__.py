"""The private names of Beam and JAX that beam_jax uses, one module per library, each beside
the public API to move to; ``tests/test_compat.py`` fails on a release that moved one, and
finds any use of their internals elsewhere in beam_jax."""
