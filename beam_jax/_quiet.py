"""Drops the one warning Apache Beam logs at import on every machine without its GCP extras.

``import apache_beam`` logs ``apitools not found, and bigquery client libraries are not
available ...`` to the root logger whenever ``apache-beam[gcp]`` is not installed, which is
every local run; the message is about BigQuery, which beam_jax does not use. A filter on
the root logger drops exactly that record (matched by its text); every other record passes.
This module must be imported before ``apache_beam``: ``beam_jax/__init__.py`` imports it
first, and so does ``pipelines/__init__.py``.
"""

from __future__ import annotations

import logging

_APITOOLS = "apitools not found, and bigquery client libraries are not available"


class _DropKnownImportWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING and _APITOOLS in str(record.msg))


def install() -> None:
    """Adds the filter to the root logger, once."""
    root = logging.getLogger()
    if not any(isinstance(f, _DropKnownImportWarnings) for f in root.filters):
        root.addFilter(_DropKnownImportWarnings())


install()
