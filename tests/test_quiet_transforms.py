"""Applying the text transforms logs nothing: no Beam warning that a type hint is ignored."""

from __future__ import annotations

import logging

import apache_beam as beam

from beam_jax.text import EmbedTexts


def test_applying_embed_texts_logs_no_ignored_type_hint(caplog):
    caplog.set_level(logging.WARNING)
    pipeline = beam.Pipeline(argv=["--runner=FnApiRunner"])
    _ = pipeline | beam.Create(["a text"]) | EmbedTexts().with_exception_handling()
    ignored = [r.getMessage() for r in caplog.records if "will be ignored" in r.getMessage()]
    assert not ignored, ignored
