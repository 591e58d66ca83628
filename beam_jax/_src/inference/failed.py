"""RunInference's failed batches as dead letters: one ``FailedElement`` per element.

RunInference dead-letters whole batches: with ``.with_exception_handling()`` its
``failed_inferences`` holds ``(batch, (exception type, repr, traceback lines))``, the
exception itself not kept. :class:`FailedInferences` turns each into one record per element
of the batch (none of them got a result), at stage ``"inference"``, so a RunInference job
writes the same dead-letter files as every other beam_jax path
(``beam_jax.jobs.WriteDeadLetters``). The message names the elements that failed
themselves (``InferenceBatchError``); the others were lost with their batch.

Example:
    >>> main, other = examples | RunInference(handler).with_exception_handling()  # doctest: +SKIP
    >>> dead = other.failed_inferences | FailedInferences()  # doctest: +SKIP
    >>> _ = dead | jobs.WriteDeadLetters("out/_failed/inference")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apache_beam as beam

from beam_jax._src.core.dead_letter import FailedElement, Stage


def _records(failed: tuple[Sequence[Any], tuple[Any, str, Any]], keyed: bool):
    batch, (error_type, message, trace) = failed
    name = getattr(error_type, "__name__", str(error_type))
    trace = "".join(trace) if isinstance(trace, list | tuple) else str(trace)
    for index, example in enumerate(batch):
        key, example = example if keyed else (index, example)
        yield FailedElement.from_error(
            name, message, stage=Stage.INFERENCE, element=example, key=key, traceback=trace
        )


class FailedInferences(beam.PTransform):
    """RunInference's ``failed_inferences`` -> one ``FailedElement`` per element of each
    failed batch (``key``: the element's index in its batch, or its key with ``keyed``).

    Args:
        keyed: the batches hold ``(key, example)`` pairs (a keyed handler such as
            ``KeyedJaxModelHandler``); each record's ``key`` is the pair's key.
    """

    def __init__(self, *, keyed: bool = False):
        super().__init__()
        self._keyed = keyed

    def expand(self, failed):
        return failed | "DeadLetters" >> beam.FlatMap(_records, self._keyed).with_output_types(
            FailedElement
        )
