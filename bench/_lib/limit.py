"""The flagship's limit: its own packed batches alone on this process's device, warm.

What ``pipelines.embed`` would run for these texts on this machine, without Beam, reading
or writing: its launch plan (``plan_for`` with the flagship's flags: the packed row lengths,
rows per batch and texts per row it chooses here), the texts packed part by part as its
parts are (``--rows_per_part`` at a time, by the library's ``Packer``), under
``jax.jit(jax.vmap(packed_fn))`` with two batches in flight (the engine's default off the
CPU), each batch run whole (as on an accelerator; on a CPU the job runs them in chunks).
Every shape is compiled (or loaded from the compilation cache) before the clock, one call
each; the clock covers one pass over every batch, results fetched.

The roofline: after the clock, XLA's cost analysis of each shape's program (``costs``: its
FLOPs and the bytes its ops read and write, on an accelerator its HBM traffic) and the bytes
a kernel keeping each layer on the chip would move (``least_bytes``). No kernel beats
``max(FLOPs / peak, bytes / bandwidth)``: ``report`` gives the MFU bound at each traffic.
Op by op: the traces of ``bench/embed.py --profile --profile_dir DIR``, in XProf.
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
        f"{model.resolved_layer_kernel()} layers",
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
        "roofline": _roofline(fn, params, batches, model),
        "seconds": seconds,
        "device": device(),
        "matmuls": model.resolved_matmuls(),
        "layer_kernel": model.resolved_layer_kernel(),
        "batches": len(batches),
        "shapes": len(shapes),
        "compile_s": sum(shapes.values()),
        "plan": describe(packing.packing),
    }


def _roofline(fn, params, batches, model) -> dict:
    """XLA's costs of every batch (each shape's program once, times its batches), and the
    least traffic of a kernel that keeps each layer's work on the chip."""
    import jax

    total, by_shape = None, {}
    for b in batches:
        by_shape.setdefault((b.size, b.row_length), []).append(b)
    for b, *rest in by_shape.values():
        compiled = fn.lower(params, {"input_ids": b.element_leaves[0]}, b.segments).compile()
        total = costs(compiled, 1 + len(rest), total)
    layers, tokens = params["layers"], sum(b.size * b.row_length for b in batches)
    weights = sum(x.nbytes for x in jax.tree_util.tree_leaves(layers[0]))
    least = least_bytes(weights, model.dim, 4, tokens, len(batches), len(layers))
    return {**total, "tokens": tokens, "layers": len(layers), "batches": len(batches),
            "least_bytes": least}  # fmt: skip


def describe(packing) -> str:
    """The packing in one phrase: rows per batch by row length, and texts per row."""
    sizes = ", ".join(
        f"{w}: {'/'.join(map(str, packing.sizes_for(w)))}" for w in packing.row_lengths
    )
    return f"rows per batch by row length {sizes}; at most {packing.max_segments} texts a row"


def costs(compiled, batches: int, total: dict | None = None) -> dict:
    """``total`` (new if None) plus ``batches`` runs of ``compiled``: XLA's FLOPs and bytes."""
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis  # older JAX: a list
    total = total or {"flops": 0.0, "bytes": 0.0}
    total["flops"] += float(analysis.get("flops", 0.0)) * batches
    total["bytes"] += float(analysis.get("bytes accessed", 0.0)) * batches
    return total


def least_bytes(weight_bytes: int, hidden: int, item: int, tokens: int, batches: int,
                layers: int) -> float:  # fmt: skip
    """Per layer: its input and output rows (``item`` bytes a value) once per token slot
    and its weights (``weight_bytes``) once per batch."""
    return float(layers * (2 * hidden * item * tokens + weight_bytes * batches))


def report(roof: dict, useful_flops: float, peak_gflops: float, gbps: float) -> list[str]:
    """Lines: per token slot and layer XLA's FLOPs and bytes and the least bytes; the
    intensities and this device's ridge; the MFU bound of each traffic."""
    per, peak, bandwidth = roof["tokens"] * roof["layers"], peak_gflops * 1e9, gbps * 1e9
    if roof["flops"] < useful_flops / 2:  # e.g. a Pallas kernel in its interpreter
        return [f"XLA counts {roof['flops'] / 1e9:.1f} of the model's {useful_flops / 1e9:.1f} "
                "GFLOP: it does not see inside this program's kernels; no roofline"]  # fmt: skip

    def bound(nbytes: float) -> str:
        return f"{useful_flops / peak / max(roof['flops'] / peak, nbytes / bandwidth):.1%}"

    return [
        f"per token slot and layer: {roof['flops'] / per / 1e6:.2f} MFLOP (XLA), "
        f"{roof['bytes'] / per / 1e3:.1f} KB moved (XLA), {roof['least_bytes'] / per / 1e3:.2f} "
        f"KB at least ({roof['layers']} layers, {roof['tokens']:,} token slots)",
        f"intensity {roof['flops'] / roof['bytes']:.0f} FLOP/B (XLA), "
        f"{roof['flops'] / roof['least_bytes']:.0f} at least; this device's ridge "
        f"{peak / bandwidth:.0f} ({peak_gflops / 1000:.1f} TFLOP/s over {gbps:.0f} GB/s)",
        f"MFU bound at XLA's traffic {bound(roof['bytes'])}, at the least "
        f"{bound(roof['least_bytes'])}",
    ]
