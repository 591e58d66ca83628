"""beam_jax: run JAX over large datasets in Apache Beam with shape-bucketed batching.

What pipeline authors use is importable from here; the machinery underneath (the plan,
the compiled kernel, the batch engine, Arrow decoding) is in ``beam_jax.internal``.
"""

# First: drops a warning that `import apache_beam` logs on every machine without its GCP extras.
import warnings as _warnings

from beam_jax import _quiet  # noqa: F401  # isort: skip
from beam_jax._src.arrow.ahead import WorkAhead as WorkAhead
from beam_jax._src.arrow.columns import ArrowColumns as ArrowColumns
from beam_jax._src.arrow.io import ReadArrowBatches as ReadArrowBatches
from beam_jax._src.bucketing.boundaries import plan_boundaries as plan_boundaries
from beam_jax._src.bucketing.bucketing_choice import BucketingChoice as BucketingChoice
from beam_jax._src.bucketing.bucketing_choice import plan_bucketing as plan_bucketing
from beam_jax._src.bucketing.buckets import Bucketing as Bucketing
from beam_jax._src.bucketing.fit import FitToMemory as FitToMemory
from beam_jax._src.bucketing.packing import Packing as Packing
from beam_jax._src.bucketing.packing_choice import PackingChoice as PackingChoice
from beam_jax._src.bucketing.packing_choice import plan_packing as plan_packing
from beam_jax._src.bucketing.rule import default_boundaries as default_boundaries
from beam_jax._src.core.dead_letter import DEAD_LETTERS as DEAD_LETTERS
from beam_jax._src.core.dead_letter import FailedElement as FailedElement
from beam_jax._src.core.dead_letter import Stage as Stage
from beam_jax._src.core.spec import ArraySpec as ArraySpec
from beam_jax._src.core.validation import Validation as Validation
from beam_jax._src.engine.cross_bundle import CrossBundle as CrossBundle
from beam_jax._src.engine.metrics import BufferingSummary as BufferingSummary
from beam_jax._src.engine.metrics import Summary as Summary
from beam_jax._src.engine.metrics import metric_totals as metric_totals
from beam_jax._src.engine.metrics import summarize as summarize
from beam_jax._src.engine.options import KernelOptions as KernelOptions
from beam_jax._src.errors import BeamJaxError as BeamJaxError
from beam_jax._src.errors import CompileError as CompileError
from beam_jax._src.errors import DeadLetterThresholdError as DeadLetterThresholdError
from beam_jax._src.errors import DeviceUnavailableError as DeviceUnavailableError
from beam_jax._src.errors import ElementTooLargeError as ElementTooLargeError
from beam_jax._src.errors import InferenceBatchError as InferenceBatchError
from beam_jax._src.errors import InputFileError as InputFileError
from beam_jax._src.errors import InputLineError as InputLineError
from beam_jax._src.errors import InvalidElementError as InvalidElementError
from beam_jax._src.errors import KernelError as KernelError
from beam_jax._src.errors import SpecError as SpecError
from beam_jax._src.inference.failed import FailedInferences as FailedInferences
from beam_jax._src.inference.handler import JaxModelHandler as JaxModelHandler
from beam_jax._src.inference.handler import KeyedJaxModelHandler as KeyedJaxModelHandler
from beam_jax._src.kernel.compiled import BatchLengths as BatchLengths
from beam_jax._src.kernel.compiled import length_mask as length_mask
from beam_jax._src.kernel.params import read_params as read_params
from beam_jax._src.kernel.params import write_params as write_params
from beam_jax._src.transforms.base import RunKernelResult as RunKernelResult
from beam_jax._src.transforms.reduce_kernel import ReduceKernel as ReduceKernel
from beam_jax._src.transforms.reduce_kernel import Reduction as Reduction
from beam_jax._src.transforms.run_kernel import RunKernel as RunKernel
from beam_jax._src.transforms.run_kernel_on_arrow import RunKernelOnArrow as RunKernelOnArrow

__version__ = "0.2.0"

__all__ = [
    "ArraySpec",
    "ArrowColumns",
    "BatchLengths",
    "BeamJaxError",
    "Bucketing",
    "BucketingChoice",
    "BufferingSummary",
    "CompileError",
    "CrossBundle",
    "DEAD_LETTERS",
    "DeadLetterThresholdError",
    "DeviceUnavailableError",
    "ElementTooLargeError",
    "FailedElement",
    "FailedInferences",
    "FitToMemory",
    "InferenceBatchError",
    "InputFileError",
    "InputLineError",
    "InvalidElementError",
    "JaxModelHandler",
    "KernelError",
    "KernelOptions",
    "KeyedJaxModelHandler",
    "Packing",
    "PackingChoice",
    "ReadArrowBatches",
    "ReduceKernel",
    "Reduction",
    "RunKernel",
    "RunKernelOnArrow",
    "RunKernelResult",
    "SpecError",
    "Stage",
    "Summary",
    "Validation",
    "WorkAhead",
    "default_boundaries",
    "length_mask",
    "metric_totals",
    "plan_boundaries",
    "plan_bucketing",
    "plan_packing",
    "read_params",
    "summarize",
    "write_params",
]

# Former names, importable with a DeprecationWarning until a later release.
_FORMER = {"BucketingPlan": BucketingChoice, "PackingPlan": PackingChoice}


def __getattr__(name: str):
    if name in _FORMER:
        now = _FORMER[name].__name__
        _warnings.warn(
            f"beam_jax.{name} is now beam_jax.{now}; the old name goes in a later release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return _FORMER[name]
    raise AttributeError(f"module 'beam_jax' has no attribute {name!r}")
