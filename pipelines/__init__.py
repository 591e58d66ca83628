"""Runnable pipelines built on beam_jax, one per module (``python -m pipelines.NAME``)."""

# First, Beam-free: a command whose workers run here starts opening its devices.
from pipelines._open_early import open_early

open_early()

# Before any pipeline imports apache_beam: drops the warning it logs without its GCP extras.
import beam_jax._quiet  # noqa: E402, F401
