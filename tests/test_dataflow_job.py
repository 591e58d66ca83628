"""The flagship's Dataflow job, built offline and checked before anyone pays for it.

``python -m pipelines.embed ... --runner DataflowRunner --dry_run=True`` validates the
options for Dataflow, translates the pipeline and builds the ``--setup_file`` package, and
writes the job description to ``--dataflow_job_file`` without any network call. What this
cannot check (the project, buckets, quota and image existing; the upload; the service's
own validation; the workers) is listed in docs/dataflow_gpu.md.
"""

from __future__ import annotations

import base64
import json

import pytest

pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient")
pytest.importorskip("google.cloud.storage")

from beam_jax import jobs  # noqa: E402
from beam_jax._src.jobs.dataflow import ACCELERATOR_HINT, dataflow_staged_files
from pipelines.embed import job as embed_text  # noqa: E402

IMAGE = "us-central1-docker.pkg.dev/my-project/beam-jax/beam-jax-gpu:0.2.0"
GPU = "type:nvidia-l4;count:1;install-nvidia-driver"


def _dataflow_flags(tmp_path, *extra):
    return [
        "--builtin_texts",
        "40",
        "--output",
        str(tmp_path / "out"),
        "--runner",
        "DataflowRunner",
        "--project",
        "my-project",
        "--region",
        "us-central1",
        "--temp_location",
        "gs://my-bucket/tmp",
        "--setup_file",
        "./setup.py",
        "--sdk_container_image",
        IMAGE,
        "--experiments=use_runner_v2",
        "--machine_type",
        "g2-standard-8",
        "--dry_run=True",
        "--dataflow_job_file",
        str(tmp_path / "job.json"),
        *extra,
    ]


def _leaves(described):
    transforms = described["pipeline"]["components"]["transforms"]
    environments = described["pipeline"]["components"]["environments"]
    leaves = {}
    for t in transforms.values():
        if t.get("subtransforms") or not t.get("environmentId"):
            continue
        hints = environments[t["environmentId"]].get("resourceHints", {})
        leaves[t["uniqueName"]] = hints
    return leaves


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("dataflow")
    summary = embed_text.run(_dataflow_flags(tmp_path, "--accelerator", GPU))
    return tmp_path, summary, json.loads((tmp_path / "job.json").read_text())


def test_a_dry_run_builds_the_job_and_writes_nothing_to_the_output(dry_run):
    tmp_path, summary, described = dry_run
    assert summary is None
    assert not (tmp_path / "out").exists()
    assert described["type"] == 1  # JOB_TYPE_BATCH
    options = described["environment"]["sdkPipelineOptions"]["options"]
    assert options["project"] == "my-project" and options["region"] == "us-central1"
    assert options["temp_location"].startswith("gs://my-bucket/tmp/")  # plus the job's folder


def test_every_worker_pool_runs_the_custom_image(dry_run):
    _, _, described = dry_run
    (pool,) = described["environment"]["workerPools"]
    images = {i["containerImage"] for i in pool["sdkHarnessContainerImages"]}
    assert images == {IMAGE}
    assert pool["machineType"] == "g2-standard-8"
    environments = described["pipeline"]["components"]["environments"].values()
    assert {e["urn"] for e in environments} == {"beam:env:docker:v1"}
    assert described["environment"]["sdkPipelineOptions"]["options"]["sdk_container_image"] == (
        IMAGE
    )


def test_the_workers_install_this_package_from_the_setup_file(dry_run, tmp_path):
    _, _, described = dry_run
    assert described["environment"]["sdkPipelineOptions"]["options"]["setup_file"] == ("./setup.py")
    # Every environment stages the sdist that --setup_file built.
    for environment in described["pipeline"]["components"]["environments"].values():
        staged = [d["rolePayload"] for d in environment["dependencies"]]
        assert any("workflow.tar.gz" in base64.b64decode(s).decode("latin-1")
                   for s in staged), staged  # fmt: skip


def test_the_setup_file_package_holds_the_library_and_the_pipelines(tmp_path):
    import apache_beam as beam

    from pipelines.embed.flags import parse_args

    args, options = parse_args(_dataflow_flags(tmp_path))
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | beam.Create([1]) | beam.Map(lambda x: x)
    files = dataflow_staged_files(pipeline.run())
    members = {m.split("/", 1)[-1] for m in files["workflow.tar.gz"]}
    assert {"beam_jax/__init__.py", "pipelines/embed/job.py", "setup.py"} <= members
    assert "beam_jax/_src/text/minilm_manifest.json" in members


def test_the_gpu_hint_is_on_the_model_step_only(dry_run):
    # The step that runs the model tokenizes, embeds and writes each part (one DoFn: no
    # fusion needed); reading and spreading the parts stay on the default workers.
    _, _, described = dry_run
    leaves = _leaves(described)
    on_gpu = {name for name, hints in leaves.items() if ACCELERATOR_HINT in hints}
    assert on_gpu, "no step carries the accelerator hint"
    model_steps = ("Embed", "StartEmbedWorker/")
    assert all(name.startswith(model_steps) for name in on_gpu), on_gpu
    assert "Embed" in on_gpu, on_gpu
    for name in ("Read/", "Read/SpreadParts/", "WriteUnreadable", "KeyPartNames"):
        assert any(n.startswith(name) for n in leaves), name
        assert not any(n.startswith(name) for n in on_gpu), name
    encoded = {
        leaves[name][ACCELERATOR_HINT] for name in on_gpu
    }  # base64 in the JSON form of the proto
    assert {base64.b64decode(e).decode() for e in encoded} == {GPU}


def test_without_the_flag_no_step_asks_for_an_accelerator(tmp_path):
    embed_text.run(_dataflow_flags(tmp_path, "--buckets", "16,64,256"))
    leaves = _leaves(json.loads((tmp_path / "job.json").read_text()))
    assert leaves and not any(ACCELERATOR_HINT in h for h in leaves.values())


def test_the_options_are_validated_for_dataflow(tmp_path):
    flags = _dataflow_flags(tmp_path)
    flags[flags.index("--project") + 1] = "My Project"
    with pytest.raises(ValueError, match="Invalid Project ID"):
        embed_text.run(flags)


def test_job_description_refuses_a_result_that_is_not_a_dry_run():
    import apache_beam as beam

    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        _ = p | beam.Create([1])
    with pytest.raises(ValueError, match="--dry_run=True"):
        jobs.dataflow_job_description(p.run())


def test_a_dry_run_on_another_runner_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        embed_text.run(["--output", str(tmp_path / "out"), "--dry_run=True"])
    assert "only with --runner DataflowRunner" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- the TPU job of docs/dataflow_tpu.md -------------------------------------------------

TPU_IMAGE = "us-central1-docker.pkg.dev/my-project/beam-jax/beam-jax-tpu:0.2.0"
TPU = "type:tpu-v5-lite-podslice;topology:1x1"


@pytest.fixture(scope="module")
def tpu_dry_run(tmp_path_factory):
    """docs/dataflow_tpu.md's command, dry-run on a local Parquet sample."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_jax.text import builtin_corpus

    tmp_path = tmp_path_factory.mktemp("dataflow_tpu")
    corpus = builtin_corpus(60)
    sample = tmp_path / "sample.parquet"
    pq.write_table(pa.table({"id": [i for i, _ in corpus], "text": [t for _, t in corpus]}), sample)
    flags = _dataflow_flags(tmp_path)
    flags[flags.index("--builtin_texts") : flags.index("--builtin_texts") + 2] = [
        "--input",
        str(sample),
    ]
    flags[flags.index("--sdk_container_image") + 1] = TPU_IMAGE
    flags[flags.index("--machine_type") + 1] = "ct5lp-hightpu-1t"
    flags += [
        "--dataflow_service_options",
        f"worker_accelerator={TPU}",
        "--experiments=no_use_multiple_sdk_containers",
        "--number_of_worker_harness_threads",
        "24",
        "--tokens_per_chunk",
        "0",
        "--batch_size",
        "1024",
        "--max_tokens_per_batch",
        "32768",
        "--matmuls",
        "auto",
    ]
    summary = embed_text.run(flags)
    return tmp_path, summary, json.loads((tmp_path / "job.json").read_text())


def test_the_tpu_job_runs_one_process_per_tpu_worker_with_its_threads(tpu_dry_run):
    tmp_path, summary, described = tpu_dry_run
    assert summary is None and not (tmp_path / "out").exists()
    (pool,) = described["environment"]["workerPools"]
    assert pool["machineType"] == "ct5lp-hightpu-1t"
    assert {i["containerImage"] for i in pool["sdkHarnessContainerImages"]} == {TPU_IMAGE}
    options = described["environment"]["sdkPipelineOptions"]["options"]
    assert options["dataflow_service_options"] == [f"worker_accelerator={TPU}"]
    assert "no_use_multiple_sdk_containers" in options["experiments"]
    assert "use_runner_v2" in options["experiments"]
    assert int(options["number_of_worker_harness_threads"]) == 24


def test_the_tpu_job_asks_for_the_tpu_for_the_whole_pool_not_per_step(tpu_dry_run):
    _, _, described = tpu_dry_run
    leaves = _leaves(described)
    # Read, then one step that tokenizes, embeds and writes each part.
    for name in ("Read/", "Embed"):
        assert any(n.startswith(name) for n in leaves), (name, sorted(leaves))
    assert not any(ACCELERATOR_HINT in hints for hints in leaves.values())
