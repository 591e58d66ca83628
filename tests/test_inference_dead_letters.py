"""RunInference's failed batches written as dead letters: one FailedElement per element."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.ml.inference.base import RunInference

import beam_jax as bj
from beam_jax import jobs
from tests.beam_helpers import pipeline, run
from tests.kernels import D, attention_params, masked_attention_pool

SPEC = {"x": bj.ArraySpec(("L", D), np.float32)}
BUCKETING = bj.Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8)


@pytest.mark.parametrize("keyed", [False, True])
def test_a_failed_batch_is_one_dead_letter_per_element_read_back_with_its_key(tmp_path, keyed):
    examples = [{"x": np.ones((3, D), np.float32)} for _ in range(5)]
    examples.append({"x": np.ones((3, D + 1), np.float32)})  # the wrong width
    handler_type = bj.KeyedJaxModelHandler if keyed else bj.JaxModelHandler
    handler = handler_type(
        masked_attention_pool,
        spec=SPEC,
        bucketing=BUCKETING,
        load_params=attention_params,
        max_batch_duration_secs=None,
    )
    elements = [(f"k{i}", x) for i, x in enumerate(examples)] if keyed else examples
    p = pipeline()
    inputs = p | beam.Create(elements, reshuffle=False)
    _, other = inputs | RunInference(handler).with_exception_handling()
    dead = other.failed_inferences | bj.FailedInferences(keyed=keyed)
    _ = dead | jobs.WriteDeadLetters(str(tmp_path / "_failed" / "inference"))
    run(p)
    records = list(jobs.read_dead_letters(str(tmp_path / "_failed" / "*.jsonl")))
    keys = [f"k{i}" for i in range(6)] if keyed else list(range(6))
    assert sorted(r.key for r in records) == keys  # the batch's every element
    for r in records:
        assert (r.stage, r.error_type) == (bj.Stage.INFERENCE, "InferenceBatchError")
        assert "elements [5] failed" in r.message and "InvalidElementError" in r.traceback
        assert r.source is None and r.row is None  # examples in memory: the key says which
