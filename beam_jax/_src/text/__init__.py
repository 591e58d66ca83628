"""Sentence encoders of the BERT family in pure JAX, read from sentence-transformers model
directories (no Beam, no torch): exported by ``beam_jax.text``."""
