"""What a compiled batch shape needs in device memory, and what a device has (pure jax).

XLA states a compiled program's memory before it runs: ``Compiled.memory_analysis()`` gives
argument, output, temporary, generated-code and aliased bytes. For a kernel sharded over
several local devices the figures are per device: each device holds its share of the batch
and a full copy of the (replicated) parameters, which the argument bytes include.

What is trustworthy where (jax 0.10):

- GPU/TPU: every buffer a program uses comes from XLA's buffer assignment, so the analysis
  is complete; ``Device.memory_stats()`` reports ``bytes_limit`` and ``bytes_in_use``.
- CPU: arguments and outputs are exact, but XLA:CPU hands dot-heavy parts of a program to
  XNNPACK fusions (``__ynn_fusion``) that allocate their own intermediates, which the
  analysis never sees: a softmax attention's temporaries read 512 KiB at batch 8 and 0 at
  batch 64. So on CPU the intermediates inside each such fusion are estimated from the
  compiled HLO (``hidden_fusion_bytes``) and added. ``peak_memory_in_bytes`` leaves
  temporaries out, and ``memory_stats()`` is ``None``, so a CPU budget must be stated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from beam_jax._src.bucketing.fit import ShapeBytes
from beam_jax._src.errors import CompileError
from beam_jax._src.kernel.compiled import Kernel


def analyse_shape(
    kernel: Kernel,
    params: Any,
    leaf_shapes: Sequence[tuple[tuple[int, ...], Any]],
    names: Sequence[str],
    treedef: Any,
) -> ShapeBytes | None:
    """XLA's memory analysis, per device, of one batch shape; ``None`` if it fails to compile.

    The shape is compiled through the kernel's own cache (and counted in
    ``kernel.compiles``), so a shape the job later runs is not compiled twice.

    Example:
        >>> k = Kernel(lambda p, x, lengths: x.sum(), devices=[0])
        >>> analyse_shape(k, None, [((8, 4), np.float32)], (), None).argument
        128

    Args:
        kernel: the compiled kernel.
        params: the parameters, already placed (``kernel.put_params``).
        leaf_shapes: ``(shape, dtype)`` of every leaf, the batch first.
        names: the ragged-axis names (the kernel's ``lengths`` keys).
        treedef: the element's tree structure (``None`` for a single leaf).
    """
    try:
        # The kernel's per-shape cache: compiles here are the ones a batch would do.
        exe = kernel.executable(params, list(leaf_shapes), tuple(sorted(names)), treedef)
    except CompileError:
        return None
    m = exe.memory_analysis()
    if m is None:  # a backend without an analysis: nothing to fit by
        raise CompileError(
            f"the {kernel.devices[0].platform} backend gives no memory analysis of compiled "
            "programs, so batch sizes cannot be fitted to memory there; drop fit_to_memory "
            "and bound batches with Bucketing(max_padded_size=...)."
        )
    hidden = hidden_fusion_bytes(exe.as_text()) if kernel.devices[0].platform == "cpu" else 0
    return ShapeBytes(
        argument=int(m.argument_size_in_bytes),
        output=int(m.output_size_in_bytes),
        temp=int(m.temp_size_in_bytes),
        generated_code=int(m.generated_code_size_in_bytes),
        alias=int(m.alias_size_in_bytes),
        hidden=hidden,
    )


_LIBRARY_FUSIONS = ("__ynn_fusion", "__xnn_fusion", "__onednn_fusion")
_RESULT = re.compile(r"=\s*(\w+)\[([\d,]*)\]")
_CALLS = re.compile(r"calls=%([\w.\-]+)")


def hidden_fusion_bytes(hlo: str) -> int:
    """An estimate of what XLA:CPU's library fusions allocate unseen by its analysis.

    For each XNNPACK/oneDNN fusion in the compiled HLO, its two largest intermediate results
    (a producer and its consumer alive at once); the largest such pair over the program,
    since fusions run one after another. docs/memory.md compares XLA's figure, with and
    without this estimate, against the peak memory used on CPU.

    Example:
        >>> hidden_fusion_bytes("ENTRY %main (x: f32[2]) -> f32[2] {")
        0
    """
    computations: dict[str, list[str]] = {}
    current = None
    for raw in hlo.splitlines():
        line = raw.strip()
        if line.endswith("{") and (line.startswith("%") or line.startswith("ENTRY")):
            name = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
            current = computations.setdefault(name.lstrip("%"), [])
        elif line == "}":
            current = None
        elif current is not None:
            current.append(line)
    worst = 0
    for lines in computations.values():
        for line in lines:
            called = _CALLS.search(line)
            if "kind=kCustom" not in line or not called:
                continue
            if not any(kind in line for kind in _LIBRARY_FUSIONS):
                continue
            sizes = sorted(
                _result_bytes(inner)
                for inner in computations.get(called.group(1), [])
                if not inner.startswith("ROOT") and "parameter(" not in inner
            )
            worst = max(worst, sum(sizes[-2:]))
    return worst


def _result_bytes(instruction: str) -> int:
    m = _RESULT.search(instruction)
    if m is None:
        return 0
    try:
        itemsize = np.dtype(_HLO_DTYPES.get(m.group(1), m.group(1))).itemsize
    except TypeError:
        return 0
    return math.prod(int(d) for d in m.group(2).split(",") if d) * itemsize


_HLO_DTYPES = {
    "f32": "float32",
    "f16": "float16",
    "f64": "float64",
    "bf16": "uint16",
    "s8": "int8",
    "s16": "int16",
    "s32": "int32",
    "s64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "pred": "bool",
}


def params_bytes(params: Any) -> int:
    """Bytes of one full copy of ``params`` (what each device holds when replicated)."""
    return sum(
        math.prod(np.shape(x)) * np.dtype(getattr(x, "dtype", np.float32)).itemsize
        for x in jax.tree_util.tree_leaves(params)
    )


def device_free_bytes(devices: Sequence[jax.Device]) -> int | None:
    """The least free memory (``bytes_limit - bytes_in_use``) over ``devices``, or ``None``
    where a device does not report its memory (CPU)."""
    free = []
    for d in devices:
        stats = d.memory_stats()
        if not stats or "bytes_limit" not in stats:
            return None
        free.append(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
    return min(free) if free else None
