"""Shim for Dataflow's ``--setup_file``: the metadata lives in pyproject.toml."""

import setuptools

setuptools.setup()
