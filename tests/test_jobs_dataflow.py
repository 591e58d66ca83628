"""beam_jax.jobs: the Dataflow dry-run helpers, on what runs without Dataflow's client.

The job description of a real dry run is checked in tests/test_dataflow_job.py (it needs
``apache-beam[gcp]``).
"""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jax import jobs
from beam_jax._src.jobs.dataflow import ACCELERATOR_HINT, dataflow_staged_files


def test_is_dry_run_reads_beam_s_flag():
    assert jobs.is_dry_run(PipelineOptions(["--dry_run=True"]))
    assert not jobs.is_dry_run(PipelineOptions([]))


def test_a_result_that_is_not_a_dry_run_is_refused_with_the_flags_to_pass():
    pipeline = beam.Pipeline("FnApiRunner")
    _ = pipeline | beam.Create([1])
    result = pipeline.run()
    result.wait_until_finish()
    with pytest.raises(ValueError, match="--runner DataflowRunner --dry_run=True"):
        dataflow_staged_files(result)


def test_the_job_file_is_indented_json_with_sorted_keys(tmp_path):
    path = tmp_path / "job.json"
    jobs.write_dataflow_job_file({"b": 1, "a": {"c": [2]}}, str(path))
    assert json.loads(path.read_text()) == {"a": {"c": [2]}, "b": 1}
    assert path.read_text().index('"a"') < path.read_text().index('"b"')


def test_the_accelerator_hint_is_beam_s_urn():
    assert ACCELERATOR_HINT == "beam:resources:accelerator:v1"
