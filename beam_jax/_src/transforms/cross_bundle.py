"""Cross-bundle batching: elements keyed by (bucket, shard), buffered in Beam state per key
and window, and run by the batch engine when a batch is full, has waited long enough, or its
window ends.

Two steps replace the front end's one ``ParDo``:

1. ``_KeyByBucket`` validates each element as bundle mode does, picks its bucket and a shard
   round-robin, and encodes it with ``core/tree_codec`` (no pickle), so an element that
   cannot be stored is a dead letter here, not a failure inside the runner.
2. ``CrossBundleDoFn``, the stateful DoFn (bundle mode's ``ElementFrontEnd`` and
   ``Outputs``), adds elements to ``BagState`` with a processing-time timer at a buffer's
   first element and an event-time timer at the window's end; a flush hands the rows to
   ``ElementFrontEnd.run_now``, which runs them as one batch, landing inside the callback.

State is per key *and window*, so a batch never mixes windows. ``_CountPerKey`` sends each
key its element count per window; the window's last batch runs when the count is met, inside
``process``, so no result is late even where timers hold no watermark.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam import typehints
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import trigger
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import Timestamp

from beam_jax._src.core.dead_letter import DEAD_LETTERS, VALIDATION
from beam_jax._src.core.tree_codec import decode_tree, encode_tree
from beam_jax._src.engine.cross_bundle import CrossBundle
from beam_jax._src.engine.elements import validate_element
from beam_jax._src.engine.metrics import BufferMetrics, KernelMetrics
from beam_jax._src.engine.options import make_plan
from beam_jax._src.transforms.base import Source, dead_letter_output
from beam_jax._src.transforms.elements import ElementsDoFn


class BufferedElement(NamedTuple):
    """One element as it waits in Beam state, or a window's element count for its key.

    Attributes:
        payload: ``encode_tree((key, value))`` of the element as it entered the transform;
            empty for a count.
        timestamp_micros: its event timestamp.
        arrival: processing time (seconds) it entered its buffer; 0 before that.
        count: for a count (``payload`` empty): how many more elements this key received in
            this window (one pane of ``_CountPerKey``); 0 for an element.
    """

    payload: bytes
    timestamp_micros: int
    arrival: float
    count: int = 0


class BufferedElementCoder(beam.coders.Coder):
    """Encodes ``BufferedElement`` without pickle (registered when beam_jax is imported)."""

    def encode(self, value: BufferedElement) -> bytes:
        return encode_tree(tuple(value))

    def decode(self, encoded: bytes) -> BufferedElement:
        return BufferedElement(*decode_tree(encoded))

    def estimate_size(self, value: BufferedElement) -> int:
        return len(value.payload) + 32

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return BufferedElement

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


beam.coders.registry.register_coder(BufferedElement, BufferedElementCoder)

# Keys are (bucket index, shard): a tuple of ints, encoded by Beam's deterministic
# TupleCoder(VarIntCoder, VarIntCoder), as stateful ParDos require.
KEYED = typehints.KV[typehints.Tuple[int, int], BufferedElement]


class _KeyByBucket(beam.DoFn):
    """Validate, choose ``(bucket, shard)`` and encode each element (step 1)."""

    def __init__(self, spec, options, handle_errors: bool, keyed: bool, config: CrossBundle):
        self._spec = spec
        self._options = options
        self._handle_errors = handle_errors
        self._keyed = keyed
        self._shards = config.shards

    def setup(self):
        # Bucket assignment does not depend on the device count (only batch sizes do).
        self._plan = make_plan(self._spec, self._options)
        self._index = {b: i for i, b in enumerate(self._plan.buckets)}
        self._metrics = KernelMetrics(self._options.metrics_namespace)
        self._sent: collections.Counter[int] = collections.Counter()

    def process(
        self, element, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam
    ) -> Iterator[Any]:
        self._metrics.elements_in.inc()
        key, value, item, error = validate_element(self._plan, element, self._keyed)
        if error is None:
            try:
                payload = encode_tree((key, value))
            except TypeError as e:  # an element state cannot hold: dead-lettered here
                error = e
        if error is not None:
            if not self._handle_errors:
                raise error
            self._metrics.dead_letter(VALIDATION)
            yield dead_letter_output(error, VALIDATION, Source(key, value, timestamp, window))
            return
        index = self._index[self._plan.bucket_for(item.lengths)]
        shard = self._sent[index] % self._shards
        self._sent[index] += 1
        yield (index, shard), BufferedElement(payload, timestamp.micros, 0.0)


BUFFER = BagStateSpec("buffer", BufferedElementCoder())
COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())
# Elements this key received in this window, and how many its window counts announced:
# equal means every element of the window (so far) reached this key, whatever the order in
# which the runner delivers elements and counts.
SEEN = ReadModifyWriteStateSpec("seen", VarIntCoder())
EXPECTED = ReadModifyWriteStateSpec("expected", VarIntCoder())
MAX_WAIT = TimerSpec("max_wait", TimeDomain.REAL_TIME)
WINDOW_END = TimerSpec("window_end", TimeDomain.WATERMARK)
_BUFFER, _COUNT = beam.DoFn.StateParam(BUFFER), beam.DoFn.StateParam(COUNT)
_SEEN, _EXPECTED = beam.DoFn.StateParam(SEEN), beam.DoFn.StateParam(EXPECTED)
_MAX_WAIT, _WINDOW_END = beam.DoFn.TimerParam(MAX_WAIT), beam.DoFn.TimerParam(WINDOW_END)


class CrossBundleDoFn(ElementsDoFn):
    """The stateful step (step 2): ``ElementsDoFn``'s front end and strategy, with elements
    buffered in Beam state until a flush."""

    cross_bundle: CrossBundle  # set by ``buffered_outputs``

    def setup(self):
        super().setup()
        self._buffer_metrics = BufferMetrics(self._options.metrics_namespace)

    def process(
        self,
        element,
        window=beam.DoFn.WindowParam,
        buffer=_BUFFER,
        count=_COUNT,
        seen=_SEEN,
        expected=_EXPECTED,
        max_wait=_MAX_WAIT,
        window_end=_WINDOW_END,
    ) -> Iterator[Any]:
        self.open_bundle_once()
        (index, _), stored = element
        held = count.read() or 0
        if stored.payload:
            now = self.cross_bundle.clock()
            if not held:
                max_wait.set(Timestamp.of(now + self.cross_bundle.max_wait_s))
                window_end.set(window.max_timestamp())
            buffer.add(stored._replace(arrival=now))
            held += 1
            count.write(held)
            seen.write((seen.read() or 0) + 1)
            bucket = self._plan.buckets[index]
            if held >= self._plan.records_per_flush(bucket, self._worker.limit(bucket)):
                yield from self._flush_state(index, window, buffer, count, max_wait, "full")
                return
        else:  # one pane of this key's element count for the window
            expected.write((expected.read() or 0) + stored.count)
        if held and seen.read() == expected.read():
            # Every element the window's counts announced is here: flush now, inside
            # ``process``, while the pending count holds this step's watermark below the
            # window's end, so results are on time downstream even on a runner whose
            # timers hold no watermark (the Python direct runner).
            yield from self._flush_state(index, window, buffer, count, max_wait, "window_end")

    @on_timer(MAX_WAIT)
    def _on_max_wait(
        self,
        key=beam.DoFn.KeyParam,
        window=beam.DoFn.WindowParam,
        buffer=_BUFFER,
        count=_COUNT,
        max_wait=_MAX_WAIT,
    ) -> Iterator[Any]:
        yield from self._flush_state(key[0], window, buffer, count, max_wait, "timer")

    @on_timer(WINDOW_END)
    def _on_window_end(
        self,
        key=beam.DoFn.KeyParam,
        window=beam.DoFn.WindowParam,
        buffer=_BUFFER,
        count=_COUNT,
        max_wait=_MAX_WAIT,
    ) -> Iterator[Any]:
        yield from self._flush_state(key[0], window, buffer, count, max_wait, "window_end")

    def _flush_state(self, index, window, buffer, count, max_wait, cause) -> Iterator[Any]:
        """Read and clear one key's buffer, then launch its rows as one batch."""
        self.open_bundle_once()  # a timer's bundle may have no element
        stored = list(buffer.read())
        buffer.clear()
        count.clear()
        # The processing-time timer is not cleared: a stale firing finds an empty buffer and
        # does nothing, and the next buffer's first element sets it anew (a set replaces).
        # Prism (2.77) fires a cleared processing-time timer at once, which clearing it here,
        # in its own callback, turned into an endless loop of empty firings.
        if not stored:
            return
        now = self.cross_bundle.clock()
        self._buffer_metrics.flushed(
            cause, [max(0, round((now - s.arrival) * 1000)) for s in stored]
        )
        tagged = []
        for s in stored:
            key, value = decode_tree(s.payload)
            tagged.append((Source(key, value, Timestamp(micros=s.timestamp_micros), window), value))
        # Every batch lands before the callback returns: results of a timer firing come out
        # of that firing (the direct runner drops a timer bundle's finish_bundle outputs
        # once the watermark has passed), and every runner handles that alike.
        yield from self._front.run_now(self._plan.buckets[index], window, tagged)


def _count_to_row(kv, timestamp=beam.DoFn.TimestampParam):
    key, count = kv
    yield key, BufferedElement(b"", timestamp.micros, 0.0, count)


class _CountPerKey(beam.PTransform):
    """Each key's element count per window, as rows for the stateful step (one per pane).

    The counts fire when the watermark passes the window's end (and once more per late
    element within the allowed lateness), in discarding mode, so each pane is an increment.
    They reach the stateful step as rows timestamped at the window's end, which hold its
    input watermark until it has taken them: the window's last batch then runs in
    ``process``, not in a timer that fires after the watermark has already moved on.
    """

    def __init__(self, windowing):
        super().__init__()
        self._windowing = windowing

    def expand(self, keyed):
        w = self._windowing
        return (
            keyed
            | "One"
            >> beam.Map(lambda kv: (kv[0], 1)).with_output_types(
                typehints.KV[typehints.Tuple[int, int], int]
            )
            | "EveryPane"
            >> beam.WindowInto(
                w.windowfn,
                trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING,
                allowed_lateness=w.allowed_lateness,
            )  # fmt: skip
            | "Sum" >> beam.CombinePerKey(sum)
            | "AsRows" >> beam.ParDo(_count_to_row).with_output_types(KEYED)
            | "Rewindow"
            >> beam.WindowInto(
                w.windowfn,
                trigger=w.triggerfn,
                accumulation_mode=w.accumulation_mode,
                timestamp_combiner=w.timestamp_combiner,
                allowed_lateness=w.allowed_lateness,
            )  # fmt: skip
        )


def buffered_outputs(
    pcoll, front: Any, config: CrossBundle, *, spec, options, handle_errors, keyed, main: str
):
    """Apply cross-bundle batching: ``(main outputs, dead letters)``.

    Args:
        front: the stateful DoFn (a ``CrossBundleDoFn``).
        main: the tag of the front end's main output.
    """
    front.cross_bundle = config
    keyed_out = pcoll | "KeyByBucket" >> beam.ParDo(
        _KeyByBucket(spec, options, handle_errors, keyed, config)
    ).with_output_types(KEYED).with_outputs(DEAD_LETTERS, main="keyed")
    counts = keyed_out.keyed | "CountPerKey" >> _CountPerKey(pcoll.windowing)
    rows = (keyed_out.keyed, counts) | "WithCounts" >> beam.Flatten()
    outputs = rows | "RunBatches" >> beam.ParDo(front).with_outputs(DEAD_LETTERS, main=main)
    dead = (keyed_out[DEAD_LETTERS], outputs[DEAD_LETTERS]) | "DeadLetters" >> beam.Flatten()
    return outputs[main], dead
