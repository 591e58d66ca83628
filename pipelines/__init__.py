"""Runnable pipelines built on beam_jax, one per module (``python -m pipelines.NAME``)."""

# Before any pipeline imports apache_beam: drops the warning it logs without its GCP extras.
import beam_jax._quiet  # noqa: F401
