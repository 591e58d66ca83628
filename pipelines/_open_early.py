"""Before a command imports Beam: its devices start opening, where its workers run here.

Opening a TPU takes seconds, as do the imports. ``python -m pipelines.embed`` whose flags
keep its workers in this process (no ``--runner``, the FnApiRunner or the DirectRunner in
memory or in threads) opens them on a thread as ``pipelines`` imports, Beam-free. Any
other command, ``--help``, ``--version``, ``--dry_run`` or a runner flag spelled otherwise
waits for the job's own check (``beam_jax.jobs.workers_here``): a process that wrongly
holds a TPU keeps it from the real workers. A launch failing meanwhile exits once it opens.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence

JOBS = ("pipelines.embed",)
# beam_jax.probe.size_tpu_host_buffer's default, set the same way (tests/test_open_early.py).
TPU_HOST_BUFFER_BYTES = 256 * 2**20


def job_flags(command: Sequence[str]) -> list[str] | None:
    """The flags of ``command`` (``sys.orig_argv``) where it is ``python -m JOB ...``."""
    i = 1
    while i < len(command) and command[i].startswith("-") and command[i] != "-c":
        if command[i].startswith("-m"):  # -m JOB or -mJOB
            rest = i + 1 if command[i][2:] else i + 2
            module = command[i][2:] or "".join(command[i + 1 : i + 2])
            return list(command[rest:]) if module in JOBS else None
        i += 2 if command[i] in ("-X", "-W", "--check-hash-based-pycs") else 1
    return None  # a script, -c, or no module


def workers_here(flags: Sequence[str]) -> bool:
    """Whether ``flags`` surely keep the job's workers here (as its ``parse_job_args`` reads
    them: the runner defaults to the FnApiRunner)."""
    values = {"--runner": "FnApiRunner", "--direct_running_mode": "in_memory"}
    for i, flag in enumerate(flags):
        name, eq, value = flag.partition("=")
        if name in ("-h", "--help", "--version") or name.startswith("--dry"):
            return False
        if name in values:
            values[name] = value if eq else (flags[i + 1] if i + 1 < len(flags) else "")
        elif len(name) > 2 and any(f.startswith(name) for f in values):
            return False  # an abbreviation: the job's parser decides
    runner = values["--runner"].rsplit(".", 1)[-1]
    in_process = runner in ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner")
    return in_process and values["--direct_running_mode"] in ("in_memory", "multi_threading")


def open_early(command: Sequence[str] | None = None) -> threading.Thread | None:
    """Starts opening JAX's devices on a (non-daemon) thread where ``command`` (default:
    this process's) runs one of ``JOBS`` with its workers here; returns it, else ``None``."""
    flags = job_flags(sys.orig_argv if command is None else command)
    if flags is None or not workers_here(flags):
        return None
    buffer = ("TPU_PREMAPPED_BUFFER_SIZE", "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES")
    if not any(name in os.environ for name in buffer):
        os.environ.update(dict.fromkeys(buffer, str(TPU_HOST_BUFFER_BYTES)))
    thread = threading.Thread(target=_open, name="pipelines-open-devices")
    thread.start()
    return thread


def _open() -> None:
    import jax

    try:
        jax.local_devices()
    except Exception:  # noqa: BLE001 - raised again where the job uses the devices
        pass
