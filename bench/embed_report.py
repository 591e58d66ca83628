"""The figures bench/embed_text.py derives from its variants' runs: medians, the ratios
between variants (cold and warm, at one precision, against the encoder's limit), the host's
CPU and launch bounds, FLOP accounting (executed FLOPs per real token, MFU) and the cosines
against sentence-transformers. Computed here, printed by bench/embed_text.py."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import harness
from embed_host import model_dir
from embed_variants import (
    FLAGSHIPS,
    HOST_WITHOUT,
    MODEL_VARIANTS,
    SAME_PRECISION,
    ST_VARIANTS,
    TIMED_JOBS,
)

# ---- FLOP accounting --------------------------------------------------------------------


def model_flops(token_lengths) -> float:
    """all-MiniLM-L6-v2's useful FLOPs for texts of these token lengths (matmuls only):
    per layer, 24 H^2 per token (Q, K, V, output: 4 x 2 H^2; MLP: 2 x 2 H x 4H) and
    4 H L^2 per text (scores and weighted values)."""
    import numpy as np

    from beam_jax.text import SentenceEncoder

    config = SentenceEncoder.from_dir(model_dir()).config
    h, layers = config.hidden_size, config.num_hidden_layers
    n = np.asarray(token_lengths, np.float64)
    return float(layers * np.sum(24 * h * h * n + 4 * h * n * n))


def flops_per_token(length: int) -> float:
    """Executed FLOPs per token slot of all-MiniLM-L6-v2 at padded row length ``length``:
    ``SentenceEncoder.flops_per_token`` (matmuls: per layer ``8h²`` for query, key, value
    and output, ``4h·i`` for the feed-forward layer, ``4·length·h`` for attention)."""
    return float(_encoder().flops_per_token(int(length)))


@functools.cache
def _encoder():
    from beam_jax.text import SentenceEncoder

    return SentenceEncoder.from_dir(model_dir())


def executed_flops(slots_by_length: dict) -> float:
    """FLOPs the encoder executed over batches of ``{row length: token slots}`` (padding
    and empty rows included: the slots the kernel ran)."""
    return sum(float(slots) * flops_per_token(int(L)) for L, slots in slots_by_length.items())


def st_slots_by_length(texts: list[str], lengths: list[int], batch_size: int) -> dict:
    """The slots sentence-transformers' ``encode`` runs: texts sorted by length in
    characters, longest first, batches of ``batch_size`` padded to their longest text's
    token count. Returns ``{row length: slots}``."""
    import numpy as np

    order = np.argsort([-len(t) for t in texts], kind="stable")
    tokens = np.asarray(lengths, np.int64)[order]
    slots: dict[str, int] = {}
    for lo in range(0, len(tokens), batch_size):
        chunk = tokens[lo : lo + batch_size]
        width = int(chunk.max())
        slots[str(width)] = slots.get(str(width), 0) + len(chunk) * width
    return slots


def flop_fields(variant: str, r: dict, data: dict, peaks: dict) -> None:
    """Sets ``mfu`` (useful FLOPs over the median time, against the matmul peak of the
    dtype the variant's dense matmuls ran in: bf16's for ``matmuls`` bfloat16, else fp32's)
    and ``flops_per_real_token`` (executed) for a model variant; ``None`` for the others."""
    peak = peaks.get("bf16" if r.get("matmuls") == "bfloat16" else "fp32")
    model = variant in MODEL_VARIANTS
    r["mfu"] = data["flops"] / r["seconds_median"] / (peak * 1e9) if model and peak else None
    slots = data["st_slots_by_length"] if variant == "sentence_transformers" else None
    slots = r.get("slots_by_length", slots) if model else None
    r["flops_per_real_token"] = executed_flops(slots) / data["tokens"] if slots else None


# ---- medians and ratios ------------------------------------------------------------------


def medians(runs: dict[str, list[dict]], texts: int) -> dict:
    """Each variant's rounds as one row: the median time and its rate, the best, the spread
    ((slowest - fastest) / median), the median CPU (the whole process, and the run alone
    where timed), launch and end; the other fields are the last round's."""
    results = {}
    for variant, rs in runs.items():
        seconds = harness.median([r["seconds"] for r in rs])
        results[variant] = {
            "sentences_per_s": texts / seconds,
            "seconds_median": seconds,
            "seconds_all": [round(r["seconds"], 2) for r in rs],
            "seconds_best": min(r["seconds"] for r in rs),
            "spread": (max(r["seconds"] for r in rs) - min(r["seconds"] for r in rs)) / seconds,
            "cpu_s_median": harness.median([r["cpu_s"] for r in rs]),
            "cpu_s_all": [round(r["cpu_s"], 1) for r in rs],
            **{
                k: v for k, v in rs[-1].items() if k not in ("seconds", "out", "cpu_s", "run_cpu_s")
            },
        }
        if all("run_cpu_s" in r for r in rs):
            results[variant]["run_cpu_s_median"] = harness.median([r["run_cpu_s"] for r in rs])
        results[variant]["process_s_median"] = harness.median([r["process_s"] for r in rs])
        for key in ("launch_s", "end_s", "process_launch_s"):
            if all(r.get(key) is not None for r in rs):
                results[variant][f"{key}_all"] = [round(r[key], 3) for r in rs]
                results[variant][f"{key}_median"] = harness.median([r[key] for r in rs])
    return results


# Rates of one variant over another: how close the host, or a Beam job that only tokenizes,
# runs to its tokenizer alone; the flagship against the others; packed against buckets.
PAIRS = (
    ("host_only", "host_only_buckets"),
    ("pipeline", "sentence_transformers"),
    ("pipeline", "runinference"),
    ("host_only", "tokenize_only"),
    ("host_only", "tokenize_only_rust"),
    *((variant, "tokenize_only") for variant in HOST_WITHOUT),
    ("tokenize_in_beam", "tokenize_only"),
    ("host_only", "tokenize_in_beam"),
    ("pipeline_packed", "pipeline_buckets"),
    ("pipeline_threads", "pipeline"),
    ("host_only_threads", "host_only"),
    ("host_only_threads", "tokenize_only"),
)


def ratios(results: dict) -> tuple[dict, dict]:
    """``PAIRS``' rates (``{ours}_vs_{theirs}``) and ``host_only_vs_tokenize_then_write``
    (the host's rate over tokenizing then writing, one after the other), of the median
    runs and of the best runs."""
    medians_, best = {}, {}
    for ours, theirs in PAIRS:
        if ours in results and theirs in results:
            a, b = results[ours], results[theirs]
            medians_[f"{ours}_vs_{theirs}"] = b["seconds_median"] / a["seconds_median"]
            best[f"{ours}_vs_{theirs}"] = b["seconds_best"] / a["seconds_best"]
    if {"host_only", "tokenize_only", "write_only"} <= results.keys():
        host, floors = results["host_only"], (results["tokenize_only"], results["write_only"])
        for stat, out in (("seconds_median", medians_), ("seconds_best", best)):
            out["host_only_vs_tokenize_then_write"] = sum(f[stat] for f in floors) / host[stat]
    return medians_, best


def same_precision_ratios(results: dict) -> dict:
    """The flagship over sentence-transformers at the same precision (``SAME_PRECISION``):
    ``process`` as whole processes (start to exit, imports and model load included),
    ``steady`` the flagship's job time (median round) against ``encode`` after a warm-up."""
    out = {}
    for ours, theirs in SAME_PRECISION:
        if ours in results and theirs in results:
            a, b = results[ours], results[theirs]
            out[f"{ours}_vs_{theirs}"] = {
                "precision": ST_VARIANTS[theirs],
                "process": b["process_s_median"] / a["process_s_median"],
                "steady": b["seconds_median"] / a["seconds_median"],
            }
    return out


# ---- the host's bounds ------------------------------------------------------------------


def cpu_bounds(results: dict, cores: int) -> dict:
    """For each host-only variant and ``tokenize_in_beam``: the CPU its run used
    (``run_cpu_s``: every thread of the process, from the job's start to its summary), how
    many of ``cores`` that kept busy on average, and the shortest the run could be if its
    work kept every core busy throughout (``all_cores_s``), also as a rate over
    ``tokenize_only``'s (``vs_tokenize_only``): how near the host could come to its
    tokenizer by overlap alone, without less work."""
    bounds = {}
    for variant in TIMED_JOBS:
        r = results.get(variant)
        if r is None or "run_cpu_s_median" not in r:
            continue
        cpu = r["run_cpu_s_median"]
        bound = {
            "run_cpu_s": cpu,
            "cores_busy": cpu / r["seconds_median"],
            "all_cores_s": cpu / cores,
        }
        if "tokenize_only" in results:
            bound["vs_tokenize_only"] = (
                results["tokenize_only"]["seconds_median"] / bound["all_cores_s"]
            )
        bounds[variant] = bound
    return bounds


def after_launch(results: dict, texts: int) -> dict:
    """For each host-only variant and ``tokenize_in_beam``: its launch (``launch_s``,
    median), the share of the run it takes, and the rate of the rest of the run (every text
    over the median run less the median launch), also over ``tokenize_only``'s rate: how
    near the host runs to its tokenizer once the job is under way, as on a long job whose
    launch is paid once."""
    after = {}
    for variant in TIMED_JOBS:
        r = results.get(variant)
        if r is None or "launch_s_median" not in r:
            continue
        launch, seconds = r["launch_s_median"], r["seconds_median"]
        entry = {
            "launch_s": launch,
            "launch_share": launch / seconds,
            "sentences_per_s": texts / (seconds - launch),
            "end_s": r.get("end_s_median"),
            # From the process started (imports included) to the first part tokenized.
            "process_launch_s": r.get("process_launch_s_median"),
        }
        if "tokenize_only" in results:
            entry["vs_tokenize_only"] = (
                entry["sentences_per_s"] / results["tokenize_only"]["sentences_per_s"]
            )
        after[variant] = entry
    return after


# ---- cold and warm ----------------------------------------------------------------------


def cold_warm(runs: dict[str, list[dict]], results: dict) -> dict:
    """Each flagship variant's and runinference's first round (an empty compilation cache:
    cold) and the median of the later ones (warm), where it ran at least two rounds; then
    cold against cold and warm against warm (sentence-transformers compiles nothing: its
    median both ways): each flagship variant against runinference and sentence-transformers,
    and packed against buckets."""
    out = {}
    for variant in (*FLAGSHIPS, "runinference"):
        rs = runs.get(variant, [])
        if len(rs) >= 2:
            out[f"{variant}_cold_s"] = rs[0]["seconds"]
            out[f"{variant}_warm_s"] = harness.median([r["seconds"] for r in rs[1:]])
    pairs = [("pipeline", other) for other in ("runinference", "sentence_transformers")]
    pairs.append(("pipeline_packed", "pipeline_buckets"))
    pairs += [
        (v, other)
        for v in FLAGSHIPS
        if v != "pipeline"
        for other in ("runinference", "sentence_transformers")
    ]
    for ours, other in pairs:
        if f"{ours}_cold_s" not in out or other not in results:
            continue
        for phase in ("cold", "warm"):
            theirs = out.get(f"{other}_{phase}_s", results[other]["seconds_median"])
            out[f"{ours}_vs_{other}_{phase}"] = theirs / out[f"{ours}_{phase}_s"]
    return out


# ---- against the encoder's limit ---------------------------------------------------------


def read_limit(path: str) -> dict:
    """The encoder's limit that ``bench/encoder.py --flagship --json PATH`` wrote: its
    ``flagship_limit`` (``texts_per_s``, ``texts``, ``seconds``, ...)."""
    record = json.loads(Path(path).read_text())
    limit = record.get("flagship_limit") if isinstance(record, dict) else None
    if not isinstance(limit, dict) or not isinstance(limit.get("texts_per_s"), int | float):
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(
            f"{path} holds no flagship_limit with a texts_per_s (found {keys}); write it with "
            f"bench/encoder.py --flagship --json {path}"
        )
    return limit


def pipeline_vs_limit(limit: dict, texts: int, cold_warm: dict) -> float | None:
    """``pipeline``'s warm rate (``texts`` over its median time in the rounds after the
    first) over the encoder limit's ``texts_per_s``; None without a warm round."""
    warm = cold_warm.get("pipeline_warm_s")
    return None if warm is None else texts / warm / limit["texts_per_s"]


# ---- cosines against sentence-transformers -----------------------------------------------


def min_cosine(pipeline_out: str, st_vectors: str) -> float:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(Path(pipeline_out).glob("embeddings-*.parquet"))
    table = pa.concat_tables(pq.read_table(f, columns=["id", "embedding"]) for f in files)
    ids = table.column("id").to_numpy()
    ours = np.stack(table.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float64)
    ref = np.load(st_vectors).astype(np.float64)[ids]
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    return float(cos.min())


def flagship_cosines(runs: dict) -> dict:
    """Each flagship variant's least cosine against sentence-transformers (last rounds)."""
    if "sentence_transformers" not in runs:
        return {}
    st = str(Path(runs["sentence_transformers"][-1]["out"]) / "vectors.npy")
    return {v: min_cosine(runs[v][-1]["out"], st) for v in FLAGSHIPS if v in runs}
