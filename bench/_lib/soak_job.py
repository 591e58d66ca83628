"""The soak's job: its records (1% bad, five kinds), its kernel, its pipeline writing id
lines and dead letters with their counts per second, and the checks of what it wrote.
Workers unpickle what is here by reference to ``bench._lib.soak_job``."""

from __future__ import annotations

import collections
import glob
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np

import beam_jax as bj
from bench._lib import harness

D = 4
BOUNDARIES = (4, 8, 16)
BATCH = 64
FAULT = 13.0  # a record holding this value makes the kernel raise at run time
KINDS = ("wrong_dtype", "wrong_rank", "nan", "too_long", "kernel_fault")
STAGE_OF = {kind: "kernel" if kind == "kernel_fault" else "validation" for kind in KINDS}
SPEC = {"x": bj.ArraySpec(("L", D), np.float32)}
# The kernel faults are expected, and JAX logs each failing callback with its traceback at
# ERROR level in the worker; thousands of those would drown the soak's output.
logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)


# ---- records ---------------------------------------------------------------------------


def bad_records(n: int, seed: int, fraction: float = 0.01) -> dict[int, str]:
    """``{id: kind}`` for the bad records: ``round(n * fraction)`` seeded random ids, the kinds
    dealt out evenly in random order."""
    rng = np.random.default_rng(seed)
    count = round(n * fraction)
    ids = rng.choice(n, size=count, replace=False)
    kinds = np.resize(np.arange(len(KINDS)), count)
    rng.shuffle(kinds)
    return {int(i): KINDS[k] for i, k in zip(ids, kinds, strict=True)}


def id_ranges(n: int, chunk: int, bad: dict[int, str]) -> list[tuple[int, int, dict[int, str]]]:
    """``(lo, hi, {bad id in [lo, hi): kind})``: the pipeline's only input, a few KB."""
    by_chunk: dict[int, dict[int, str]] = collections.defaultdict(dict)
    for i, kind in bad.items():
        by_chunk[i // chunk][i] = kind
    return [(lo, min(lo + chunk, n), by_chunk[lo // chunk]) for lo in range(0, n, chunk)]


def _bad_element(kind: str, x: np.ndarray) -> dict[str, np.ndarray]:
    if kind == "wrong_dtype":
        return {"x": x.astype(np.complex64)}
    if kind == "wrong_rank":
        return {"x": x[:, 0].copy()}
    if kind == "nan":
        x = x.copy()
        x[-1, -1] = np.nan
        return {"x": x}
    if kind == "too_long":
        return {"x": np.ones((BOUNDARIES[-1] + 1 + len(x), D), np.float32)}
    x = x.copy()
    x[0, 0] = FAULT
    return {"x": x}


def make_records(seed: int, id_range: tuple[int, int, dict[int, str]]) -> Iterator[Any]:
    """The records ``lo..hi-1``, deterministic in ``seed`` and ``lo``, generated on a worker."""
    lo, hi, bad = id_range
    rng = np.random.default_rng([seed, lo])
    lengths = rng.integers(1, BOUNDARIES[-1] + 1, size=hi - lo)
    values = rng.standard_normal((int(lengths.sum()), D), dtype=np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for j, i in enumerate(range(lo, hi)):
        x = values[offsets[j] : offsets[j + 1]]
        yield (i, _bad_element(bad[i], x) if i in bad else {"x": x})


# ---- kernel ----------------------------------------------------------------------------


def load_params() -> np.ndarray:
    return np.float32(2.0)


def _refuse_fault(x):
    if np.any(x == FAULT):
        raise ValueError(f"kernel refuses the value {FAULT} (a simulated kernel-time fault)")
    return x


def scaled_mean(params, element, lengths):
    """``params`` times the mean of the real rows; raises at run time on FAULT."""
    x = jax.pure_callback(
        _refuse_fault,
        jax.ShapeDtypeStruct(element["x"].shape, element["x"].dtype),
        element["x"],
        vmap_method="broadcast_all",
    )
    mask = bj.length_mask(lengths["L"], x.shape[0]).astype(jnp.float32)
    return jnp.sum(x * mask[:, None], axis=0) / lengths["L"].astype(jnp.float32) * params


def soak_transform(threshold: float = 0.02) -> bj.RunKernel:
    return bj.RunKernel(
        scaled_mean,
        spec=SPEC,
        bucketing=bj.Bucketing(
            boundaries={"L": BOUNDARIES}, batch_size=BATCH, batch_sizes=(BATCH,)
        ),
        validation=bj.Validation(nonfinite="reject"),
        load_params=load_params,
        keyed=True,
    ).with_exception_handling(threshold=threshold)


# ---- writing, with completions per second --------------------------------------------------


class WriteLine(beam.DoFn):
    """Formats each output as one line and counts outputs per wall-clock second.

    The counts go to one small JSON file per bundle in ``tick_dir``; the driver sums them into
    throughput per time slice.
    """

    def __init__(self, tick_dir: str, dead_letters: bool):
        self._tick_dir = tick_dir
        self._dead_letters = dead_letters

    def setup(self):
        # Which device this worker's kernel ran on, for the report.
        path = os.path.join(self._tick_dir, f"device-{os.getpid()}.txt")
        with open(path, "w") as f:
            f.write(harness.device())

    def start_bundle(self):
        self._counts: collections.Counter[int] = collections.Counter()

    def process(self, element):
        self._counts[int(time.time())] += 1
        yield element.to_json() if self._dead_letters else str(element[0])

    def finish_bundle(self):
        if self._counts:
            path = os.path.join(self._tick_dir, f"{uuid.uuid4().hex}.json")
            with open(path, "w") as f:
                json.dump({str(k): v for k, v in self._counts.items()}, f)


def build(p: beam.Pipeline, n: int, workdir: Path, seed: int, bad: dict[int, str], chunk: int):
    ranges = id_ranges(n, chunk, bad)
    results, dead = (
        p
        | "IdRanges" >> beam.Create(ranges)
        | "Records" >> beam.FlatMap(make_records_for, seed)
        | "RunKernel" >> soak_transform()
    )
    tick_dir = str(workdir / "ticks")
    _ = (
        results
        | "ResultLines" >> beam.ParDo(WriteLine(tick_dir, dead_letters=False))
        | "WriteResults" >> beam.io.WriteToText(str(workdir / "results" / "part"))
    )
    _ = (
        dead
        | "DeadLines" >> beam.ParDo(WriteLine(tick_dir, dead_letters=True))
        | "WriteDead" >> beam.io.WriteToText(str(workdir / "dead" / "part"))
    )


def make_records_for(id_range, seed):
    return make_records(seed, id_range)


# ---- checking what was written -----------------------------------------------------------


def read_written(workdir: Path) -> tuple[np.ndarray, list[tuple[Any, str]]]:
    """The result ids and the dead letters' ``(key, stage)`` as written to ``workdir``."""
    parts = [
        np.loadtxt(path, dtype=np.int64, ndmin=1)
        for path in sorted(glob.glob(str(workdir / "results" / "part*")))
        if os.path.getsize(path)
    ]
    result_ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    dead = []
    for path in sorted(glob.glob(str(workdir / "dead" / "part*"))):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                dead.append((record["key"], record["stage"]))
    return result_ids, dead


def check_conservation(
    result_ids: np.ndarray, dead: list[tuple[Any, str]], n: int, bad: dict[int, str]
) -> None:
    """Every id in ``range(n)`` written exactly once; the dead letters exactly ``bad``.

    Raises:
        AssertionError: naming the first offending ids of each kind of violation.
    """
    problems = []
    ids, counts = np.unique(result_ids, return_counts=True)
    if (counts > 1).any():
        problems.append(f"result ids written more than once: {ids[counts > 1][:10].tolist()}")
    dead_keys = collections.Counter(key for key, _ in dead)
    twice = [k for k, c in dead_keys.items() if c > 1]
    if twice:
        problems.append(f"ids dead-lettered more than once: {sorted(twice)[:10]}")
    both = np.intersect1d(ids, np.fromiter(dead_keys, np.int64, len(dead_keys)))
    if both.size:
        problems.append(f"ids both in results and dead letters: {both[:10].tolist()}")
    missing = np.setdiff1d(np.arange(n), np.union1d(ids, list(dead_keys)))
    if missing.size:
        problems.append(f"{missing.size} ids missing, e.g. {missing[:10].tolist()}")
    extra = ids[(ids < 0) | (ids >= n)]
    if extra.size:
        problems.append(f"result ids out of range: {extra[:10].tolist()}")
    want = {(i, STAGE_OF[kind]) for i, kind in bad.items()}
    got = set(dead)
    if got != want:
        problems.append(
            f"dead letters differ from the bad records: unexpected {sorted(got - want)[:10]}, "
            f"missing {sorted(want - got)[:10]}"
        )
    if problems:
        raise AssertionError("conservation broken: " + "; ".join(problems))


# ---- throughput over time ----------------------------------------------------------------


def throughput(tick_dir: Path, slice_seconds: float | None = None) -> dict[str, Any]:
    """Outputs written per second, per time slice, from the workers' per-second counts."""
    per_second: collections.Counter[int] = collections.Counter()
    for path in glob.glob(str(tick_dir / "*.json")):  # (the device-*.txt files are not counts)
        with open(path) as f:
            per_second.update({int(k): v for k, v in json.load(f).items()})
    if not per_second:
        return {"slice_seconds": 0, "slices": [], "late_over_early": float("nan")}
    first, last = min(per_second), max(per_second)
    span = last - first + 1
    width = int(slice_seconds or max(1, math.ceil(span / 20)))
    slices = []
    for start in range(first, last + 1, width):
        end = min(start + width, last + 1)
        count = sum(per_second.get(s, 0) for s in range(start, end))
        slices.append({"t": start - first, "records_per_s": round(count / (end - start))})
    # The first slice holds worker start-up and compiles, the last the drain: leave them out
    # and compare the first and last thirds of the rest.
    steady = [s["records_per_s"] for s in slices[1:-1]]
    third = len(steady) // 3
    ratio = float(np.mean(steady[-third:]) / np.mean(steady[:third])) if third else float("nan")
    return {"slice_seconds": width, "slices": slices, "late_over_early": round(ratio, 3)}
