"""The job every runner test runs; a module so separate worker processes can import it.

Inputs are derived from their index, so every runner sees the same elements, and every value
is a small multiple of 1/4, so sums are exact whatever the batch, padding or device count:
outputs must be byte-identical across runners, not merely close.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import uuid
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import jax.numpy as jnp
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineResult, PipelineState

import beam_jax as bj

N = 60
D = 4
SPEC = {"x": bj.ArraySpec(("L", D), np.float32)}
OUTPUT_SPEC = {"sum": bj.ArraySpec((D,), np.float32), "rows": bj.ArraySpec(("L", D), np.float32)}
BUCKETING = bj.Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=6)
VALIDATION = bj.Validation(check_outputs_finite=True)

# Which elements fail, and where: every 17th element in three ways.
WRONG_WIDTH, TOO_LONG, NOT_FINITE = 5, 11, 13


def load_params() -> dict[str, np.ndarray]:
    return {"scale": np.asarray([0.5, 1.0, 2.0, -1.0], np.float32)}


@dataclasses.dataclass(frozen=True)
class RecordingLoader:
    """``load_params`` that also leaves a file named after the loading process's id."""

    log_dir: str

    def __call__(self) -> dict[str, np.ndarray]:
        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, f"{os.getpid()}-{uuid.uuid4().hex}"), "w"):
            pass
        return load_params()

    def pids(self) -> set[int]:
        return {int(name.split("-")[0]) for name in os.listdir(self.log_dir)}


def kernel(params, element, lengths):
    """Masked column sums and the scaled rows of one element."""
    x = element["x"]
    mask = bj.length_mask(lengths["L"], x.shape[0]).astype(jnp.float32)[:, None]
    scale = params["scale"]
    return {"sum": jnp.sum(x * mask, axis=0) * scale, "rows": x * scale[None, :]}


def make_element(i: int) -> tuple[int, dict[str, np.ndarray]]:
    """Element ``i`` as ``(i, {"x": float32[L, 4]})``; some are deliberately bad."""
    length = 1 + (7 * i) % 16
    width = D
    if i % 17 == WRONG_WIDTH:
        width = 3
    if i % 17 == TOO_LONG:
        length = 20
    x = ((np.arange(length * width).reshape(length, width) + i) % 13 - 6).astype(np.float32)
    x *= np.float32(0.25)
    if i % 17 == NOT_FINITE:
        x[0, 0] = np.inf
    return i, {"x": x}


def expected_dead_letters() -> dict[int, str]:
    """``{element index: stage}`` of the elements that must fail."""
    stages = {WRONG_WIDTH: "validation", TOO_LONG: "validation", NOT_FINITE: "output"}
    return {i: stages[i % 17] for i in range(N) if i % 17 in stages}


def expected_sum(i: int) -> np.ndarray:
    _, element = make_element(i)
    return element["x"].sum(0) * load_params()["scale"]


def _hex(a: np.ndarray) -> dict[str, Any]:
    a = np.asarray(a)
    return {
        "dtype": str(a.dtype),
        "shape": list(a.shape),
        "values": [float(v).hex() for v in a.ravel()],
    }


def result_line(keyed_result) -> str:
    """One result as a deterministic JSON line, floats in hex so nothing is rounded."""
    key, out = keyed_result
    return json.dumps({"id": key, **{k: _hex(v) for k, v in out.items()}}, sort_keys=True)


def dead_letter_line(record: bj.FailedElement) -> str:
    # The traceback is left out: its frames depend on the runner, not on the element.
    fields = ("key", "element", "stage", "error_type", "message")
    return json.dumps({f: getattr(record, f) for f in fields}, sort_keys=True)


def build(
    pipeline: beam.Pipeline, out_dir: str, *, devices: Sequence[Any] | str | None = None
) -> None:
    """Add the job to ``pipeline``: ``out_dir/results*`` and ``out_dir/dead_letters*``.

    The worker processes that loaded the parameters are listed in ``out_dir/params_loads``.
    """
    results, dead = (
        pipeline
        | "Indices" >> beam.Create(range(N))
        | "Make" >> beam.Map(make_element)
        | "Run"
        >> bj.RunKernel(
            kernel,
            spec=SPEC,
            output_spec=OUTPUT_SPEC,
            bucketing=BUCKETING,
            validation=VALIDATION,
            load_params=RecordingLoader(os.path.join(out_dir, "params_loads")),
            keyed=True,
            devices=devices,
        ).with_exception_handling()
    )
    _ = (
        results
        | "ResultLines" >> beam.Map(result_line)
        | "WriteResults" >> beam.io.WriteToText(os.path.join(out_dir, "results"))
    )
    _ = (
        dead
        | "DeadLines" >> beam.Map(dead_letter_line)
        | "WriteDead" >> beam.io.WriteToText(os.path.join(out_dir, "dead_letters"))
    )


def run(
    argv: Sequence[str], out_dir: str, *, timeout_ms: int | None = None, **kwargs: Any
) -> PipelineResult:
    """Build and run the job with pipeline options ``argv``; waits for it to finish.

    Raises:
        RuntimeError: the job did not finish (``DONE``) within ``timeout_ms``.
    """
    pipeline = beam.Pipeline(options=PipelineOptions(list(argv)))
    build(pipeline, out_dir, **kwargs)
    result = pipeline.run()
    state = result.wait_until_finish(duration=timeout_ms)
    if state != PipelineState.DONE:
        with contextlib.suppress(Exception):
            result.cancel()
        raise RuntimeError(f"the job ended in state {state} within {timeout_ms} ms, not DONE.")
    return result


def loading_pids(out_dir: str) -> set[int]:
    """The ids of the processes that loaded the parameters in the job run into ``out_dir``."""
    return RecordingLoader(os.path.join(out_dir, "params_loads")).pids()


def read_lines(out_dir: str, name: str) -> list[str]:
    """Every line of ``out_dir/name*`` shards, sorted."""
    lines: list[str] = []
    for path in glob.glob(os.path.join(out_dir, name + "*")):
        with open(path) as f:
            lines.extend(line.rstrip("\n") for line in f if line.strip())
    return sorted(lines)


def read_outputs(out_dir: str) -> bytes:
    """All results then all dead letters, sorted: the bytes runners must agree on."""
    text = "\n".join(read_lines(out_dir, "results") + ["--"] + read_lines(out_dir, "dead_letters"))
    return text.encode()
