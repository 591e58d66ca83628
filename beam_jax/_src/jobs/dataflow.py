"""A Dataflow job checked offline: the job description ``DataflowRunner`` would send, unsent.

With Beam's ``--dry_run=True`` the runner validates the pipeline options, translates the
pipeline (resource hints, one Docker environment per set of hints) and builds the package
that ``--setup_file`` names, then returns without a network call.
:func:`dataflow_job_description` turns that result into the ``Job`` message the Dataflow
service would receive (worker pools, container images, pipeline options, the runner API
pipeline), as Beam builds it before submitting; :func:`write_dataflow_job_file` writes it
as ``--dataflow_job_file`` would.

What this does not check: that the project, region, buckets, service account, quota and
image exist and can be reached; the upload of the staged files; the service's own
validation of the request; and anything that happens on a worker.

Example:
    >>> # pipeline: built with --runner=DataflowRunner --dry_run=True
    >>> result = pipeline.run()  # doctest: +SKIP
    >>> job = dataflow_job_description(result)  # doctest: +SKIP
    >>> job["environment"]["workerPools"][0]["sdkHarnessContainerImages"]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import tarfile
from typing import Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DebugOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
)
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.runner import PipelineResult

from beam_jax._src.compat.beam import dataflow_environment

__all__ = [
    "ACCELERATOR_HINT",
    "run_dry",
    "dataflow_job_description",
    "dataflow_staged_files",
    "is_dry_run",
    "write_dataflow_job_file",
]

ACCELERATOR_HINT = common_urns.resource_hints.ACCELERATOR.urn
"""The URN of Beam's accelerator resource hint, as a pipeline's environments carry it."""


def is_dry_run(options: PipelineOptions) -> bool:
    """Whether ``options`` ask Beam to build the job and not submit it (``--dry_run=True``)."""
    return bool(options.view_as(TestOptions).dry_run)


def _job(result: PipelineResult) -> Any:
    job = getattr(result, "job", None)
    if job is None or not hasattr(job, "proto_pipeline"):
        raise ValueError(
            f"expected the result of a DataflowRunner run with --dry_run=True, got "
            f"{type(result).__name__}; pass --runner DataflowRunner --dry_run=True"
        )
    return job


def dataflow_job_description(result: PipelineResult) -> dict[str, Any]:
    """The Dataflow ``Job`` request of a dry run, as JSON (camelCase, as the API takes it).

    Its ``environment`` is built offline, as ``DataflowApplicationClient`` builds it before
    submitting, except that no file is uploaded: the staged-package list is empty and the
    pipeline's URL is where it would be staged. ``pipeline`` adds the runner API pipeline
    (transforms, environments with their resource hints and artifacts), which Dataflow
    reads from that URL.

    Raises:
        ValueError: If ``result`` is not a dry run's.
    """
    from google.protobuf import json_format

    job = _job(result)
    staging = job.options.view_as(GoogleCloudOptions).staging_location
    job.proto.environment = dataflow_environment(job, job.options, staging)
    described = json.loads(type(job.proto).to_json(job.proto))
    described["pipeline"] = json_format.MessageToDict(job.proto_pipeline)
    return described


def dataflow_staged_files(result: PipelineResult) -> dict[str, list[str]]:
    """``{staged name: [member names]}`` of the archives a dry run would upload for workers.

    ``workflow.tar.gz`` is the sdist that ``--setup_file`` built; its members show what
    every worker will ``pip install``.
    """
    job = _job(result)
    files: dict[str, list[str]] = {}
    for environment in job.proto_pipeline.components.environments.values():
        for artifact in environment.dependencies:
            if artifact.type_urn != common_urns.artifact_types.FILE.urn:
                continue
            path = beam_runner_api_pb2.ArtifactFilePayload.FromString(artifact.type_payload).path
            name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(
                artifact.role_payload
            ).staged_name
            if name in files:
                continue
            members = []
            if name.endswith((".tar.gz", ".tgz")):
                with tarfile.open(path) as archive:
                    members = archive.getnames()
            files[name] = members
    return files


def write_dataflow_job_file(described: dict[str, Any], path: str) -> None:
    """Writes ``described`` (local or ``gs://``) as indented JSON."""
    with FileSystems.create(path) as f:
        f.write(json.dumps(described, indent=1, sort_keys=True).encode())


def run_dry(pipeline: Any, name: str, output: str) -> None:
    """Runs ``pipeline``, built with ``--dry_run=True``: its runner builds the job and does
    not run it (the DataflowRunner translates and packages it, unsent); writes the job's
    description to ``--dataflow_job_file`` when given, and says so in one line.

    Args:
        pipeline: The job's pipeline (its options validated for the runner when built).
        name: The job's name, first on the line.
        output: The job's output, which a dry run leaves untouched.
    """
    options = pipeline.options
    result = pipeline.run()
    path = options.view_as(DebugOptions).dataflow_job_file
    if path and hasattr(result, "job"):
        write_dataflow_job_file(dataflow_job_description(result), path)
    print(
        f"{name}: dry run: the job was built for {options.view_as(StandardOptions).runner} "
        f"and not run{f'; its description is in {path}' if path else ''}; nothing was "
        f"written to {output}",
        flush=True,
    )
