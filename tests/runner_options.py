"""A runner of one's own with its own options, as Beam's DaskRunner has: its options exist
only once its module is imported (``--runner tests.runner_options.OwnRunner``)."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner


class OwnRunnerOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--own_cluster_address", dest="cluster", help="where it runs")
        parser.add_argument("--own_workers", type=int, default=1, help="how many")


class OwnRunner(FnApiRunner):
    """The in-process runner under another name, reading its own options."""

    def run_pipeline(self, pipeline, options):
        assert options.view_as(OwnRunnerOptions).cluster, "--own_cluster_address is unset"
        return super().run_pipeline(pipeline, options)
