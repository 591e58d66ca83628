"""All local devices: batches really are split over them, and the answers don't change.

conftest gives this process four CPU devices.
"""

from __future__ import annotations

import json
import os
import re

import apache_beam as beam
import jax
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from jax.sharding import NamedSharding, PartitionSpec

import beam_jax as bj
from beam_jax._src.engine import options as _options
from beam_jax._src.kernel.devices import select_devices
from beam_jax.internal import Kernel
from tests import _runner_job as job
from tests import kernels


@pytest.fixture
def kernels_built(monkeypatch) -> list[Kernel]:
    """Every ``Kernel`` the workers of an in-process pipeline build, for inspection."""
    built: list[Kernel] = []

    class Recording(Kernel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(_options, "Kernel", Recording)  # where workers build their kernel
    return built


def _executables(kernel: Kernel) -> dict:
    """``{batch size: compiled executable}`` (the kernel compiles once per shape)."""
    return {key[1][0][0][0]: exe for key, exe in kernel._compiled.items()}


def _assert_sharded_over(exe, n_devices: int, batch: int) -> None:
    _, element, lengths = exe.input_shardings[0]
    for sharding in jax.tree_util.tree_leaves([element, lengths]):
        assert isinstance(sharding, NamedSharding)
        assert sharding.spec == PartitionSpec("batch")
        assert sharding.mesh.devices.size == n_devices
    for sharding in jax.tree_util.tree_leaves(exe.output_shardings):
        assert sharding.spec == PartitionSpec("batch")
    # The partitioned program each device runs takes its slice of the batch, not all of it.
    entry = next(line for line in exe.as_text().splitlines() if line.startswith("ENTRY"))
    per_device = {int(m) for m in re.findall(r"f32\[(\d+),", entry)}
    assert per_device == {batch // n_devices}, entry


def test_the_compiled_program_splits_the_batch_over_four_devices():
    kernel = Kernel(lambda p, x, lengths: (x * p).sum(-1))
    x = np.arange(8 * 5 * 3, dtype=np.float32).reshape(8, 5, 3)
    out = kernel.call(np.float32(2), [x], {}, treedef=None)
    np.testing.assert_array_equal(out, (x * 2).sum(-1))
    (exe,) = kernel._compiled.values()
    params, element, _ = exe.input_shardings[0]
    assert params.spec == PartitionSpec(), "parameters are replicated"
    assert element.spec == PartitionSpec("batch") and element.mesh.devices.size == 4
    entry = next(line for line in exe.as_text().splitlines() if line.startswith("ENTRY"))
    assert "f32[2,5,3]" in entry, entry  # 8 rows over 4 devices
    placed = jax.device_put(x, kernel._sharding(8))
    assert sorted(s.data.shape for s in placed.addressable_shards) == [(2, 5, 3)] * 4
    assert {s.device for s in placed.addressable_shards} == set(jax.local_devices())


def test_devices_given_as_objects_are_shipped_as_indices():
    first = jax.local_devices()[0]
    run = bj.RunKernel(job.kernel, spec=job.SPEC, bucketing=job.BUCKETING, devices=[first])
    assert run.options.devices == (0,)
    assert select_devices((0,)) == (first,)
    assert select_devices(run.options.devices) == (first,)
    with pytest.raises(bj.SpecError, match="out of range"):
        select_devices([4])


@pytest.mark.parametrize("devices", [None, "cpu"])
def test_pipeline_on_all_devices_matches_one_device(tmp_path, kernels_built, devices):
    many, one = str(tmp_path / "many"), str(tmp_path / "one")
    job.run(["--runner=FnApiRunner"], many, devices=devices)
    (kernel,) = kernels_built
    assert kernel.num_devices == 4
    for size, exe in _executables(kernel).items():
        assert size % 4 == 0, f"batch size {size} is not a multiple of the device count"
        _assert_sharded_over(exe, 4, size)

    job.run(["--runner=FnApiRunner"], one, devices=[jax.local_devices()[0]])
    assert kernels_built[1].num_devices == 1
    assert any(size % 4 for size in _executables(kernels_built[1])), "one device pads less"
    assert job.read_outputs(many) == job.read_outputs(one)


def _attention_pipeline(devices, out_dir: str) -> list[str]:
    """Random-normal inputs through attention (matmuls, softmax); sorted result lines."""
    rng = np.random.default_rng(0)
    elements = [
        (i, {"x": rng.standard_normal((int(n), kernels.D)).astype(np.float32)})
        for i, n in enumerate(rng.integers(1, 33, size=40))
    ]
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        _ = (
            p
            | beam.Create(elements)
            | bj.RunKernel(
                kernels.masked_attention_pool,
                spec={"x": bj.ArraySpec(("L", kernels.D), np.float32)},
                bucketing=bj.Bucketing(boundaries={"L": (8, 16, 32)}, batch_size=8),
                load_params=kernels.attention_params,
                keyed=True,
                devices=devices,
            )
            | beam.Map(lambda kv: job.result_line((kv[0], {"pooled": kv[1]})))
            | beam.io.WriteToText(os.path.join(out_dir, "results"))
        )
    return job.read_lines(out_dir, "results")


def _parse(lines: list[str]) -> dict[int, np.ndarray]:
    rows = (json.loads(line) for line in lines)
    return {r["id"]: np.array([float.fromhex(v) for v in r["pooled"]["values"]]) for r in rows}


def test_random_inputs_agree_on_four_devices_and_one(tmp_path):
    many = _parse(_attention_pipeline(None, str(tmp_path / "many")))
    one = _parse(_attention_pipeline([0], str(tmp_path / "one")))
    assert sorted(many) == sorted(one) == list(range(40))
    # Not bit-identical: XLA:CPU picks its dot algorithm by shape, and one device runs
    # 4x larger per-device batches than four do; the difference is an ulp or so.
    for i in many:
        np.testing.assert_allclose(many[i], one[i], rtol=1e-5, atol=1e-6)
