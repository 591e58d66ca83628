"""What a front end of one's own needs from the machinery under beam_jax's transforms.

Only that, and the few pieces the guides show by hand (``Packer``, ``padding_ratio``,
``fit_plan``, ``bucket_totals``); the rest is private (``beam_jax._src``) and may change.

Plan and pad batches yourself (``Plan``), compile and run a kernel on them (``Kernel``),
or write a front end of your own: a ``WorkerDoFn`` holding an ``ElementFrontEnd`` (validate,
bucket, buffer, check, emit through the ``BatchEngine``) with an ``Outputs`` strategy such
as ``PerElement``, its rows described by ``Source`` and its failures made by
``dead_letter_output`` (tests/test_custom_front_end.py is a complete one). All but the DoFn
run without Beam, and follow the same validation and error rules as the transforms.

Examples:
    >>> import numpy as np
    >>> from beam_jax import ArraySpec, Bucketing
    >>> from beam_jax.internal import Kernel, Plan
    >>> plan = Plan(ArraySpec(("L",)), Bucketing(boundaries={"L": (4,)}, batch_size=2))
    >>> batch = plan.pad((4,), [plan.validate(np.ones(3, np.float32))])
    >>> kernel = Kernel(lambda p, x, lengths: x.sum(), devices=[0])
    >>> kernel.run(None, batch, plan.layout.treedef).tolist()
    [3.0]
"""

import warnings as _warnings

from beam_jax._src.arrow.origin import ROW_COLUMN as ROW_COLUMN
from beam_jax._src.arrow.origin import bad_lines_of as bad_lines_of
from beam_jax._src.arrow.origin import origin_of as origin_of
from beam_jax._src.arrow.origin import row_origin as row_origin
from beam_jax._src.arrow.origin import with_origin as with_origin
from beam_jax._src.bucketing.boundaries import padding_ratio as padding_ratio
from beam_jax._src.core.packed_batch import Packer as Packer
from beam_jax._src.core.plan import PaddedBatch as PaddedBatch
from beam_jax._src.core.plan import Plan as Plan
from beam_jax._src.core.validation import Validated as Validated
from beam_jax._src.engine.batching import BatchEngine as BatchEngine
from beam_jax._src.engine.batching import Buffer as Buffer
from beam_jax._src.engine.batching import FrontEnd as FrontEnd
from beam_jax._src.engine.batching import RowBuffer as RowBuffer
from beam_jax._src.engine.batching import check_row_outputs as check_row_outputs
from beam_jax._src.engine.batching import check_summed_outputs as check_summed_outputs
from beam_jax._src.engine.elements import ElementFrontEnd as ElementFrontEnd
from beam_jax._src.engine.elements import Outputs as Outputs
from beam_jax._src.engine.elements import PerElement as PerElement
from beam_jax._src.engine.fit import fit_plan as fit_plan
from beam_jax._src.engine.metrics import KernelMetrics as KernelMetrics
from beam_jax._src.engine.metrics import bucket_totals as bucket_totals
from beam_jax._src.engine.worker import Worker as Worker
from beam_jax._src.kernel.compiled import Kernel as Kernel
from beam_jax._src.transforms.base import Source as Source
from beam_jax._src.transforms.base import WorkerDoFn as WorkerDoFn
from beam_jax._src.transforms.base import dead_letter_output as dead_letter_output

__all__ = [
    "BatchEngine",
    "Buffer",
    "ElementFrontEnd",
    "FrontEnd",
    "Kernel",
    "KernelMetrics",
    "Outputs",
    "Packer",
    "PaddedBatch",
    "PerElement",
    "Plan",
    "ROW_COLUMN",
    "RowBuffer",
    "Source",
    "Validated",
    "Worker",
    "WorkerDoFn",
    "bad_lines_of",
    "bucket_totals",
    "check_row_outputs",
    "check_summed_outputs",
    "dead_letter_output",
    "fit_plan",
    "origin_of",
    "padding_ratio",
    "row_origin",
    "with_origin",
]


def __getattr__(name: str):
    if name == "PackPlan":  # Packer's former name, until a later release
        _warnings.warn(
            "beam_jax.internal.PackPlan is now beam_jax.internal.Packer; the old name goes in "
            "a later release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return Packer
    raise AttributeError(f"module 'beam_jax.internal' has no attribute {name!r}")
