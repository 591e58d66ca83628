"""pipelines._open_early: a flagship command whose workers run here opens its devices
before it imports Beam, and only then (never where the job's own check would not)."""

from __future__ import annotations

import os

import pytest

from beam_jax import jobs
from beam_jax._src import probe
from pipelines import _open_early
from pipelines.embed.flags import parse_args

_PY = "/usr/bin/python3"


@pytest.mark.parametrize(
    ("command", "flags"),
    [([_PY, "-m", "pipelines.embed"], []),
     ([_PY, "-X", "importtime", "-m", "pipelines.embed", "--input", "a.parquet"],
      ["--input", "a.parquet"]),
     ([_PY, "-m", "pipelines.curate", "--runner=FnApiRunner"], None),
     ([_PY, "-m", "pytest", "-m", "pipelines.embed"], None),
     ([_PY, "-c", "import pipelines", "-m", "pipelines.embed"], None),
     ([_PY, "script.py", "-m", "pipelines.embed"], None),
     ([_PY, "-W", "ignore", "-mpipelines.embed", "--runner=FnApiRunner"],
      ["--runner=FnApiRunner"]),
     (["/venv/bin/beam-jax", "embed"], None),
     ([_PY, "-m"], None),
     ([_PY], None)],
)  # fmt: skip
def test_only_the_flagship_s_command_is_read(command, flags):
    assert _open_early.job_flags(command) == flags


@pytest.mark.parametrize(
    ("flags", "early"),
    [([], True),
     (["--runner=FnApiRunner"], True),
     (["--runner", "DirectRunner", "--direct_running_mode=multi_threading"], True),
     (["--direct_running_mode", "in_memory", "--builtin_texts", "10"], True),
     (["--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"], True),
     (["--runner=DirectRunner", "--direct_running_mode=multi_processing"], False),
     (["--runner=PrismRunner"], False),
     (["--runner", "beam_jax.runners.DaskRunner"], False),
     (["--runner=DataflowRunner", "--project=p", "--region=r", "--temp_location=gs://b/t",
       "--dry_run=True"], False),
     (["--runner=DataflowRunner", "--project=p", "--region=r", "--temp_location=gs://b/t"],
      False),
     (["--runner=FnApiRunner", "--runner=PortableRunner"], False)],
)  # fmt: skip
def test_the_early_answer_is_the_job_s_own(flags, early):
    assert _open_early.workers_here(flags) is early
    args, options = parse_args(flags)
    here = jobs.workers_here(options) and not jobs.is_dry_run(options)
    assert here is early


@pytest.mark.parametrize(
    "flags",
    [["--help"], ["-h"], ["--version"], ["--runner=FnApiRunner", "--dry_run"],
     ["--run=DataflowRunner"], ["--direct_running=multi_processing"], ["--runner"]],
)  # fmt: skip
def test_help_dry_runs_and_abbreviations_wait_for_the_job_s_check(flags):
    assert not _open_early.workers_here(flags)


def test_the_opening_sizes_the_tpu_s_host_buffer_as_the_library_does(monkeypatch):
    names = ("TPU_PREMAPPED_BUFFER_SIZE", "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    thread = _open_early.open_early([_PY, "-m", "pipelines.embed", "--runner=FnApiRunner"])
    assert thread is not None
    thread.join(timeout=60)
    assert not thread.is_alive()
    early = {name: os.environ[name] for name in names}
    for name in names:
        monkeypatch.delenv(name)
    probe.size_tpu_host_buffer()
    assert early == {name: os.environ[name] for name in names}
    assert _open_early.TPU_HOST_BUFFER_BYTES == probe.TPU_HOST_BUFFER_BYTES


def test_a_size_already_set_is_kept_and_other_commands_open_nothing(monkeypatch):
    monkeypatch.setenv("TPU_PREMAPPED_BUFFER_SIZE", "12345678")
    monkeypatch.delenv("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", raising=False)
    _open_early.open_early([_PY, "-m", "pipelines.embed"]).join(timeout=60)
    assert os.environ["TPU_PREMAPPED_BUFFER_SIZE"] == "12345678"
    assert "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES" not in os.environ
    assert _open_early.open_early([_PY, "-m", "pipelines.embed", "--runner=DaskRunner"]) is None
    assert _open_early.open_early([_PY, "-m", "pytest"]) is None
