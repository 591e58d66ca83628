"""JaxModelHandler's one-call path gives exactly the engine's results, failures and metrics."""

from __future__ import annotations

import collections
import hashlib

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import RunInference
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax._src.engine import metrics as metrics_module
from beam_jax._src.engine.metrics import KernelMetrics
from beam_jax._src.inference.one_call import run_in_one_call
from tests.beam_helpers import pipeline, run
from tests.kernels import SENTINEL, D, attention_params, failing_mean, masked_attention_pool

SPEC = {"x": bj.ArraySpec(("L", D), np.float32)}
BUCKETING = bj.Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8)
# Metrics whose values are times: their updates are counted, their values not compared.
TIMED = ("result_wait_us", "batch_latency_ms", "compile_ms", "compile_wait_ms")
ONE_CALLS: list[bool] = []  # per batch of a _Counting handler: whether its one call ran it


def _engine_only(worker, metrics, batch):
    return None


class EngineOnly(bj.JaxModelHandler):
    """The handler with every batch run through the engine (no one-call path)."""

    _one_call = staticmethod(_engine_only)


def _counting(worker, metrics, batch):
    results = run_in_one_call(worker, metrics, batch)
    ONE_CALLS.append(results is not None)
    return results


class _Counting(bj.JaxModelHandler):
    """The handler as it is, noting which batches its one-call path ran."""

    _one_call = staticmethod(_counting)


def log_first_row(params, element, lengths):
    """NaN for an element whose first row holds a negative value (the finiteness check)."""
    return jnp.log(element["x"][0]) * params


def total(params, element, lengths):
    """One scalar per element (outputs without a trailing axis)."""
    return jnp.sum(element["x"]) * params


def _x(length: int, value: float = 1.0, width: int = D) -> dict:
    return {"x": np.full((length, width), value, np.float32)}


def _random_x(rng, length: int) -> dict:
    return {"x": rng.uniform(0.5, 2.0, (length, D)).astype(np.float32)}


def _batches(rng, kernel: str) -> list[list[dict]]:
    """Beam-like batches: most of one bucket, the rest each with something the one call
    leaves to the engine (the kernel decides which failures it can have)."""
    kinds = ["one_bucket", "full", "single", "mixed", "bad_width", "too_long", "over_limit"]
    kinds += {"failing": ["kernel_error"], "log": ["nonfinite"]}.get(kernel, [])
    batches = []
    for kind in [*kinds, *rng.choice(kinds, 10)]:
        n = {"full": 8, "single": 1, "over_limit": 13}.get(kind, int(rng.integers(2, 8)))
        low, high = [(1, 4), (5, 8), (9, 16)][int(rng.integers(0, 3))]
        if kind == "mixed":
            low, high = 1, 16
        batch = [_random_x(rng, int(rng.integers(low, high + 1))) for _ in range(n)]
        where = int(rng.integers(0, n))
        if kind == "bad_width":
            batch[where] = _x(3, width=D + 1)
        elif kind == "too_long":
            batch[where] = _x(40)
        elif kind == "kernel_error":
            batch[where] = _x(len(batch[where]["x"]), SENTINEL)
        elif kind == "nonfinite":
            batch[where] = _x(len(batch[where]["x"]), -1.0)
        batches.append(batch)
    return batches


KERNELS = {
    "attention": dict(fn=masked_attention_pool, load_params=attention_params),
    "failing": dict(
        fn=failing_mean,
        load_params=lambda: np.float32(2.0),
        output_spec={"mean": bj.ArraySpec((D,)), "scaled": bj.ArraySpec(("L", D))},
    ),
    "log": dict(
        fn=log_first_row,
        load_params=lambda: np.float32(1.0),
        validation=bj.Validation(check_outputs_finite=True),
    ),
    "total": dict(fn=total, load_params=lambda: np.float32(3.0)),
}


class _Recorder:
    """Stands in for Beam's ``Metrics`` in ``engine/metrics.py``: notes every update."""

    def __init__(self):
        self.updates: dict[tuple[str, str], list] = collections.defaultdict(list)

    def counter(self, namespace: str, name: str):
        return _Updates(self.updates[namespace, name])

    distribution = counter

    def compared(self) -> dict:
        """Every metric updated: its updates in order (times: how many)."""
        return {
            key: len(values) if key[1].endswith(TIMED) else values
            for key, values in self.updates.items()
            if values
        }


class _Updates:
    def __init__(self, values: list):
        self._values = values

    def inc(self, n: int = 1) -> None:
        self._values.append(int(n))

    def update(self, value) -> None:
        self._values.append(int(value))


def _outcomes(handler, batches, recorder, monkeypatch) -> list:
    """Each batch's results (as plain values) or its failures, with ``recorder`` as Beam's
    metrics."""
    monkeypatch.setattr(metrics_module, "Metrics", recorder)
    model = handler.load_model()
    outcomes = []
    for batch in batches:
        try:
            results = handler.run_inference(batch, model)
        except bj.InferenceBatchError as e:
            failures = [(f.key, f.stage, f.error_type, f.message) for f in e.failures]
            outcomes.append(("failed", str(e), failures))
        else:
            outcomes.append(("ok", [_plain(r.inference) for r in results]))
            assert all(r.example is x for r, x in zip(results, batch, strict=True))
    return outcomes


def _plain(tree):
    """A pytree as nested (structure, shape, dtype, bytes): equality means exactly equal."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return str(treedef), [(x.shape, str(x.dtype), np.asarray(x).tobytes()) for x in leaves]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_the_one_call_path_gives_the_engines_results_failures_and_metrics(
    kernel, seed, monkeypatch
):
    batches = _batches(np.random.default_rng(seed), kernel)
    options = dict(KERNELS[kernel])
    fn = options.pop("fn")
    kwargs = dict(spec=SPEC, bucketing=BUCKETING, max_batch_duration_secs=None, **options)
    ONE_CALLS.clear()
    fast, engine = _Recorder(), _Recorder()
    got = _outcomes(_Counting(fn, **kwargs), batches, fast, monkeypatch)
    want = _outcomes(EngineOnly(fn, **kwargs), batches, engine, monkeypatch)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"batch {i} ({len(batches[i])} elements) differs"
    assert fast.compared() == engine.compared()
    # Not vacuous: the usual batches took the one call, the others the engine.
    assert sum(ONE_CALLS) >= 3 and not all(ONE_CALLS)
    assert any(outcome[0] == "failed" for outcome in want)


def test_a_batch_the_one_call_leaves_to_the_engine_touches_no_metric(monkeypatch):
    handler = bj.JaxModelHandler(
        failing_mean, spec=SPEC, bucketing=BUCKETING, load_params=lambda: np.float32(2.0)
    )
    recorder = _Recorder()
    monkeypatch.setattr(metrics_module, "Metrics", recorder)
    worker, metrics = handler.load_model(), KernelMetrics()
    good = [_x(3, i) for i in range(5)]
    assert run_in_one_call(worker, metrics, good) is None  # its shape is not compiled yet
    assert not recorder.compared()
    handler.run_inference(good, worker)  # the engine compiles it (the handler's metrics)
    recorder.updates.clear()
    metrics = KernelMetrics()
    for batch in (
        [*good[:4], _x(3, SENTINEL)],  # the call raises
        [*good[:4], _x(6)],  # two buckets
        [*good[:4], _x(3, width=D + 1)],  # a refused element
        [_x(3)] * 9,  # more than the bucket's batch
    ):
        assert run_in_one_call(worker, metrics, batch) is None
    assert not recorder.compared()
    results = run_in_one_call(worker, metrics, good)
    np.testing.assert_array_equal([r["mean"][0] for r in results], [2.0 * i for i in range(5)])
    assert recorder.compared()[metrics_module.NAMESPACE, "kernel_calls"] == [1]


def _examples() -> list[dict]:
    """Examples for Beam batches of 8: one bucket (its shape compiles); one bucket and an
    element of the wrong width (index 3 of its batch); one bucket again (the one call);
    elements of two buckets."""
    rng = np.random.default_rng(5)
    examples = [_random_x(rng, int(rng.integers(1, 5))) for _ in range(28)]
    examples[11] = _x(3, width=D + 1)
    examples[26] = _random_x(rng, 7)
    return examples


def _handler(handler_type):
    return handler_type(
        masked_attention_pool,
        spec=SPEC,
        bucketing=BUCKETING,
        load_params=attention_params,
        max_batch_duration_secs=None,
    )


def _engine_metrics(result) -> dict:
    """The engine's metrics of a finished pipeline, times as their number of updates."""
    metrics = result.metrics().query(MetricsFilter().with_namespace(metrics_module.NAMESPACE))
    counters = {m.key.metric.name: m.committed for m in metrics["counters"]}
    distributions = {m.key.metric.name: m.committed for m in metrics["distributions"]}
    return {
        **{k: v for k, v in counters.items() if not k.endswith(TIMED)},
        **{k: v.count if k.endswith(TIMED) else v for k, v in distributions.items()},
    }


def _digest(array) -> str:
    return hashlib.sha1(np.asarray(array).tobytes()).hexdigest()[:12]


def _result_pair(result) -> tuple[str, str]:
    """The example and its result, each by a digest of its bytes (equal: exactly equal)."""
    return _digest(result.example["x"]), _digest(result.inference)


def _dead_letter(record) -> tuple:
    return record.key, record.stage, record.error_type, "elements [3] failed" in record.message


def test_runinference_with_good_and_bad_elements_equals_the_engine_path():
    examples = _examples()
    # What the engine alone gives Beam's batches of 8, 8, 8 and 4 (the second one fails).
    reference = _handler(EngineOnly)
    model = reference.load_model()
    expected = [
        _result_pair(r)
        for batch in (examples[:8], examples[16:24], examples[24:])
        for r in reference.run_inference(batch, model)
    ]
    with pytest.raises(bj.InferenceBatchError, match=r"elements \[3\] failed"):
        reference.run_inference(examples[8:16], model)
    dead_letters = [(i, bj.Stage.INFERENCE, "InferenceBatchError", True) for i in range(8)]
    metrics = {}
    ONE_CALLS.clear()
    for handler_type in (_Counting, EngineOnly):
        p = pipeline()
        inputs = p | beam.Create(examples, reshuffle=False)
        main, other = inputs | RunInference(_handler(handler_type)).with_exception_handling()
        assert_that(main | beam.Map(_result_pair), equal_to(expected), label="Results")
        dead = other.failed_inferences | bj.FailedInferences() | beam.Map(_dead_letter)
        assert_that(dead, equal_to(dead_letters), label="DeadLetters")
        metrics[handler_type] = _engine_metrics(run(p))
    assert metrics[_Counting] == metrics[EngineOnly]
    assert metrics[EngineOnly]["elements_in"] == 28 and metrics[EngineOnly]["results"] == 20
    assert metrics[EngineOnly]["dead_letters_validation"] == 1
    # The runner runs bundles in this process: the third batch took the one call.
    assert ONE_CALLS == [False, False, True, False]


JaxModelHandlerAsIs = bj.JaxModelHandler
