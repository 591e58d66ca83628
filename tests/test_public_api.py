"""The public surface: what pipeline authors import, what power users reach one level down."""

import dataclasses
import importlib
import pathlib
import typing

import beam_jax as bj
import beam_jax.internal as internal
from beam_jax.engine.options import KernelOptions, KernelOptionsKwargs

TOP_LEVEL = {
    # transforms and their results
    "RunKernel",
    "RunKernelOnArrow",
    "ReduceKernel",
    "Reduction",
    "RunKernelResult",
    "ReadArrowBatches",
    # Beam ML front ends
    "JaxModelHandler",
    "KeyedJaxModelHandler",
    "RunKernelOnRows",
    # configuration
    "ArraySpec",
    "Bucketing",
    "Validation",
    "KernelOptions",
    "ArrowColumns",
    "FitToMemory",
    "CrossBundle",
    "default_boundaries",
    "plan_boundaries",
    "plan_bucketing",
    "BucketingPlan",
    "Packing",
    "plan_packing",
    "PackingPlan",
    # inside a kernel
    "length_mask",
    "BatchLengths",
    # parameters
    "read_params",
    "write_params",
    # dead letters and metrics
    "FailedElement",
    "DEAD_LETTERS",
    "Stage",
    "Summary",
    "summarize",
    "metric_totals",
    "BufferingSummary",
    # errors
    "BeamJaxError",
    "SpecError",
    "InputFileError",
    "InvalidElementError",
    "ElementTooLargeError",
    "KernelError",
    "CompileError",
    "DeadLetterThresholdError",
    "InferenceBatchError",
}

INTERNAL = {
    "Plan",
    "PaddedBatch",
    "Layout",
    "Validated",
    "Kernel",
    "SumRows",
    "Worker",
    "BatchEngine",
    "Buffer",
    "FrontEnd",
    "BatchOutputs",
    "check_outputs",
    "nonfinite_rows",
    "BucketFill",
    "DecodedBatch",
    "decode_batch",
    "outputs_to_arrow",
    "ArrowCoder",
    "bucket_index",
    "default_batch_sizes",
    "padded_total",
    "padding_ratio",
    "bucket_totals",
    "enable_compilation_cache",
    "is_out_of_memory",
    "select_devices",
    # fitting batch sizes to memory
    "FitReport",
    "FitRow",
    "ShapeBytes",
    "analyse_shape",
    "fit_batch_limits",
    "fit_plan",
    "search_limits",
    # cross-bundle batching
    "encode_tree",
    "decode_tree",
    "BufferMetrics",
    "BufferedElement",
    "BufferedElementCoder",
    # sequence packing
    "PackPlan",
    "PackedBatch",
    "PackResult",
    "Refusal",
    "SegmentInfo",
    "Assignment",
    "assign_rows",
    "batch_rows",
    "simulate_packing",
    "PackingStats",
}

SUBPACKAGES = ("core", "kernel", "engine", "transforms", "arrow", "inference")


def _public(module) -> set[str]:
    return (
        {n for n in dir(module) if not n.startswith("_")}
        - set(SUBPACKAGES)
        - {
            "internal",
            "testing",
            "cli",  # cli: the beam-jax command, a subpackage
        }
    )


def test_top_level_exports_exactly_what_pipeline_authors_use():
    assert _public(bj) == TOP_LEVEL


def test_internal_exports_the_machinery():
    assert _public(internal) == INTERNAL
    assert not TOP_LEVEL & INTERNAL, "a name lives in one place"


def test_every_error_is_a_beam_jax_error_and_says_how_to_fix_it():
    for name in TOP_LEVEL:
        obj = getattr(bj, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, bj.BeamJaxError), name
            assert obj.__doc__ and len(obj.__doc__.strip().splitlines()) >= 2, name


def test_stages_and_the_dead_letter_tag_are_exported():
    assert bj.DEAD_LETTERS == "dead_letters"
    assert bj.Stage.ALL == ("validation", "compile", "kernel", "output")


def test_kernel_options_are_stated_once_and_the_kwargs_type_matches():
    fields = {f.name: f.type for f in dataclasses.fields(KernelOptions)}
    hints = typing.get_type_hints(KernelOptionsKwargs)
    assert set(hints) == set(fields)
    resolved = typing.get_type_hints(KernelOptions)
    for name in fields:
        # The kwargs may drop "| None" where the dataclass accepts None as "the default".
        assert str(hints[name]).replace(" | None", "") in str(resolved[name]), name


def test_imports_only_go_down_the_layers():
    """core < kernel < engine < transforms; arrow (columns, decode, fill, encode, io) sits
    beside kernel and is used by transforms; inference (RunInference's model handlers, a
    front end of the engine, and RunKernel on YAML rows) sits on top of transforms."""
    rank = {"core": 0, "arrow": 1, "kernel": 1, "engine": 2, "transforms": 3, "inference": 4}
    root = pathlib.Path(bj.__file__).parent
    for package, level in rank.items():
        for path in (root / package).glob("*.py"):
            module = importlib.import_module(f"beam_jax.{package}.{path.stem}")
            text = path.read_text()
            for other, other_level in rank.items():
                if other != package and f"from beam_jax.{other}" in text:
                    assert other_level < level, (module.__name__, other)
