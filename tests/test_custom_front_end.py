"""A front end of one's own, written with only ``beam_jax`` and ``beam_jax.internal``.

Its inputs are column batches as dicts of lists (``{"name", "id": [...], "x": [[...], ...]}``);
each row goes through the engine's ``ElementFrontEnd`` (validate, bucket, buffer, check,
emit), and every bad record, whole batch or row, becomes one dead letter naming its batch
and row.
"""

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.windowed_value import WindowedValue

import beam_jax as bj
import beam_jax.internal as bji
from beam_jax.testing import assert_conserved
from tests.beam_helpers import pipeline

REFUSED = 13.0
SPEC = {"x": bj.ArraySpec(("L",), np.float32)}
OPTIONS = bj.KernelOptions(bucketing=bj.Bucketing(boundaries={"L": (2, 4)}, batch_size=3))


def _refuse(x):
    if np.any(x == REFUSED):
        raise ValueError(f"refused value {REFUSED}")
    return x


def total(params, element, lengths):
    shape = jax.ShapeDtypeStruct(element["x"].shape, element["x"].dtype)
    return jnp.sum(jax.pure_callback(_refuse, shape, element["x"], vmap_method="broadcast_all"))


def _result(source: bji.Source, output: Any) -> WindowedValue:
    return WindowedValue((source.key, float(output)), source.timestamp, (source.window,))


class DictsOfLists(bji.WorkerDoFn):
    """Column batches (dicts of lists) in; ``(id, total)`` per good row out."""

    def start_bundle(self):
        strategy = bji.PerElement(self.plan, _result, self.metrics)
        self._front = bji.ElementFrontEnd(self.plan, strategy, bji.dead_letter_output)
        self._engine = self._front.engine = self.new_engine(self._front)

    def process(
        self, batch, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam
    ) -> Iterator[Any]:
        ids, xs, name = batch["id"], batch["x"], batch["name"]
        self.metrics.elements_in.inc(len(ids))
        sources = [bji.Source(i, None, timestamp, window, name, r) for r, i in enumerate(ids)]
        if len(xs) != len(ids):
            error = bj.InvalidElementError(
                f"batch {name} has {len(ids)} ids but {len(xs)} rows of x; give one each."
            )
            yield from self._front.reject(error, sources)
            return
        for source, x in zip(sources, xs, strict=True):
            source = source._replace(element=x)
            errors: list[Any] = []
            try:
                item = self._front.validate(source, {"x": np.asarray(x, np.float32)}, errors)
            except ValueError as e:  # not numbers at all
                yield from self._front.reject(e, [source])
                continue
            yield from errors
            if item is not None:
                yield from self._front.add(source, item, window)


def _why(record: bj.FailedElement) -> str:
    # JAX reports a callback's error under its own type; the message keeps the original.
    return "refused" if f"refused value {REFUSED}" in record.message else record.error_type


class RunOnDictsOfLists(beam.PTransform):
    def expand(self, batches):
        dofn = DictsOfLists(total, SPEC, OPTIONS, handle_errors=True)
        outputs = batches | beam.ParDo(dofn).with_outputs(bj.DEAD_LETTERS, main="results")
        return outputs.results, outputs[bj.DEAD_LETTERS]


def test_a_custom_front_end_runs_good_rows_and_dead_letters_each_bad_one():
    batches = [
        {"name": "b0", "id": [0, 1, 2, 3], "x": [[1.0], [1.0, 2.0], [1.0, 2.0, 3.0], [4.0]]},
        # a row too long for the largest bucket, one of strings, one the kernel refuses
        {"name": "b1", "id": [4, 5, 6, 7], "x": [[1.0] * 5, ["a", "b"], [REFUSED], [2.0, 2.0]]},
        {"name": "b2", "id": [8, 9], "x": [[1.0]]},  # malformed: both rows fail
    ]
    p = pipeline()
    results, dead = p | beam.Create(batches) | RunOnDictsOfLists()
    expected = {0: 1.0, 1: 3.0, 2: 6.0, 3: 4.0, 7: 4.0}
    assert_that(results, equal_to(list(expected.items())), label="Results")
    assert_that(
        dead | beam.Map(lambda r: (r.key, r.stage, _why(r), r.source, r.row)),
        equal_to(
            [
                (4, "validation", "ElementTooLargeError", "b1", 0),
                (5, "validation", "ValueError", "b1", 1),
                (6, "kernel", "refused", "b1", 2),
                (8, "validation", "InvalidElementError", "b2", 0),
                (9, "validation", "InvalidElementError", "b2", 1),
            ]
        ),
        label="Dead",
    )
    result = p.run()
    result.wait_until_finish()
    summary = assert_conserved(result)
    assert (summary.elements, summary.results, summary.dead_letters) == (10, 5, 5)
