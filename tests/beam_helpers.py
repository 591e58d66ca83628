"""Building and running the test pipelines: always on the FnApiRunner, never Prism."""

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline


def pipeline(*args: str) -> TestPipeline:
    """A TestPipeline on the FnApiRunner, with extra Beam flags (e.g. multi-processing)."""
    return TestPipeline(options=PipelineOptions(["--runner=FnApiRunner", *args]))


def run(p: TestPipeline):
    """Run ``p`` to completion and return its result (for metrics)."""
    result = p.run()
    result.wait_until_finish()
    return result
