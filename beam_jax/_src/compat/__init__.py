"""Adapters to the private names of the libraries beam_jax builds on: one module per
library (``beam.py``, ``jax.py``), each use beside the public API to move to, and
``tests/test_compat.py`` failing loudly on a release that moved one. Nothing else in
beam_jax reaches into Beam's or JAX's internals."""
