"""The Dataflow dry-run helpers, now in :mod:`beam_jax.jobs`; these names stay while
``pipelines/embed`` imports them from here."""

from beam_jax.jobs import dataflow_job_description as job_description
from beam_jax.jobs import is_dry_run as dry_run
from beam_jax.jobs import write_dataflow_job_file as write_job_file

__all__ = ["dry_run", "job_description", "write_job_file"]
