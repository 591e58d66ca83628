"""The time the host waits for the results of batches it dispatched is reported
(``Summary.result_wait_seconds``): the device's time on the host's critical path."""

from __future__ import annotations

import time

import apache_beam as beam
import numpy as np
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax._src.engine import batching
from beam_jax.testing import assert_conserved
from tests.beam_helpers import pipeline, run

DEVICE_S = 0.03  # each batch's results arrive this long after the host asks for them


def _total(params, element, lengths):
    return element["x"].sum()


def test_the_wait_for_each_batchs_results_is_summed_over_the_batches(monkeypatch):
    fetch = batching.fetch_on_cpu

    def slow_device(outputs):  # as a device still running the batch when it is fetched
        time.sleep(DEVICE_S)
        return fetch(outputs)

    monkeypatch.setattr(batching, "fetch_on_cpu", slow_device)
    values = [{"x": np.full((3,), i, np.float32)} for i in range(20)]
    p = pipeline()
    results = (
        p
        | beam.Create(values)
        | bj.RunKernel(_total, spec={"x": bj.ArraySpec((3,), np.float32)},
                       bucketing=bj.Bucketing(batch_size=4, batch_sizes=(4,)))
        | beam.Map(float)
    )  # fmt: skip
    assert_that(results, equal_to([3.0 * i for i in range(20)]))
    started = time.perf_counter()
    summary = assert_conserved(run(p))
    wall = time.perf_counter() - started

    assert summary.batches == 5
    assert DEVICE_S * summary.batches <= summary.result_wait_seconds < wall
