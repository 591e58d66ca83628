"""The machinery under beam_jax's transforms, for power users and tests.

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

from beam_jax._src.arrow.decode import DecodedBatch as DecodedBatch
from beam_jax._src.arrow.decode import decode_batch as decode_batch
from beam_jax._src.arrow.encode import outputs_to_arrow as outputs_to_arrow
from beam_jax._src.arrow.fill import BucketFill as BucketFill
from beam_jax._src.arrow.fill import ColumnRecords as ColumnRecords
from beam_jax._src.arrow.io import ArrowCoder as ArrowCoder
from beam_jax._src.arrow.io import origin_of as origin_of
from beam_jax._src.arrow.io import with_origin as with_origin
from beam_jax._src.bucketing.boundaries import padded_total as padded_total
from beam_jax._src.bucketing.boundaries import padding_ratio as padding_ratio
from beam_jax._src.bucketing.fit import FitRow as FitRow
from beam_jax._src.bucketing.fit import ShapeBytes as ShapeBytes
from beam_jax._src.bucketing.fit import search_limits as search_limits
from beam_jax._src.bucketing.packing import Assignment as Assignment
from beam_jax._src.bucketing.packing import assign_rows as assign_rows
from beam_jax._src.bucketing.packing import batch_rows as batch_rows
from beam_jax._src.bucketing.packing_plan import PackingStats as PackingStats
from beam_jax._src.bucketing.packing_plan import simulate_packing as simulate_packing
from beam_jax._src.bucketing.rule import bucket_index as bucket_index
from beam_jax._src.bucketing.rule import default_batch_sizes as default_batch_sizes
from beam_jax._src.core.outputs import BatchOutputs as BatchOutputs
from beam_jax._src.core.outputs import check_outputs as check_outputs
from beam_jax._src.core.outputs import nonfinite_rows as nonfinite_rows
from beam_jax._src.core.packed_batch import PackedBatch as PackedBatch
from beam_jax._src.core.packed_batch import PackPlan as PackPlan
from beam_jax._src.core.packed_batch import PackResult as PackResult
from beam_jax._src.core.packed_batch import Refusal as Refusal
from beam_jax._src.core.packed_batch import SegmentInfo as SegmentInfo
from beam_jax._src.core.packed_plan import PackedPlan as PackedPlan
from beam_jax._src.core.packed_plan import PackedRows as PackedRows
from beam_jax._src.core.plan import PaddedBatch as PaddedBatch
from beam_jax._src.core.plan import Plan as Plan
from beam_jax._src.core.spec import Layout as Layout
from beam_jax._src.core.tree_codec import decode_tree as decode_tree
from beam_jax._src.core.tree_codec import encode_tree as encode_tree
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
from beam_jax._src.engine.elements import split_element as split_element
from beam_jax._src.engine.elements import validate_element as validate_element
from beam_jax._src.engine.fit import FitReport as FitReport
from beam_jax._src.engine.fit import fit_batch_limits as fit_batch_limits
from beam_jax._src.engine.fit import fit_plan as fit_plan
from beam_jax._src.engine.metrics import BufferMetrics as BufferMetrics
from beam_jax._src.engine.metrics import KernelMetrics as KernelMetrics
from beam_jax._src.engine.metrics import bucket_totals as bucket_totals
from beam_jax._src.engine.packing import BucketStage as BucketStage
from beam_jax._src.engine.packing import ItemRecords as ItemRecords
from beam_jax._src.engine.packing import PackedBuffer as PackedBuffer
from beam_jax._src.engine.packing import PackedStage as PackedStage
from beam_jax._src.engine.worker import Worker as Worker
from beam_jax._src.inference.rows import YamlErrors as YamlErrors
from beam_jax._src.kernel.cache import enable_compilation_cache as enable_compilation_cache
from beam_jax._src.kernel.compiled import Kernel as Kernel
from beam_jax._src.kernel.compiled import is_out_of_memory as is_out_of_memory
from beam_jax._src.kernel.devices import select_devices as select_devices
from beam_jax._src.kernel.memory import analyse_shape as analyse_shape
from beam_jax._src.kernel.wrappers import SegmentKernel as SegmentKernel
from beam_jax._src.kernel.wrappers import SumRows as SumRows
from beam_jax._src.transforms.base import Source as Source
from beam_jax._src.transforms.base import WorkerDoFn as WorkerDoFn
from beam_jax._src.transforms.base import dead_letter_output as dead_letter_output
from beam_jax._src.transforms.cross_bundle import BufferedElement as BufferedElement
from beam_jax._src.transforms.cross_bundle import BufferedElementCoder as BufferedElementCoder
