"""What a job runs on, known without opening a TPU (``beam_jax.jobs.local_platform``).

The unit tests read a fake PCI bus; the launch test runs the flagship in a fresh process
that takes this machine for a TPU host (the PCI reading replaced) and checks, by the order
of what happened, that the launching thread never opened JAX's backends before the job's
first part was tokenized: the device opens in the worker's background start.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax._src import probe
from beam_jax._src.engine import worker
from beam_jax._src.kernel.compiled import Kernel
from beam_jax._src.probe import LocalPlatform
from beam_jax.jobs import local_platform
from tests.beam_helpers import pipeline, run

ROOT = Path(__file__).resolve().parent.parent


def _pci_device(root: Path, slot: str, vendor: str, device: str) -> None:
    d = root / slot
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "device").write_text(device + "\n")


@pytest.fixture
def libtpu_installed(monkeypatch):
    real = probe.importlib.util.find_spec
    monkeypatch.setattr(
        probe.importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "libtpu" else real(name, *a),
    )


def test_tpu_chips_are_counted_from_the_pci_bus(tmp_path, libtpu_installed):
    _pci_device(tmp_path, "0000:00:04.0", "0x1ae0", "0x0063")
    _pci_device(tmp_path, "0000:00:05.0", "0x1ae0", "0x0063")
    _pci_device(tmp_path, "0000:00:06.0", "0x1ae0", "0x0001")  # a Google device, not a TPU
    _pci_device(tmp_path, "0000:00:07.0", "0x8086", "0x0063")  # another vendor's id 0x0063
    found = probe._tpu_on_pci_bus(str(tmp_path))
    assert found == LocalPlatform("tpu", device_count=2, kind="TPU v5 lite", opened=False)
    assert found.accelerator


def test_v3_chips_show_two_devices_each(tmp_path, libtpu_installed):
    _pci_device(tmp_path, "0000:00:04.0", "0x1ae0", "0x0027")
    assert probe._tpu_on_pci_bus(str(tmp_path)).device_count == 2


@pytest.mark.parametrize(
    ("env", "count"),
    [
        ({}, 4),
        ({"TPU_VISIBLE_CHIPS": "0"}, 1),
        ({"TPU_VISIBLE_CHIPS": "0,1"}, 2),
        ({"TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1"}, 1),
        ({"TPU_CHIPS_PER_PROCESS_BOUNDS": "2,1,1", "TPU_VISIBLE_CHIPS": "0"}, 2),
        ({"TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,2"}, 4),  # no more than the bus holds
        ({"TPU_CHIPS_PER_PROCESS_BOUNDS": "odd"}, 4),  # libtpu's to refuse; all counted
    ],
)
def test_only_the_chips_this_process_opens_are_counted(
    tmp_path, monkeypatch, libtpu_installed, env, count
):
    """A host's chips split among processes: the launch plans for the devices that open."""
    for i in range(4):
        _pci_device(tmp_path, f"0000:00:0{4 + i}.0", "0x1ae0", "0x0063")
    for name in ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert probe._tpu_on_pci_bus(str(tmp_path)).device_count == count


def test_only_chips_whose_device_node_this_process_may_open_are_counted(tmp_path, libtpu_installed):
    """A host of four v5e chips that gives this process one: the others' VFIO groups have
    no node in its /dev (v4 and earlier: no accel node)."""
    bus, dev = tmp_path / "bus", tmp_path / "dev"
    (dev / "vfio").mkdir(parents=True)
    (tmp_path / "groups").mkdir()
    for i in range(4):
        _pci_device(bus, f"0000:00:0{8 + i}.0", "0x1ae0", "0x0063")
        (tmp_path / "groups" / str(i)).mkdir()
        (bus / f"0000:00:0{8 + i}.0" / "iommu_group").symlink_to(tmp_path / "groups" / str(i))
    (dev / "vfio" / "vfio").touch()
    (dev / "vfio" / "3").touch()
    assert probe._tpu_on_pci_bus(str(bus), str(dev)).device_count == 1
    for i in range(3):
        (dev / "vfio" / str(i)).touch()
    assert probe._tpu_on_pci_bus(str(bus), str(dev)).device_count == 4
    v4 = tmp_path / "v4"
    for i in range(2):
        _pci_device(v4, f"0000:00:0{4 + i}.0", "0x1ae0", "0x005e")
        (v4 / f"0000:00:0{4 + i}.0" / "accel" / f"accel{i}").mkdir(parents=True)
    (dev / "accel1").touch()
    # The accel node decides for a chip its accel driver holds, whatever /dev/vfio holds.
    (v4 / "0000:00:04.0" / "iommu_group").symlink_to(tmp_path / "groups" / "0")
    assert probe._tpu_on_pci_bus(str(v4), str(dev)).device_count == 1


def test_no_tpu_without_libtpu_or_chips(tmp_path, monkeypatch, libtpu_installed):
    assert probe._tpu_on_pci_bus(str(tmp_path)) is None  # no chips
    _pci_device(tmp_path, "0000:00:04.0", "0x1ae0", "0x0063")
    monkeypatch.setattr(probe.importlib.util, "find_spec", lambda name, *a: None)
    assert probe._tpu_on_pci_bus(str(tmp_path)) is None  # chips, but no libtpu


def test_the_pci_reading_counts_only_where_jax_would_take_a_tpu(monkeypatch):
    """Backends not open yet: a TPU on the bus is the answer unless JAX_PLATFORMS names
    another platform first (then JAX's own answer, opened here)."""
    tpu = LocalPlatform("tpu", device_count=4, kind="TPU v4", opened=False)
    monkeypatch.setattr(probe, "_from_open_backends", lambda: None)
    monkeypatch.setattr(probe, "_tpu_on_pci_bus", lambda: tpu)
    for asked in ("", "tpu", "TPU,cpu"):
        monkeypatch.setattr(probe, "_first_platform_asked", lambda a=asked: probe._first_of(a))
        assert local_platform() == tpu
    monkeypatch.setattr(probe, "_first_platform_asked", lambda: probe._first_of("cpu"))
    cpu = local_platform()
    assert (cpu.platform, cpu.opened) == ("cpu", True)
    assert cpu.device_count == jax.local_device_count()
    assert [probe._first_of(s) for s in ("cuda", "rocm,cpu", " ", "")] == ["gpu", "gpu", None, None]


def test_open_backends_answer_first():
    jax.devices()  # open
    assert local_platform() == LocalPlatform(
        "cpu", device_count=jax.local_device_count(), kind="cpu", opened=True
    )


def test_asking_the_local_platform_writes_nothing(monkeypatch):
    for name in (probe._HOST_BUFFER, probe._HOST_BUFFER_THRESHOLD):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    jax.devices()
    assert local_platform().opened  # from the open backends
    monkeypatch.setattr(probe, "backends_opened", lambda: False)  # as if none were open
    assert local_platform().opened  # opened here
    assert dict(os.environ) == before


class _Cpu:
    platform = "cpu"


class _Tpu:
    platform = "tpu"


@pytest.fixture
def tpu_held_elsewhere(monkeypatch):
    """This machine, taken for a TPU host whose chip another process holds: the PCI reading
    finds one, JAX_PLATFORMS leaves the choice to JAX, and JAX opened the CPU."""
    tpu = LocalPlatform("tpu", device_count=1, kind="TPU v5 lite", opened=False)
    monkeypatch.setattr(probe, "_tpu_on_pci_bus", lambda: tpu)
    monkeypatch.setattr(probe, "_first_platform_asked", lambda: None)


def test_a_cpu_where_a_tpu_may_open_is_refused(tpu_held_elsewhere, monkeypatch):
    with pytest.raises(
        bj.DeviceUnavailableError,
        match=r"JAX opened only the CPU, but this machine has 1 TPU v5 lite",
    ) as e:
        probe.check_no_tpu_left_behind([_Cpu()])
    assert "another process most likely holds them" in str(e.value)
    assert "--direct_num_workers=N without --direct_running_mode=multi_processing" in str(e.value)
    probe.check_no_tpu_left_behind([_Tpu()])  # the chip opened
    monkeypatch.setattr(probe, "_first_platform_asked", lambda: "cpu")
    probe.check_no_tpu_left_behind([_Cpu()])  # JAX_PLATFORMS=cpu: the CPU on purpose
    monkeypatch.setattr(probe, "_first_platform_asked", lambda: None)
    monkeypatch.setattr(probe, "_tpu_on_pci_bus", lambda: None)
    probe.check_no_tpu_left_behind([_Cpu()])  # no chip this process may open


def test_a_pipeline_whose_worker_gets_the_cpu_where_a_tpu_is_held_fails_saying_why(
    tpu_held_elsewhere,
):
    spec = {"x": bj.ArraySpec(("L",), np.float32)}

    def total(params, element, lengths):
        return element["x"].sum()

    elements = [{"x": np.ones(3, np.float32)}]
    bucketing = bj.Bucketing(boundaries={"L": 8}, batch_size=2)
    p = pipeline()
    _ = p | beam.Create(elements) | bj.RunKernel(total, spec=spec, bucketing=bucketing)
    with pytest.raises(Exception, match="another process most likely holds them"):
        run(p)
    # Asked for the CPU by name, the same worker runs there.
    p = pipeline()
    out = (
        p
        | beam.Create(elements)
        | bj.RunKernel(total, spec=spec, bucketing=bucketing, devices="cpu")
        | beam.Map(float)
    )
    assert_that(out, equal_to([3.0]))
    run(p)


def test_a_local_platform_is_validated():
    with pytest.raises(ValueError, match="got 'cuda'.*JAX names CUDA and ROCm devices 'gpu'"):
        LocalPlatform("cuda", 1, "H100", opened=False)
    with pytest.raises(ValueError, match="device_count must be >= 1, got 0"):
        LocalPlatform("tpu", 0, "TPU v5 lite", opened=False)


_LAUNCH = textwrap.dedent(
    """
    import dataclasses, json, os, sys, threading, time

    import jax.numpy as jnp
    from jax._src import xla_bridge

    from beam_jax._src import probe
    from beam_jax._src.kernel import devices
    from beam_jax._src.probe import LocalPlatform
    from beam_jax.text import Tokenizer
    from pipelines.embed import job

    # This machine, taken for a one-chip TPU host: the PCI reading says so, and its CPU
    # plays the chip (the worker's check for a TPU left unopened is off).
    probe._tpu_on_pci_bus = lambda *a: LocalPlatform("tpu", 1, "TPU v5 lite", opened=False)
    devices.check_no_tpu_left_behind = lambda opened: None
    events = []
    backends = xla_bridge.backends

    def opening(*a, **k):
        if not xla_bridge.backends_are_initialized():
            events.append(["open", threading.current_thread().name])
        return backends(*a, **k)

    xla_bridge.backends = opening
    # Opening the devices takes long here, as a TPU's does, holding JAX's lock: until the
    # launch's plan and the job's tokenize step have both tokenized (a launch that waits
    # for the devices never does: then the opening ends after 120 s and the test fails).
    cpu = xla_bridge._backend_factories["cpu"]
    launched, tokenized = threading.Event(), threading.Event()

    def slow_open(*a, **k):
        launched.wait(120) and tokenized.wait(120)
        events.append(["opened", time.monotonic(), os.environ.get("TPU_PREMAPPED_BUFFER_SIZE")])
        return cpu.factory(*a, **k)

    xla_bridge._backend_factories["cpu"] = dataclasses.replace(cpu, factory=slow_open)
    encode = Tokenizer.encode_arrow

    def encode_arrow(tokenizer, texts):
        name = threading.current_thread().name
        events.append(["tokenize", name, time.monotonic()])
        (tokenized if name.startswith("beam_jax-tokenize") else launched).set()
        return encode(tokenizer, texts)

    Tokenizer.encode_arrow = encode_arrow
    from_dir = job.SentenceEncoder.from_dir.__func__

    def load_model(cls, *a, **k):
        opener = any(t.name == "beam_jax-open-devices" for t in threading.enumerate())
        events.append(["model", opener or xla_bridge.backends_are_initialized()])
        return from_dir(cls, *a, **k)

    job.SentenceEncoder.from_dir = classmethod(load_model)

    def element_fn(params, element, lengths):
        return jnp.zeros((384,), jnp.float32) + lengths["L"]

    def packed_fn(params, row, segments):
        return jnp.zeros((segments.lengths.shape[-1], 384), jnp.float32)

    summary = job.run(
        ["--builtin_texts", "300", "--output", sys.argv[1], "--runner=FnApiRunner"],
        encoder=job.Encoder(element_fn, packed_fn, lambda: {}),
    )
    print("EVENTS " + json.dumps({"events": events, "results": summary.results}))
    """
)


def _without_host_buffer(env: dict) -> dict:
    for name in (probe._HOST_BUFFER, probe._HOST_BUFFER_THRESHOLD):
        env.pop(name, None)
    return env


def test_the_flagship_launch_never_waits_for_the_tpu_to_open(tmp_path):
    env = _without_host_buffer(dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS=""))
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCH, str(tmp_path / "out")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(s for s in done.stdout.splitlines() if s.startswith("EVENTS "))
    record = json.loads(line.removeprefix("EVENTS "))
    assert record["results"] == 300
    events = [tuple(e) for e in record["events"]]
    opens = [e for e in events if e[0] == "open"]
    assert len(opens) == 1, events
    # Opened once, on a thread of its own started before the model loads, never by the
    # launching thread; the job's own tokenize step (a thread of its own) tokenized its
    # parts.
    assert opens == [("open", "beam_jax-open-devices")], events
    assert ("model", True) in events, events
    assert any(e[0] == "tokenize" and e[1].startswith("beam_jax-tokenize") for e in events)
    # The launch went on while the devices opened: its plan tokenized its sample, and the
    # job its first part, before the opening ended.
    opened = next(e[1] for e in events if e[0] == "opened")
    before = [e for e in events if e[0] == "tokenize" and e[2] < opened]
    assert {e[1].startswith("beam_jax-tokenize") for e in before} == {False, True}, events
    # The devices opened with the TPU's host buffer sized (libtpu reads it as it opens).
    assert next(e[2] for e in events if e[0] == "opened") == str(probe.TPU_HOST_BUFFER_BYTES)


def test_open_local_devices_opens_them_on_a_thread_the_process_waits_for():
    code = textwrap.dedent(
        """
        from jax._src import xla_bridge
        from beam_jax.jobs import open_local_devices
        before = xla_bridge.backends_are_initialized()
        thread = open_local_devices()
        print(before, thread.name, thread.daemon)
        thread.join()
        print(xla_bridge.backends_are_initialized())
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "beam_jax-open-devices", "False", "True"]


def test_the_tpu_host_buffer_is_sized_where_the_environment_leaves_it(monkeypatch):
    for name in (probe._HOST_BUFFER, probe._HOST_BUFFER_THRESHOLD):
        monkeypatch.delenv(name, raising=False)
    assert probe.size_tpu_host_buffer(64 * 2**20) == 64 * 2**20
    assert (
        os.environ[probe._HOST_BUFFER]
        == os.environ[probe._HOST_BUFFER_THRESHOLD]
        == str(64 * 2**20)
    )
    # A size already there (the user's, the image's, or the first call's) is kept.
    assert probe.size_tpu_host_buffer() == 64 * 2**20
    monkeypatch.setenv(probe._HOST_BUFFER, str(2**32))
    assert probe.size_tpu_host_buffer() == 2**32
    assert os.environ[probe._HOST_BUFFER_THRESHOLD] == str(64 * 2**20)
    # Only a threshold set: the size stays libtpu's own.
    monkeypatch.delenv(probe._HOST_BUFFER)
    monkeypatch.setenv(probe._HOST_BUFFER_THRESHOLD, "1048576")
    assert probe.size_tpu_host_buffer() is None
    assert probe._HOST_BUFFER not in os.environ


@pytest.mark.parametrize("nbytes", [0, 2**20 - 1, True, 1.5e9, "256M"])
def test_a_tpu_host_buffer_size_is_validated(nbytes):
    with pytest.raises(ValueError, match=rf"at least 1 MiB \(1048576\), got {nbytes!r}"):
        probe.size_tpu_host_buffer(nbytes)


_WORKER_OPENS = textwrap.dedent(
    """
    import dataclasses, os
    from jax._src import xla_bridge
    from beam_jax._src.kernel.devices import select_devices

    cpu = xla_bridge._backend_factories["cpu"]
    seen = []

    def opening(*a, **k):
        seen.append(os.environ.get("TPU_PREMAPPED_BUFFER_SIZE"))
        return cpu.factory(*a, **k)

    xla_bridge._backend_factories["cpu"] = dataclasses.replace(cpu, factory=opening)
    select_devices()
    print(seen)
    """
)


@pytest.mark.parametrize("preset", [None, "8388608"])
def test_a_worker_opens_its_devices_with_the_tpu_host_buffer_sized(preset):
    env = _without_host_buffer(dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"))
    if preset is not None:
        env[probe._HOST_BUFFER] = preset
    done = subprocess.run(
        [sys.executable, "-c", _WORKER_OPENS], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [f"['{preset or probe.TPU_HOST_BUFFER_BYTES}']"]


def test_a_transfer_larger_than_the_tpu_host_buffer_gets_advice(monkeypatch):
    monkeypatch.delenv(probe._HOST_BUFFER, raising=False)
    assert probe.tpu_host_buffer_advice(4 * 2**30) is None  # libtpu's own 4 GiB holds it
    advice = probe.tpu_host_buffer_advice(4 * 2**30 + 1)
    assert "4,096 MiB to a TPU" in advice and "TPU_PREMAPPED_BUFFER_SIZE=4294967296" in advice
    monkeypatch.setenv(probe._HOST_BUFFER, str(256 * 2**20))
    assert probe.tpu_host_buffer_advice(256 * 2**20) is None
    advice = probe.tpu_host_buffer_advice(300 * 2**20)
    assert "300 MiB" in advice and "(TPU_PREMAPPED_BUFFER_SIZE=268435456 bytes, 256 MiB)" in advice
    assert f"to at least {300 * 2**20} in the worker's environment" in advice


def _scaled_sum(params, element, lengths):
    mask = bj.length_mask(lengths["L"], element.shape[0])
    return params * jnp.where(mask, element, jnp.float32(0)).sum()


@pytest.mark.parametrize("advised", [True, False])
def test_a_tpu_worker_whose_batches_outgrow_its_host_buffer_says_so(advised, monkeypatch, caplog):
    # The kernel's devices taken for a TPU; its largest batch leaf (4 rows x 8 x float32,
    # 128 bytes) split over the local devices, against a host buffer a byte smaller than
    # each device's share (advice) or just as large (none).
    share = -(-128 // len(jax.local_devices()))
    buffer = share - 1 if advised else share
    monkeypatch.setattr(Kernel, "platform", property(lambda self: "tpu"))
    monkeypatch.setenv(probe._HOST_BUFFER, str(buffer))
    values = [np.ones(n, np.float32) for n in range(1, 9)]
    p = pipeline()
    out = (
        p
        | beam.Create(values)
        | bj.RunKernel(
            _scaled_sum,
            spec=bj.ArraySpec(("L",), np.float32),
            bucketing=bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=4),
            load_params=lambda: np.float32(2.0),
        )
        | beam.Map(float)
    )
    assert_that(out, equal_to([2.0 * n for n in range(1, 9)]))
    with caplog.at_level(logging.WARNING, logger=worker.__name__):
        run(p)
    said = [r.getMessage() for r in caplog.records if "host buffer" in r.getMessage()]
    if advised:
        assert len(said) == 1, said
        assert f"(TPU_PREMAPPED_BUFFER_SIZE={buffer} bytes" in said[0], said
        assert f"to at least {share} in the worker's environment" in said[0], said
    else:
        assert said == []
