"""``beam-jax plan --kernel``: XLA's analysed bytes of every (bucket, batch size) shape.

With ``--kernel``, ``beam-jax plan`` fits one budget's boundaries to memory as a worker
would (:func:`beam_jax._src.engine.fit.fit_plan` with ``FitToMemory``): per bucket it compiles
the batch sizes the search needs, and lists each analysed shape's argument, output,
temporary and generated-code bytes, whether XLA's figure is complete (``trusted``), whether
it fits the budget, and the bucket's chosen batch limit.

``--kernel`` is ``minilm`` (the packaged all-MiniLM-L6-v2 of ``beam_jax.text``), the path
of a sentence-transformers BERT model directory, a registered name (entry-point group
``beam_jax.kernels``) or ``module:attr``, a zero-argument callable returning a dict with
``fn`` (the per-element kernel, ``fn(params, element, lengths)``), ``spec`` (the element
spec, with exactly one ragged axis) and optionally ``load_params`` (zero-argument callable)
and ``batched`` (bool).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from beam_jax._src.cli import registry
from beam_jax._src.cli.table import format_table

__all__ = ["KERNEL_HELP", "add_arguments", "analyse", "format_memory", "load_kernel"]

MIB = 1 << 20
BUILTIN = "'minilm', a model directory"

KERNEL_HELP = (
    "also list XLA's analysed memory of each (bucket, batch size) shape and the chosen batch "
    "limit per bucket: 'minilm' (the packaged all-MiniLM-L6-v2), a sentence-transformers "
    "model directory, a registered name or 'module:attr', "
    "a zero-argument callable returning a dict with 'fn' (fn(params, element, lengths)), "
    "'spec' (one ragged axis) and optional 'load_params' (zero-argument callable) and "
    "'batched' (bool)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--kernel`` flags of ``beam-jax plan``."""
    add = parser.add_argument
    add("--kernel", metavar="NAME", help=KERNEL_HELP)
    add(
        "--memory_budget_mib",
        type=float,
        metavar="N",
        help="with --kernel: the memory budget per device in MiB (required on CPU; default "
        "on GPU/TPU: a fraction of free device memory)",
    )
    add(
        "--buckets_for",
        type=int,
        metavar="K",
        help="with --kernel: analyse the boundaries of budget K (default: the largest)",
    )
    add(
        "--batch_size",
        type=int,
        default=64,
        help="with --kernel: the largest batch size searched (default 64)",
    )


def load_kernel(name: str) -> dict[str, Any]:
    """The kernel dict named by ``--kernel``: ``minilm`` or a model directory (a
    ``beam_jax.text.SentenceEncoder``), a registered name or ``module:attr``."""
    if name == "minilm" or os.path.isdir(name):
        from beam_jax._src.text.sentence_encoder import SentenceEncoder

        encoder = SentenceEncoder.from_dir(None if name == "minilm" else name)
        return {"fn": encoder.element_fn, "spec": encoder.spec, "load_params": encoder.load_params}
    kernel = registry.load(registry.KERNELS, name, "--kernel", BUILTIN)()
    if not isinstance(kernel, dict) or "fn" not in kernel or "spec" not in kernel:
        raise ValueError(
            f"--kernel {name!r} must return a dict with keys 'fn' and 'spec' (optional "
            f"'load_params', 'batched'), got {type(kernel).__name__}"
        )
    return kernel


def ragged_axis(spec: Any) -> str:
    """The spec's single ragged axis name."""
    from beam_jax._src.core.spec import as_layout

    names = as_layout(spec).axis_names
    if len(names) != 1:
        raise ValueError(
            f"--kernel's spec must have exactly one ragged axis to bucket by the column's "
            f"lengths, it has {len(names)}: {list(names)}"
        )
    return names[0]


def analyse(args: argparse.Namespace, plans: Sequence[Any]) -> dict[str, Any] | None:
    """The ``"memory"`` section for ``args`` (``None`` without ``--kernel``); exits with a
    message on bad flags."""
    if args.kernel is None:
        if args.memory_budget_mib is not None or args.buckets_for is not None:
            sys.exit("beam-jax plan: --memory_budget_mib and --buckets_for need --kernel")
        return None
    k = len(plans) if args.buckets_for is None else args.buckets_for
    if not 1 <= k <= len(plans):
        sys.exit(f"beam-jax plan: --buckets_for must be in 1..{len(plans)}, got {k}")
    if args.batch_size < 1:
        sys.exit(f"beam-jax plan: --batch_size must be >= 1, got {args.batch_size}")
    budget = None
    if args.memory_budget_mib is not None:
        if args.memory_budget_mib <= 0:
            sys.exit(
                f"beam-jax plan: --memory_budget_mib must be > 0, got {args.memory_budget_mib}"
            )
        budget = int(args.memory_budget_mib * MIB)
    import jax

    import beam_jax as bj
    from beam_jax._src.engine.fit import fit_plan
    from beam_jax._src.engine.options import KernelOptions

    if budget is None and jax.default_backend() == "cpu":
        sys.exit("beam-jax plan: --kernel on CPU needs --memory_budget_mib (CPU devices do "
                 "not report their memory)")  # fmt: skip
    try:
        kernel = load_kernel(args.kernel)
        axis = ragged_axis(kernel["spec"])
    except (ValueError, FileNotFoundError) as e:  # a model directory's own message
        sys.exit(f"beam-jax plan: {e}")
    boundaries = tuple(plans[k - 1].boundaries)
    options = KernelOptions(
        bucketing=bj.Bucketing(boundaries={axis: boundaries}, batch_size=args.batch_size),
        load_params=kernel.get("load_params"),
        batched=bool(kernel.get("batched", False)),
        fit_to_memory=bj.FitToMemory(budget_bytes=budget),
    )
    report = fit_plan(kernel["fn"], kernel["spec"], options)
    return {
        "kernel": args.kernel,
        "axis": axis,
        "num_buckets": k,
        "boundaries": list(boundaries),
        "budget_bytes": report.budget,
        "budget_source": report.budget_source,
        "params_bytes": report.params_bytes,
        "num_devices": report.num_devices,
        "compiles": report.compiles,
        "compile_seconds": report.compile_seconds,
        "limits": {str(b[0]): int(v) for b, v in report.limits.items()},
        "rows": report.table(),
    }


def format_memory(memory: dict[str, Any]) -> str:
    """The memory section as text: a header and one row per analysed shape (MiB)."""
    mib = lambda n: n / MIB  # noqa: E731
    rows = [
        {
            memory["axis"]: r["bucket"][0],
            "batch": r["batch_size"],
            "args_mib": mib(r["argument_bytes"]),
            "out_mib": mib(r["output_bytes"]),
            "temp_mib": mib(r["temp_bytes"] + r["hidden_bytes"]),
            "code_mib": mib(r["generated_code_bytes"]),
            "total_mib": mib(r["total_bytes"]),
            "trusted": "yes" if r["trusted"] else "no",
            "fits": "yes" if r["fits"] else "no",
            "limit": f"{r['limit']} *" if r["chosen"] else str(r["limit"]),
        }
        for r in memory["rows"]
    ]
    head = (
        f"memory of {memory['kernel']}, boundaries of {memory['num_buckets']} buckets, "
        f"budget {mib(memory['budget_bytes']):.2f} MiB per device ({memory['budget_source']}), "
        f"{memory['num_devices']} device(s), params {mib(memory['params_bytes']):.2f} MiB; "
        f"{memory['compiles']} compiles in {memory['compile_seconds']:.1f} s"
    )
    limits = ", ".join(f"{b}: {v}" for b, v in memory["limits"].items())
    lines = [head, format_table(rows), f"batch limit per bucket: {limits}"]
    over = [str(r["bucket"][0]) for r in memory["rows"] if r["chosen"] and not r["fits"]]
    if over:
        lines.append(
            f"warning: the smallest batch of bucket(s) {', '.join(over)} does not fit the "
            "budget; workers run it anyway and may run out of memory. Raise "
            "--memory_budget_mib, or lower the largest boundary."
        )
    return "\n".join(lines)
