"""What a launch asks of its runner before building the job: whether the workers run in
this process, how many bundles they run at once, and how many devices each has.

A job that knows its workers run here (the in-process FnApiRunner) can start their
expensive part (opening the devices, loading the model) during the launch, and skip the
shuffles that only spread work over machines.

Example:
    >>> options = PipelineOptions(["--runner=FnApiRunner", "--direct_num_workers=2"])
    >>> workers_here(options), bundle_workers(options), single_worker_here(options)
    (True, 2, False)
"""

from __future__ import annotations

import os
from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from beam_jax._src.jobs.console import is_local
from beam_jax._src.probe import local_platform, tpu_to_open

__all__ = [
    "accelerator_workers",
    "bundle_workers",
    "devices_per_worker",
    "single_worker_here",
    "tpu_shared_by_processes",
    "workers_here",
]

_IN_PROCESS = ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner")


def workers_here(options: PipelineOptions) -> bool:
    """Whether the runner runs the job's workers in this process (the FnApiRunner in memory
    or in threads), so a worker built here is the one the job uses."""
    mode = options.view_as(DirectOptions).direct_running_mode or "in_memory"
    return _in_process_runner(options) and mode in ("in_memory", "multi_threading")


def _in_process_runner(options: PipelineOptions) -> bool:
    """Whether the runner is one of the local runners that run in this process (the
    FnApiRunner, by that name or as the DirectRunner), in whatever running mode."""
    runner: Any = options.view_as(StandardOptions).runner
    name = (runner if isinstance(runner, str) else type(runner).__name__).rsplit(".", 1)[-1]
    return name in _IN_PROCESS


def bundle_workers(options: PipelineOptions) -> int:
    """Bundles the local FnApiRunner runs at once (``--direct_num_workers``; 0: one a CPU)."""
    num = options.view_as(DirectOptions).direct_num_workers
    return (os.cpu_count() or 1) if num == 0 else (num or 1)


def single_worker_here(options: PipelineOptions) -> bool:
    """Whether the job runs as one worker in this process, one bundle at a time."""
    return workers_here(options) and bundle_workers(options) == 1


def devices_per_worker(options: PipelineOptions) -> int:
    """Devices per worker: this process's on the local runners (they run the workers here,
    known without opening a TPU: ``local_platform``), else 1 (unknown at launch)."""
    if not is_local(options.view_as(StandardOptions).runner):
        return 1
    return local_platform().device_count


def accelerator_workers(accelerator: str | None, options: PipelineOptions) -> bool:
    """Whether a step's workers run on an accelerator: ``accelerator`` (a Beam resource hint)
    asks a remote runner for one; the local runners run the workers here, on JAX's default
    device (a GPU or TPU where JAX finds one), known without opening a TPU
    (``local_platform``), so the device can open in the background while the job reads."""
    if accelerator or not is_local(options.view_as(StandardOptions).runner):
        return bool(accelerator)
    return local_platform().accelerator


def tpu_shared_by_processes(options: PipelineOptions) -> str | None:
    """Why the local runner's worker processes cannot run on this machine's TPU, or ``None``.

    With ``--direct_running_mode=multi_processing`` and more than one worker, each worker
    process would open the same chips; a TPU opens in one process at a time, so all but
    one would get the CPU (and stop with ``DeviceUnavailableError``). Read without opening
    the TPU: its chips on the PCI bus (``beam_jax.jobs.local_platform``'s reading)."""
    mode = options.view_as(DirectOptions).direct_running_mode
    workers = bundle_workers(options)
    if not _in_process_runner(options) or mode != "multi_processing" or workers < 2:
        return None
    tpu = tpu_to_open()
    if tpu is None:
        return None
    return (
        f"--direct_running_mode=multi_processing starts {workers} worker "
        f"processes, but this machine's {tpu.device_count} {tpu.kind} device(s) open in one "
        "process at a time: the others would get the CPU. Drop "
        "--direct_running_mode=multi_processing: --direct_num_workers=N then runs N bundles "
        "in threads of this process that share the chips (or set JAX_PLATFORMS=cpu to run "
        "the workers on the CPU)."
    )
