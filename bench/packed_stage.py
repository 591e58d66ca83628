"""Host cost of packing in the engine: ``PackedStage`` over token-length records.

    python bench/packed_stage.py --records 100000 --repeat 3

Records of lengths drawn like tokenized short texts (log-normal, mean ~43, at most 256)
are validated once, then fed one at a time through an ``ElementFrontEnd`` + ``BatchEngine``
with packing and a trivial kernel (a sum per segment), and the results and dead letters
counted. Two figures per repeat, wall and CPU seconds:

- ``stage``: staging and laying out only (the engine's launch pads the batch and drops it);
- ``engine``: the whole engine path (dispatch, fetch, output check, one result per record).

Prints records per second of each (best of ``--repeat``) and the machine fingerprint.

Then how long a part waits: the same lengths staged as the flagship stages them (input
batches of ``--part_rows`` records, a planner buffer as large, rows of 64 and 256 tokens
in batches of 28 or 512 and 29 or 128 rows, 8 segments a row), and for each input batch,
how many packs after its own its last record ran (``end``: only when the bundle finished,
where everything staged runs). Its results, and so its part of the output, wait as long.
"""

from __future__ import annotations

import argparse
import json
import time

import jax.numpy as jnp
import numpy as np

import beam_jax as bj
from beam_jax._src.core.packed_plan import PackedPlan
from beam_jax._src.engine.packing import PackedStage
from beam_jax.internal import BatchEngine, ElementFrontEnd, KernelMetrics, PerElement, Worker

# The flagship's planned packing for token lengths like these (see its launch plan).
FLAGSHIP = bj.Packing(
    row_lengths=(64, 256),
    rows_per_batch={64: (28, 512), 256: (29, 128)},
    max_segments=8,
    pack_lengths=(64, 256),
)


def kernel(params, x, segments):
    """Per packed row: ``x`` ``[row_length]``, ``segments`` its ``SegmentInfo``."""
    del params
    ids = segments.ids
    width = segments.lengths.shape[-1]
    return jnp.zeros(width + 1, x.dtype).at[ids].add(x)[1:]


def token_lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(36.0), 0.6, n)), 1, 256).astype(np.int64)


class _StageOnly:
    """An engine stand-in whose launch lays the batch out and drops it."""

    def __init__(self):
        self.batches = 0

    def launch(self, buffer):
        buffer.padded()
        self.batches += 1
        return iter(())

    def reject(self, error, stage, sources):
        raise error


def run(records, worker, *, engine_path: bool) -> tuple[float, float, int]:
    metrics = KernelMetrics()
    out = [0, 0]

    def result(tag, value):
        out[0] += 1

    def dead(error, stage, tag):
        out[1] += 1

    front = ElementFrontEnd(worker.plan, PerElement(worker.plan, result), dead)
    if engine_path:
        front.engine = BatchEngine(
            worker, metrics, front, handle_errors=True, report_compiles=lambda: None
        )
    else:
        front.engine = _StageOnly()
    wall, cpu = time.perf_counter(), time.process_time()
    for i, item in enumerate(records):
        for _ in front.add(i, item):
            pass
    streams = [front.drain()]
    if engine_path:
        streams += [front.engine.flush(), front.outputs.finish()]
    for stream in streams:
        for _ in stream:
            pass
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if engine_path and out != [len(records), 0]:
        raise AssertionError(f"expected {len(records)} results and no dead letters, got {out}")
    return wall, cpu, len(records)


class _Records:
    """Staged records as the stage sees them: keys and lengths."""

    def __init__(self, keys: np.ndarray, lengths: np.ndarray):
        self.keys, self.lengths = keys, lengths

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, index: np.ndarray) -> _Records:
        return _Records(self.keys[index], self.lengths[index])

    @staticmethod
    def concat(parts: list[_Records]) -> _Records:
        return _Records(
            np.concatenate([p.keys for p in parts]), np.concatenate([p.lengths for p in parts])
        )


class _Packs:
    """An engine stand-in that notes, per record, the pack it ran in (``now``)."""

    def __init__(self, n: int):
        self.ran = np.full(n, -1, np.int64)
        self.now = 0
        self.batches = 0

    def launch(self, buffer):
        self.ran[buffer.records.keys] = self.now
        self.batches += 1
        return iter(())

    def reject(self, error, stage, sources):
        raise error


def part_waits(lengths: np.ndarray, part_rows: int) -> tuple[list[int | None], int]:
    """Per input batch of ``part_rows`` records, how many packs after its own its last
    record ran (None: at the end of the bundle); and the batches launched."""
    plan = PackedPlan(bj.ArraySpec(("L",), np.float32), FLAGSHIP)
    plan.buffer_size = part_rows
    engine = _Packs(len(lengths))
    stage = PackedStage(plan, engine)
    starts = range(0, len(lengths), part_rows)
    for k, start in enumerate(starts):
        engine.now = k
        keys = np.arange(start, min(start + part_rows, len(lengths)))
        for _ in stage.add_records(_Records(keys, lengths[keys])):
            pass
    engine.now = len(starts)  # the bundle's end
    for _ in stage.drain():
        pass
    waits = []
    for k, start in enumerate(starts):
        last = int(engine.ran[start : start + part_rows].max())
        waits.append(None if last == len(starts) else last - k)
    return waits, engine.batches


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--part_rows", type=int, default=8192)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    packing = bj.Packing(row_lengths=(128, 256), rows_per_batch=(64, 32), max_segments=16)
    options = bj.KernelOptions(packing=packing, batched=False)
    worker = Worker(kernel, bj.ArraySpec(("L",), np.float32), options)
    lengths = token_lengths(args.records, args.seed)
    records = [worker.plan.validate(np.ones(n, np.float32)) for n in lengths]
    run(records[:5000], worker, engine_path=True)  # compile every shape first
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):
        for name, engine_path in (("stage", False), ("engine", True)):
            wall, cpu, n = run(records, worker, engine_path=engine_path)
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu)
            print(f"{name:6s} {n} records: {wall:6.2f} s wall, {cpu:6.2f} s CPU")
    report = {
        name: {"wall_s": w, "cpu_s": c, "records_per_s": args.records / w}
        for name, (w, c) in best.items()
    }
    for name, r in report.items():
        print(
            f"best {name:6s}: {r['records_per_s']:,.0f} records/s "
            f"({r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU)"
        )
    waits, batches = part_waits(lengths, args.part_rows)
    shown = " ".join("end" if w is None else str(w) for w in waits)
    print(
        f"parts of {args.part_rows} records, packs each waited for its last record to run "
        f"({batches} batches): {shown}"
    )
    report["part_waits"] = waits
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
