"""``bench/launch_timeline.py``: a fresh flagship process's phases, in order, and the
device's busy share read from a profiler trace."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import launch_timeline  # noqa: E402

_TRACE = """
planes {
  id: 1
  name: "/device:TPU:0"
  lines {
    id: 1
    name: "XLA Modules"
    timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 10000000000 }
    events { metadata_id: 1 offset_ps: 12000000000 duration_ps: 10000000000 }
    events { metadata_id: 1 offset_ps: 20000000000 duration_ps: 6000000000 }
  }
  event_metadata { key: 1 value { id: 1 name: "jit_packed_fn" } }
}
planes { id: 2 name: "/host:CPU" }
"""


def test_the_devices_busy_time_is_the_union_of_its_batches_over_their_window(tmp_path):
    # Batches at 0-10, 12-22 and 20-26 ms: busy 24 ms (the overlap counted once) of 26.
    xspace = jax.profiler.ProfileData.text_proto_to_serialized_xspace(_TRACE)
    (tmp_path / "host.xplane.pb").write_bytes(xspace)
    got = launch_timeline.device_batches(str(tmp_path))
    assert got["batches"] == 3
    assert got["median_batch_ms"] == pytest.approx(10.0)
    assert got["busy_s"] == pytest.approx(0.024)
    assert got["window_s"] == pytest.approx(0.026)


def test_a_trace_without_a_device_line_says_so_and_no_trace_fails(tmp_path):
    cpu_only = _TRACE[_TRACE.index("planes { id: 2") :]
    (tmp_path / "a.xplane.pb").write_bytes(
        jax.profiler.ProfileData.text_proto_to_serialized_xspace(cpu_only)
    )
    assert launch_timeline.device_batches(str(tmp_path)) == {"batches": 0}
    with pytest.raises(RuntimeError, match="no trace"):
        launch_timeline.device_batches(str(tmp_path / "empty"))


@pytest.mark.slow
def test_a_warm_process_phases_come_in_order_and_a_traced_run_is_measured(tmp_path):
    report = launch_timeline.main(
        ["--texts", "300", "--runs", "1", "--no-cold", "--trace", "--json", str(tmp_path / "r"),
         "--cache-dir", str(tmp_path / "cache")]
    )  # fmt: skip
    marks = report["runs"]["warm 1"]
    keys = [key for key, _ in launch_timeline.PHASES]
    assert all(marks[k] is not None for k in keys), marks
    times = [marks[k] for k in keys]
    assert times == sorted(times), marks
    assert 0 < marks["jax"] < marks["exited"]
    assert report["trace"]["wall_s"] > 0
    assert (tmp_path / "r").exists()
    assert any((tmp_path / "cache").iterdir())  # the compilation cache it was given, kept
