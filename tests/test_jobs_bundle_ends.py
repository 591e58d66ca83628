"""beam_jax.jobs.prompt_bundle_ends: in-process bundles end when their work does."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.runners.worker import statesampler
from apache_beam.testing.util import assert_that, equal_to

from beam_jax import jobs
from tests.beam_helpers import pipeline, run


def _period() -> int:
    return statesampler.StateSampler("stage", None).sampling_period_ms


class RecordPeriod(beam.DoFn):
    """Emits the sampling period of the state sampler timing this bundle."""

    def process(self, element):
        yield statesampler.get_current_tracker().sampling_period_ms


def test_samplers_started_in_the_block_sleep_at_most_the_period_and_beams_default_returns():
    default = _period()
    with jobs.prompt_bundle_ends(period_ms=7):
        assert _period() == 7
        with jobs.prompt_bundle_ends(period_ms=3):  # set already: left as the caller set it
            assert _period() == 7
        p = pipeline()
        periods = p | beam.Create([1, 2, 3]) | beam.ParDo(RecordPeriod())
        assert_that(periods, equal_to([7, 7, 7]))  # the bundles' own samplers
        run(p)
    assert _period() == default == statesampler.DEFAULT_SAMPLING_PERIOD_MS


def test_a_failing_block_restores_the_default_and_a_bad_period_is_refused():
    with pytest.raises(RuntimeError, match="boom"), jobs.prompt_bundle_ends():
        assert _period() == 10
        raise RuntimeError("boom")
    assert _period() == statesampler.DEFAULT_SAMPLING_PERIOD_MS
    with pytest.raises(ValueError, match="period_ms must be a positive int .*got 0"):
        with jobs.prompt_bundle_ends(period_ms=0):
            pass


@jobs.prompt_bundle_ends(period_ms=5)
def _decorated():
    return _period()


def test_as_a_decorator():
    assert _decorated() == 5
    assert _period() == statesampler.DEFAULT_SAMPLING_PERIOD_MS
