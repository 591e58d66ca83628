"""One Beam version for a job: the SDK that launches it and its workers' image must match.

A job whose ``--sdk_container_image`` (or portable Docker environment) holds another Beam
than the one installed here is refused at launch, before anything is staged, naming both
versions; ``--allow_beam_version_mismatch`` launches it anyway.
"""

from __future__ import annotations

import argparse
import json

import apache_beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jax import jobs
from beam_jax._src.jobs.images import beam_version_mismatch, image_beam_version

SDK = apache_beam.__version__
OTHER = "2.77.0" if SDK != "2.77.0" else "2.76.0"


@pytest.mark.parametrize(
    ("image", "version"),
    [
        (f"apache/beam_python3.11_sdk:{OTHER}", OTHER),
        (f"gcr.io/my-mirror/apache/beam_python3.12_sdk:{SDK}", SDK),
        ("europe-docker.pkg.dev/p/r/worker:1.4-beam2.78.0", "2.78.0"),
        ("localhost:5000/worker:beam_2.76.1-gpu", "2.76.1"),
        ("us-central1-docker.pkg.dev/p/beam-jax/beam-jax-gpu:0.2.0", jobs.WORKER_IMAGE_BEAM),
        ("beam_jax_cpu", jobs.WORKER_IMAGE_BEAM),
        ("apache/beam_python3.11_sdk:latest", None),
        ("gcr.io/p/some-image:1.0", None),
        ("gcr.io/p/some-image@sha256:" + "0" * 64, None),
    ],
)
def test_the_image_s_beam_is_read_from_its_name(image, version):
    assert image_beam_version(image) == version


def _options(*flags):
    return PipelineOptions(list(flags))


def test_a_mismatch_names_both_versions_and_the_fixes():
    message = beam_version_mismatch(
        _options(f"--sdk_container_image=apache/beam_python3.11_sdk:{OTHER}")
    )
    assert f"Beam {SDK}" in message and f"Beam {OTHER}" in message
    assert f"apache-beam=={OTHER}" in message and "--allow_beam_version_mismatch" in message
    # A portable runner's Docker environment is the workers' image too.
    portable = _options(
        "--environment_type=DOCKER", f"--environment_config=apache/beam_python3.11_sdk:{OTHER}"
    )
    assert f"Beam {OTHER}" in beam_version_mismatch(portable)


@pytest.mark.parametrize(
    "flags",
    [
        [],  # the runner's default image, which matches the SDK
        [f"--sdk_container_image=apache/beam_python3.11_sdk:{SDK}"],
        ["--sdk_container_image=gcr.io/p/unnamed:1.0"],  # no version to compare
        ["--environment_type=LOOPBACK"],
    ],
)
def test_no_mismatch_where_none_can_be_seen(flags):
    assert beam_version_mismatch(_options(*flags)) is None


def test_parse_job_args_refuses_before_anything_runs(capsys):
    parser = argparse.ArgumentParser(prog="job")
    image = f"--sdk_container_image=apache/beam_python3.11_sdk:{OTHER}"
    with pytest.raises(SystemExit) as exit_:
        jobs.parse_job_args(parser, ["--runner=DataflowRunner", image])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"Beam {SDK}" in err and f"Beam {OTHER}" in err
    args, options = jobs.parse_job_args(
        argparse.ArgumentParser(prog="job"), [image, "--allow_beam_version_mismatch"]
    )
    assert args.allow_beam_version_mismatch


pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient")
pytest.importorskip("google.cloud.storage")


def _dry_run_flags(tmp_path, image, *extra):
    return [
        "--builtin_texts", "20", "--output", str(tmp_path / "out"),
        "--runner", "DataflowRunner", "--project", "my-project", "--region", "us-central1",
        "--temp_location", "gs://my-bucket/tmp", "--sdk_container_image", image,
        "--dry_run=True", "--dataflow_job_file", str(tmp_path / "job.json"), *extra,
    ]  # fmt: skip


def test_the_flagship_s_dry_run_refuses_an_image_on_another_beam(tmp_path, capfd):
    from pipelines.embed import job as embed

    image = f"us-central1-docker.pkg.dev/p/r/worker:0.2.0-beam{OTHER}"
    with pytest.raises(SystemExit) as exit_:
        embed.run(_dry_run_flags(tmp_path, image))
    assert exit_.value.code == 2
    err = capfd.readouterr().err
    assert f"Beam {SDK}" in err and f"Beam {OTHER}" in err, err
    assert not (tmp_path / "job.json").exists() and not (tmp_path / "out").exists()
    # The override builds it, with the image the user named; the --setup_file package is
    # built with `python -m build` (installed with the project), not its fallback.
    embed.run(
        _dry_run_flags(
            tmp_path, image, "--allow_beam_version_mismatch", "--setup_file", "./setup.py"
        )
    )
    printed = capfd.readouterr()
    assert "No module named build" not in printed.out + printed.err
    described = json.loads((tmp_path / "job.json").read_text())
    images = {
        e["containerImage"]
        for pool in described["environment"]["workerPools"]
        for e in pool.get("sdkHarnessContainerImages", [])
    }
    assert images == {image}, images
