"""beam_jax: run JAX over large datasets in Apache Beam with shape-bucketed batching."""

from beam_jax._arrow_transform import RunKernelOnArrow as RunKernelOnArrow
from beam_jax._buckets import Bucketing as Bucketing
from beam_jax._buckets import default_batch_sizes as default_batch_sizes
from beam_jax._buckets import default_boundaries as default_boundaries
from beam_jax._columns import ArrowColumns as ArrowColumns
from beam_jax._dead_letter import FailedElement as FailedElement
from beam_jax._errors import BeamJaxError as BeamJaxError
from beam_jax._errors import DeadLetterThresholdError as DeadLetterThresholdError
from beam_jax._errors import ElementTooLargeError as ElementTooLargeError
from beam_jax._errors import InvalidElementError as InvalidElementError
from beam_jax._errors import KernelError as KernelError
from beam_jax._errors import SpecError as SpecError
from beam_jax._kernel import Kernel as Kernel
from beam_jax._kernel import is_out_of_memory as is_out_of_memory
from beam_jax._kernel import length_mask as length_mask
from beam_jax._kernel import select_devices as select_devices
from beam_jax._metrics import Summary as Summary
from beam_jax._metrics import metric_totals as metric_totals
from beam_jax._metrics import summarize as summarize
from beam_jax._params import load_params as load_params
from beam_jax._params import save_params as save_params
from beam_jax._plan import PaddedBatch as PaddedBatch
from beam_jax._plan import Plan as Plan
from beam_jax._planning import plan_boundaries as plan_boundaries
from beam_jax._reduce import ReduceKernel as ReduceKernel
from beam_jax._reduce import Reduction as Reduction
from beam_jax._spec import ArraySpec as ArraySpec
from beam_jax._transform import RunKernel as RunKernel
from beam_jax._transform import RunKernelResult as RunKernelResult
from beam_jax._validate import Validation as Validation
from beam_jax.io import ReadArrowBatches as ReadArrowBatches

__version__ = "0.1.0"
