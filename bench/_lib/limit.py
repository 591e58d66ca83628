"""The flagship's limit: its own packed batches alone on this process's device, warm.

What ``pipelines.embed`` would run for these texts on this machine, without Beam, reading
or writing: its launch plan (``plan_for`` with the flagship's flags: the packed row lengths,
rows per batch and texts per row it chooses here), the texts packed part by part as its
parts are (``--rows_per_part`` at a time, by the library's ``Packer``), under
``jax.jit(jax.vmap(packed_fn))`` with two batches in flight (the engine's default off the
CPU), each batch run whole (as on an accelerator; on a CPU the job runs them in chunks).
Every shape is compiled (or loaded from the compilation cache) before the clock, one call
each; the clock covers one pass over every batch, results fetched.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def flagship_plan(cfg: dict):
    """The flagship's parsed flags, model and packing plan for ``cfg``'s texts, here."""
    from beam_jax import jobs
    from beam_jax.text import SentenceEncoder
    from pipelines.embed import plan
    from pipelines.embed.flags import parse_args
    from pipelines.embed.parts import Inputs

    args, options = parse_args(
        ["--input", cfg["parquet"], "--output", cfg["out"], *cfg["pipeline_args"]]
    )
    model = SentenceEncoder.from_dir(
        args.model_dir, matmuls=args.matmuls, layer_kernel=args.layer_kernel
    )
    launch = plan.plan_for(args, Inputs.from_args(args), jobs.devices_per_worker(options), model)
    if launch.packing is None:
        raise SystemExit(
            f"limit: the flagship chose {launch.batching} for these texts, not packed rows; "
            "the limit times packed batches (give --pipeline-args '--batching packed')"
        )
    return args, model, launch.packing


def run_limit(cfg: dict) -> dict:
    """Compiles the flagship's batch shapes, then times one pass over every batch."""
    import jax
    import pyarrow.parquet as pq

    from beam_jax import jobs
    from beam_jax.internal import Packer
    from bench._lib.harness import device

    jobs.open_local_devices().join()  # sizes a TPU's host buffer first, as a worker does
    jax.config.update("jax_compilation_cache_dir", cfg["cache_dir"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    _, model, packing = flagship_plan(cfg)
    texts = pq.read_table(cfg["parquet"], columns=["text"]).column("text").to_pylist()
    ids = model.tokenizer().encode_batch(texts)
    plan, part = Packer(model.spec, packing.packing), packing.buffer_size or len(ids)
    results = [plan.pack_leaves([[x] for x in ids[i : i + part]]) for i in range(0, len(ids), part)]
    batches = [b for r in results for b in r.batches]
    print(
        f"limit: {len(ids)} texts in {len(batches)} packed batches on {device()}; plan "
        f"{describe(packing.packing)}; {model.resolved_matmuls()} matmuls, "
        f"{model.layer_kernel} layers",
        flush=True,
    )
    fn = jax.jit(jax.vmap(model.packed_fn, in_axes=(None, 0, 0)))
    params = jax.device_put(model.load_params())
    shapes: dict[tuple, float] = {}
    for b in batches:  # each shape's first call compiles it (or loads it from the cache)
        if (b.size, b.row_length) not in shapes:
            start = time.perf_counter()
            fn(params, {"input_ids": b.element_leaves[0]}, b.segments).block_until_ready()
            seconds = shapes[(b.size, b.row_length)] = time.perf_counter() - start
            print(f"limit: shape {b.size} x {b.row_length} ready in {seconds:.1f} s", flush=True)
    start, outputs, pending = time.perf_counter(), [], []
    for b in batches:  # the engine's way: the next batch dispatched before the last is fetched
        pending.append(fn(params, {"input_ids": b.element_leaves[0]}, b.segments))
        if len(pending) == 2:
            outputs.append(np.asarray(pending.pop(0)))
    outputs += [np.asarray(p) for p in pending]
    seconds = time.perf_counter() - start
    vectors, at = [], 0
    for r in results:
        n = len(r.batches)
        vectors.append(np.stack(plan.unpack(r, outputs[at : at + n])))
        at += n
    np.save(Path(cfg["out"]) / "vectors.npy", np.concatenate(vectors).astype(np.float32))
    return {
        "seconds": seconds,
        "device": device(),
        "matmuls": model.resolved_matmuls(),
        "layer_kernel": model.layer_kernel,
        "batches": len(batches),
        "shapes": len(shapes),
        "compile_s": sum(shapes.values()),
        "plan": describe(packing.packing),
    }


def describe(packing) -> str:
    """The packing in one phrase: rows per batch by row length, and texts per row."""
    sizes = ", ".join(
        f"{w}: {'/'.join(map(str, packing.sizes_for(w)))}" for w in packing.row_lengths
    )
    return f"rows per batch by row length {sizes}; at most {packing.max_segments} texts a row"
