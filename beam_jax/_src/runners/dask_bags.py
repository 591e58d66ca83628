"""Beam's primitive transforms as Dask bag operations, for beam_jax's ``DaskRunner``.

What differs from Beam's own translation (``apache_beam.runners.dask``, 2.78), and why:

- Every element of every bag is a ``WindowedValue``: Beam's keeps the window and timestamp
  of a ParDo's tagged outputs only, so ``WindowInto`` and windowed groupings came apart.
- A step with several outputs makes one bag of ``(tag, WindowedValue)`` pairs and each
  output's consumers read their own tag; Beam's passes every output to every consumer.
- ``Impulse`` and ``Read`` (of a ``BoundedSource``) have bags; in Beam's they had none
  (``'NoneType' object has no attribute 'map'``). ``WindowInto`` and ``GroupByWindow``
  run as the ParDos they are; Beam's matched classes exactly, so they did nothing.
- Elements group by their keys' deterministic encoding (:func:`_key_coder`), as on other
  runners.
- A ``Reshuffle`` spreads the elements over at least as many partitions as the cluster has
  threads (``Job.spread``); Beam's kept them where they were.
- A side input is computed once in the job's graph and handed to each task that needs it;
  Beam's computed it again inside every task.
- A DoFn is set up once per worker process and step, and kept for the job's next bundles
  there (:func:`run_bundle`); Beam's set one up and tore it down for every task, so
  parameters and compiled programs loaded again for each. The job's end tears them down
  (:func:`teardown_job`, run on every worker).

Each bundle's metrics travel to the client (:mod:`.dask_metrics`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
import cloudpickle
import dask.bag as db
from apache_beam import coders, typehints
from apache_beam.io.iobase import BoundedSource
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.pvalue import PCollection
from apache_beam.runners.common import DoFnRunner, Receiver
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from beam_jax._src.compat.beam import dask_primitives
from beam_jax._src.runners import dask_metrics
from beam_jax._src.runners.dask_refusals import passes_through

_PRIMITIVES = dask_primitives()
_Create, _Read, _Flatten = _PRIMITIVES["Create"], _PRIMITIVES["Read"], _PRIMITIVES["Flatten"]
_GroupByKeyOnly, _Reshuffle = _PRIMITIVES["GroupByKeyOnly"], _PRIMITIVES["Reshuffle"]

__all__ = ["Job", "Step", "Translator", "run_bundle", "teardown_job"]

# Elements per partition of a Create, unless --dask_npartitions or --dask_partition_size say
# otherwise (Beam's DaskRunner's default).
CREATE_PARTITION_SIZE = 128
# A Read splits its source into about this many bundles per thread of the cluster.
READ_BUNDLES_PER_THREAD = 4


@dataclasses.dataclass(frozen=True)
class Job:
    """What the translation of one job needs to know.

    Attributes:
        id: the job's id (names its metrics topic and its DoFns on the workers).
        spread: the fewest partitions a ``Reshuffle`` leaves (the cluster's threads).
        npartitions: ``--dask_npartitions``: partitions of a ``Create``.
        partition_size: ``--dask_partition_size``: elements per partition of a ``Create``.
    """

    id: str
    spread: int = 1
    npartitions: int | None = None
    partition_size: int | None = None

    def __post_init__(self):
        if self.spread < 1:
            raise ValueError(f"spread must be at least 1, got {self.spread}")
        if self.npartitions is not None and self.partition_size is not None:
            raise ValueError(
                f"give --dask_npartitions ({self.npartitions}) or --dask_partition_size "
                f"({self.partition_size}), not both"
            )


class Translator(PipelineVisitor):
    """Builds a Dask bag for every PCollection of a pipeline (``pipeline.visit(...)``, after
    ``pipeline.replace_all(dask_overrides())``); :meth:`sinks` are what to compute."""

    def __init__(self, job: Job):
        self.job = job
        self.bags: dict[PCollection, db.Bag] = {}
        self._consumed: set[PCollection] = set()
        self._steps: list[tuple[AppliedPTransform, db.Bag]] = []

    def visit_transform(self, node: AppliedPTransform) -> None:
        if passes_through(node):
            return
        inputs = [p for p in node.inputs if isinstance(p, PCollection)]
        sides = [si.pvalue for si in node.side_inputs]
        self._consumed.update(inputs, sides)
        bag = self._bag(node, [self.bags[p] for p in inputs], [self.bags[p] for p in sides])
        outputs = dict(node.outputs)
        if isinstance(node.transform, beam.ParDo) and len(outputs) > 1:
            for tag, pcoll in outputs.items():
                self.bags[pcoll] = bag.map_partitions(_select, _receiver_tag(tag, pcoll))
        else:
            for pcoll in outputs.values():
                self.bags[pcoll] = bag
        self._steps.append((node, bag))

    def sinks(self) -> list[db.Bag]:
        """The bag of every step none of whose outputs is read by another step."""
        return [
            bag
            for node, bag in self._steps
            if not any(p in self._consumed for p in node.outputs.values())
        ]

    def _bag(self, node: AppliedPTransform, inputs: list, sides: list) -> db.Bag:
        transform = node.transform
        if isinstance(transform, _Create):
            return _create(transform.values, self.job)
        if isinstance(transform, beam.Impulse):
            return db.from_sequence([GlobalWindows.windowed_value(b"")], npartitions=1)
        if isinstance(transform, _Read):
            return _read(transform.source, self.job)
        if isinstance(transform, _Flatten):
            return db.concat(inputs) if inputs else db.from_sequence([], npartitions=1)
        (bag,) = inputs
        if isinstance(transform, _GroupByKeyOnly):
            (pcoll,) = [p for p in node.inputs if isinstance(p, PCollection)]
            key = functools.partial(_encoded_key, _key_coder(pcoll, node.full_label))
            return bag.groupby(key, shuffle="tasks").map(_grouped)
        if isinstance(transform, _Reshuffle):
            return bag if bag.npartitions >= self.job.spread else bag.repartition(self.job.spread)
        assert isinstance(transform, beam.ParDo), transform  # the launch refused the rest
        step = _step(node, self.job, tagged=len(node.outputs) > 1)
        return _pardo(bag, step, [side.reduction(list, _concat) for side in sides])


def _pardo(bag: db.Bag, step: Step, sides: list[db.Item]) -> db.Bag:
    """``run_bundle`` over each partition of ``bag``, each side input's values (an Item of
    the job's graph, computed once) handed to every task. Built by hand: Dask's
    ``map_partitions`` gives an Item argument a new name at each call, so two steps reading
    one side input computed it (and its producers) twice."""
    name = f"{_task_name(step.label)}-{tokenize(bag.name, step, [s.key for s in sides])}"
    tasks = {
        (name, i): (run_bundle, (bag.name, i), step, *(s.key for s in sides))
        for i in range(bag.npartitions)
    }
    graph = HighLevelGraph.from_collections(name, tasks, dependencies=[bag, *sides])
    return db.Bag(graph, name, bag.npartitions)


def _task_name(label: str) -> str:
    """A step's label as the start of its tasks' names (the dashboard shows them)."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", label.rsplit("/", 1)[-1]).strip("_")[:40] or "step"


def _receiver_tag(tag: Any, pcoll: PCollection) -> Any:
    """The tag a DoFn's receivers know the output by: ``None`` for the main output."""
    return None if pcoll.tag is None else tag


def _create(values: Sequence[Any], job: Job) -> db.Bag:
    items = [GlobalWindows.windowed_value(v) for v in values]
    if not items:
        return db.from_sequence([], npartitions=1)
    if job.npartitions:
        return db.from_sequence(items, npartitions=job.npartitions)
    size = job.partition_size or max(CREATE_PARTITION_SIZE, math.ceil(math.sqrt(len(items)) / 10))
    return db.from_sequence(items, partition_size=size)


def _read(source: BoundedSource, job: Job) -> db.Bag:
    estimate = source.estimate_size() or 0
    desired = max(1 << 20, estimate // (job.spread * READ_BUNDLES_PER_THREAD))
    bundles = list(source.split(desired))
    return db.from_sequence(bundles, npartitions=max(1, len(bundles))).map_partitions(_read_bundles)


def _read_bundles(bundles: Iterable[Any]) -> list[WindowedValue]:
    out = []
    for bundle in bundles:
        source = bundle.source
        tracker = source.get_range_tracker(bundle.start_position, bundle.stop_position)
        out.extend(GlobalWindows.windowed_value(v) for v in source.read(tracker))
    return out


def _key_coder(pcoll: PCollection, label: str) -> coders.Coder:
    """The deterministic coder of ``pcoll``'s keys: elements group by their keys' encoding,
    as on every Beam runner (Python's equality and Dask's hashing would group ``1`` and
    ``np.int64(1)`` apart or together by accident)."""
    key_type, _ = typehints.trivial_inference.key_value_types(pcoll.element_type)
    return coders.registry.get_coder(key_type).as_deterministic_coder(label)


def _encoded_key(coder: coders.Coder, element: WindowedValue) -> bytes:
    return coder.encode(element.value[0])


def _grouped(group: tuple[bytes, list[WindowedValue]]) -> WindowedValue:
    # ReifyWindows made each value a WindowedValue; GroupAlsoByWindow (a ParDo) sorts them
    # into windows, as in Beam's DirectRunner.
    _, elements = group
    key = elements[0].value[0]
    return GlobalWindows.windowed_value((key, [e.value[1] for e in elements]))


def _concat(parts: Iterable[list]) -> list:
    return list(itertools.chain.from_iterable(parts))


def _select(pairs: Iterable[tuple[Any, WindowedValue]], tag: Any) -> list[WindowedValue]:
    return [value for t, value in pairs if t == tag]


@dataclasses.dataclass(frozen=True)
class Step:
    """One ParDo of a job, as its tasks carry it.

    Attributes:
        job: the job's id.
        label: the step's full label (its metrics' step name; names it in errors).
        payload: ``cloudpickle`` of the DoFn, its arguments, the input's windowing and its
            side inputs' views; unpickled only where the worker has no idle instance.
        tagged: the step has several outputs: its bag holds ``(tag, value)`` pairs.
    """

    job: str
    label: str
    payload: bytes
    tagged: bool


def _step(node: AppliedPTransform, job: Job, tagged: bool) -> Step:
    transform = node.transform
    (main,) = node.main_inputs.values()
    views = [(type(si), si._view_options()) for si in node.side_inputs]
    payload = cloudpickle.dumps(
        (transform.fn, transform.args, transform.kwargs, _windowing(main), views)
    )
    return Step(job.id, node.full_label, payload, tagged)


def _windowing(pcoll: PCollection) -> beam.Windowing:
    # Beam's Dask override of Read (_Read) has no windowing of its own: it would ask its
    # input, the pipeline's start. A bounded read's elements are in the global window.
    if isinstance(pcoll.producer.transform, _Read):
        return beam.Windowing(GlobalWindows())
    return pcoll.windowing


class _Receivers(dict):
    """The DoFn's outputs in one list: values, or ``(tag, value)`` pairs for a tagged step."""

    def __init__(self, outputs: list, tagged: bool):
        super().__init__()
        self._outputs = outputs
        self._tagged = tagged

    def __missing__(self, tag):
        receiver = self[tag] = _Receiver(self._outputs, tag if self._tagged else _UNTAGGED)
        return receiver


_UNTAGGED = object()


class _Receiver(Receiver):
    def __init__(self, outputs: list, tag: Any):
        self._outputs = outputs
        self._tag = tag

    def receive(self, windowed_value: WindowedValue) -> None:
        if self._tag is _UNTAGGED:
            self._outputs.append(windowed_value)
        else:
            self._outputs.append((self._tag, windowed_value))


class _Instance:
    """A DoFn set up in this process for one step of one job, and where its outputs go."""

    def __init__(self, step: Step, side_values: Sequence[list]):
        fn, args, kwargs, windowing, views = cloudpickle.loads(step.payload)
        sides = [
            SideInputMap(view, options, values)
            for (view, options), values in zip(views, side_values, strict=True)
        ]
        self.outputs: list = []
        self.runner = DoFnRunner(
            fn, args, kwargs, sides, windowing,
            tagged_receivers=_Receivers(self.outputs, step.tagged), step_name=step.label,
        )  # fmt: skip
        self.runner.setup()


# Idle DoFn instances of this process, per (job, step label): a task takes one (or sets up
# a new one) and gives it back when its bundle has succeeded, so tasks running at once on
# several threads never share one, and the next bundle finds it set up.
_IDLE: dict[tuple[str, str], list[_Instance]] = {}
_ENDED: set[str] = set()  # jobs torn down here: an instance given back later is torn down
_IDLE_LOCK = threading.Lock()


def _take(step: Step, side_values: Sequence[list]) -> _Instance:
    with _IDLE_LOCK:
        idle = _IDLE.get((step.job, step.label))
        if idle:
            return idle.pop()
    return _Instance(step, side_values)


def _give_back(step: Step, instance: _Instance) -> None:
    with _IDLE_LOCK:
        if step.job not in _ENDED:
            _IDLE.setdefault((step.job, step.label), []).append(instance)
            return
    instance.runner.teardown()  # a task of a job that failed elsewhere, ending late


def run_bundle(elements: Iterable[WindowedValue], step: Step, *side_values: list) -> list:
    """Runs one partition through the step's DoFn as one bundle; returns its outputs.

    A DoFn whose bundle failed is torn down and not used again, as Beam's SDK harness does.
    """
    with dask_metrics.counting(step.label) as container:
        instance = _take(step, side_values)
        try:
            instance.runner.start()
            for element in elements:
                instance.runner.process(element)
            instance.runner.finish()
            instance.runner.finalize()
        except BaseException:
            instance.outputs.clear()
            _quietly_teardown(instance)
            raise
    outputs = list(instance.outputs)
    instance.outputs.clear()
    dask_metrics.send(step.job, step.label, container)
    _give_back(step, instance)
    return outputs


def _quietly_teardown(instance: _Instance) -> None:
    try:
        instance.runner.teardown()
    except Exception:  # noqa: BLE001 - the bundle's own error is the one to raise
        pass


def teardown_job(job: str) -> int:
    """Tears down every DoFn this process keeps for ``job``; returns how many
    (``client.run(teardown_job, job)`` runs it on every worker when the job ends)."""
    with _IDLE_LOCK:
        _ENDED.add(job)
        keys = [k for k in _IDLE if k[0] == job]
        instances = [i for k in keys for i in _IDLE.pop(k)]
    for instance in instances:
        instance.runner.teardown()
    return len(instances)
