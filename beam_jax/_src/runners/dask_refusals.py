"""What a job on Dask is refused at launch for, and why; imports no Dask.

Two checks, both before anything runs:

- :func:`refuse_beams_dask_runner`, in each beam_jax transform's ``expand``: Beam's own
  ``DaskRunner`` (2.78) would run a beam_jax pipeline wrongly without a word (it computes
  only the step applied last, gives every output of a multi-output step to every consumer,
  drops windows, counts no metrics; docs/runners.md has a reproduction of each), so a
  pipeline built for it is refused, naming ``beam_jax.runners.DaskRunner``.
- :func:`refuse_unsupported`, in ``beam_jax.runners.DaskRunner.run_pipeline``: what that
  runner cannot run either (streaming, state and timers, splittable DoFns, primitives with
  no translation), naming the step and what to use instead.

Example:
    >>> refuse_beams_dask_runner(beam.Pipeline(runner="FnApiRunner"), "RunKernel")
"""

from __future__ import annotations

import sys
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.pvalue import PCollection
from apache_beam.runners.common import DoFnSignature

from beam_jax._src.compat.beam import dask_primitives
from beam_jax._src.errors import SpecError

__all__ = [
    "UnsupportedOnDaskError",
    "passes_through",
    "refuse_beams_dask_runner",
    "refuse_unsupported",
    "translatable",
]

BEAMS_DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
OURS = "beam_jax.runners.DaskRunner"
ALTERNATIVES = "Prism (--runner=PrismRunner), Flink or Dataflow"


class UnsupportedOnDaskError(SpecError):
    """The pipeline needs what its Dask runner cannot do; raised at launch, before anything
    runs. The message names the step, or the runner, and what to use instead:
    ``--runner=beam_jax.runners.DaskRunner`` for Beam's own DaskRunner; bundle mode for
    cross-bundle batching, ``max_batch_duration_secs=None`` for a ``JaxModelHandler``;
    Prism, Flink or Dataflow for streaming."""


def refuse_beams_dask_runner(pipeline: Any, transform: str) -> None:
    """Raises ``UnsupportedOnDaskError`` if ``pipeline`` runs on Beam's own ``DaskRunner``.

    Args:
        pipeline: the pipeline a beam_jax transform is being applied to.
        transform: the transform's name, for the message.
    """
    module = sys.modules.get(BEAMS_DASK_RUNNER.rsplit(".", 1)[0])
    if module is None or type(getattr(pipeline, "runner", None)) is not module.DaskRunner:
        return  # (its module is imported whenever the runner was made)
    raise UnsupportedOnDaskError(
        f"{transform} cannot run on Beam's own DaskRunner ({BEAMS_DASK_RUNNER}, Beam "
        f"{beam.__version__}): it computes only the step applied last, so the pipeline's "
        "other outputs (dead letters, a second sink) are never written; it gives every "
        "output of a multi-output step to each of its consumers, drops windows and counts "
        f"no metrics. Run with --runner={OURS}, Beam's DaskRunner with these fixed "
        "(docs/runners.md, Dask)."
    )


# Named, not imported: the transforms layer sits above this one.
_CROSS_BUNDLE_MODULE = "beam_jax._src.transforms.cross_bundle"
_TRANSLATED = (*dask_primitives().values(), beam.Impulse, beam.ParDo)


def translatable(transform: beam.PTransform) -> bool:
    """Whether a primitive transform (after Beam's Dask overrides) has a bag operation."""
    return isinstance(transform, _TRANSLATED)


def passes_through(node: AppliedPTransform) -> bool:
    """Whether a leaf of the pipeline makes no PCollection of its own (a composite that
    returns its input, or a ``PDone``): nothing to run."""
    return not translatable(node.transform) and all(
        not isinstance(p, PCollection) or p.producer is not node for p in node.outputs.values()
    )


def refuse_unsupported(pipeline: beam.Pipeline, options: PipelineOptions) -> None:
    """Raises ``UnsupportedOnDaskError`` for the first thing in ``pipeline`` (with Beam's
    Dask overrides applied) that ``beam_jax.runners.DaskRunner`` cannot run."""
    if options.view_as(StandardOptions).streaming:
        raise UnsupportedOnDaskError(
            "the DaskRunner runs bounded (batch) pipelines only, and got --streaming; run "
            f"streaming pipelines on {ALTERNATIVES}."
        )
    finder = _Unsupported()
    pipeline.visit(finder)
    if finder.problem:
        raise UnsupportedOnDaskError(finder.problem)


class _Unsupported(PipelineVisitor):
    def __init__(self):
        self.problem: str | None = None

    def visit_transform(self, node: AppliedPTransform) -> None:
        if self.problem is None:
            self.problem = _problem(node)


def _problem(node: AppliedPTransform) -> str | None:
    label, transform = node.full_label, node.transform
    if passes_through(node):
        return None
    if any(isinstance(p, PCollection) and not p.is_bounded for p in node.outputs.values()):
        return (
            f"step {label!r} makes an unbounded PCollection; the DaskRunner runs bounded "
            f"(batch) pipelines only: run streaming pipelines on {ALTERNATIVES}."
        )
    if not translatable(transform):
        return (
            f"step {label!r} ({type(transform).__name__}) is a primitive transform the "
            f"DaskRunner has no translation for; run this pipeline on {ALTERNATIVES}."
        )
    fn = getattr(transform, "fn", None)
    if fn is None:
        return None
    signature = DoFnSignature(fn)
    if signature.is_stateful_dofn() or signature.has_timers():
        return (
            f"step {label!r} ({type(fn).__name__}) keeps Beam state or sets timers, which "
            f"the DaskRunner does not have. {_stateful_advice(label, fn)}"
        )
    if signature.is_splittable_dofn():
        return (
            f"step {label!r} ({type(fn).__name__}) is a splittable DoFn, which the DaskRunner "
            "cannot split or run; read with a BoundedSource (beam.io.Read) or "
            f"beam_jax.ReadArrowBatches, or run on {ALTERNATIVES}."
        )
    return None


def _stateful_advice(label: str, fn: beam.DoFn) -> str:
    if type(fn).__module__ == _CROSS_BUNDLE_MODULE:
        return (
            "For beam_jax's cross-bundle batching, drop .with_cross_bundle_batching(...) (in a "
            "batch job, bundle mode fills batches from each bundle), or keep it and run on "
            f"{ALTERNATIVES}."
        )
    if "BatchElements" in label:
        return (
            "Beam's BatchElements keeps elements in state when given max_batch_duration_secs "
            "(JaxModelHandler's default is 1.0): give JaxModelHandler("
            "max_batch_duration_secs=None), or BatchElements no max_batch_duration_secs, "
            f"or run on {ALTERNATIVES}."
        )
    return f"Run this pipeline on {ALTERNATIVES}."
