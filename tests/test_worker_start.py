"""Starts that do not wait for the device: host work goes on while the worker is built.

Building a kernel transform's worker (opening the devices, ``load_params``, placing the
parameters, starting the compiles) runs on a background thread; reading and tokenizing go
on meanwhile, and only a batch that must run waits for it. Each test's ``load_params``
waits for an event that the pipeline's host work sets: with a start that blocked the
pipeline, the event would never be set before the loader gave up (no timing is measured,
only the order of what happened).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
import threading
import uuid

import apache_beam as beam
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax.text import EmbedText, SentenceEncoder
from tests.beam_helpers import pipeline, run
from tests.tiny_bert import sample_texts, write_tiny_bert

# Per test: what happened, in order, and the event the host work sets (module globals: the
# FnApiRunner runs the pipeline in this process, and Beam pickles these by reference).
EVENTS: dict[str, list[str]] = {}
HOST_WORK: dict[str, threading.Event] = {}
LOAD_ENDED: dict[str, threading.Event] = {}
WAIT_S = 120  # how long a loader waits for the host work before giving up (a busy machine)


def _new() -> str:
    key = uuid.uuid4().hex
    EVENTS[key], HOST_WORK[key], LOAD_ENDED[key] = [], threading.Event(), threading.Event()
    return key


def _host_work(key: str, what: str) -> None:
    EVENTS[key].append(what)
    HOST_WORK[key].set()


class WaitingLoader:
    """``load_params`` that waits until the pipeline's host work has begun (or gives up)."""

    def __init__(self, key: str, params, fail: bool = False):
        self.key, self.params, self.fail = key, params, fail

    def __call__(self):
        EVENTS[self.key].append("load started")
        try:
            seen = HOST_WORK[self.key].wait(WAIT_S)
            EVENTS[self.key].append("load finished" if seen else "load gave up waiting")
        finally:
            LOAD_ENDED[self.key].set()
        if self.fail:
            raise ValueError(f"no weights for {self.key}")
        return self.params


def _mark_read(x, key):
    _host_work(key, "element read")
    return x


def _scaled_sum(params, element, lengths):
    mask = bj.length_mask(lengths["L"], element.shape[0])
    return params * jnp.where(mask, element, jnp.float32(0)).sum()


def _run_kernel(loader, **kw):
    return bj.RunKernel(
        _scaled_sum,
        spec=bj.ArraySpec(("L",), np.float32),
        bucketing=bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=4),
        load_params=loader,
        **kw,
    )


def test_elements_are_read_while_the_worker_loads_its_parameters():
    key = _new()
    values = [np.ones(n, np.float32) for n in range(1, 9)]
    p = pipeline()
    out = (
        p
        | beam.Create(values, reshuffle=False)  # fused with the kernel: one stage
        | beam.Map(_mark_read, key)
        | _run_kernel(WaitingLoader(key, np.float32(2.0)))
        | beam.Map(float)
    )
    assert_that(out, equal_to([2.0 * n for n in range(1, 9)]))
    run(p)
    events = EVENTS[key]
    assert "load finished" in events, events
    assert events.index("element read") < events.index("load finished"), events


@dataclasses.dataclass(frozen=True)
class _WaitingEncoder(SentenceEncoder):
    """A SentenceEncoder whose weights load only once a text has been tokenized."""

    key: str = ""

    def load_params(self):
        return WaitingLoader(self.key, None)() or super().load_params()

    def tokenizer(self):
        outer, key = super().tokenizer(), self.key

        class Marking:
            def encode_arrow(self, texts):
                encoded = outer.encode_arrow(texts)
                _host_work(key, "texts tokenized")
                return encoded

        return Marking()


def test_texts_are_tokenized_while_the_encoder_loads_its_weights(tmp_path):
    key = _new()
    model = SentenceEncoder.from_dir(write_tiny_bert(tmp_path / "model", pooling="mean"))
    encoder = _WaitingEncoder(**dataclasses.asdict(model) | {"config": model.config}, key=key)
    texts = sample_texts(12)
    batch = pa.record_batch({"id": list(range(12)), "text": texts})
    p = pipeline()
    vectors, failed = (
        p
        | beam.Create([batch], reshuffle=False)
        | EmbedText(
            encoder,
            batching=bj.Bucketing(boundaries={"L": (16, 32)}, batch_size=8),
        )
    )
    ids = vectors | beam.FlatMap(lambda b: b.column("id").to_pylist())
    assert_that(ids, equal_to(list(range(12))))
    assert_that(failed, equal_to([]), label="NoDeadLetters")
    run(p)
    events = EVENTS[key]
    assert events.index("texts tokenized") < events.index("load finished"), events


def test_start_worker_here_returns_before_the_parameters_load():
    key = _new()
    transform = _run_kernel(WaitingLoader(key, np.float32(3.0)))
    transform.start_worker_here()
    try:
        _host_work(key, "start_worker_here returned")  # the loader was still waiting
        p = pipeline()
        out = p | beam.Create([np.ones(3, np.float32)]) | transform | beam.Map(float)
        assert_that(out, equal_to([9.0]))
        run(p)
    finally:
        transform.forget_worker_here()
    events = EVENTS[key]
    assert "load gave up waiting" not in events, events
    assert events.index("start_worker_here returned") < events.index("load finished"), events


@pytest.mark.parametrize("started_here", [False, True])
def test_an_error_building_the_worker_fails_the_job_with_it(started_here):
    key = _new()
    HOST_WORK[key].set()  # nothing to wait for: the loader fails at once
    transform = _run_kernel(WaitingLoader(key, None, fail=True))
    p = pipeline()
    _ = p | beam.Create([np.ones(3, np.float32)]) | transform
    if started_here:
        transform.start_worker_here()
    try:
        with pytest.raises(Exception, match=f"no weights for {key}"):
            run(p)
    finally:
        transform.forget_worker_here()


def test_a_bundle_without_elements_does_not_wait_for_the_worker():
    key = _new()
    p = pipeline()
    nothing = p | beam.Create([np.ones(2, np.float32)]) | beam.Filter(lambda x: False)
    out = nothing | _run_kernel(WaitingLoader(key, np.float32(1.0)))
    assert_that(out, equal_to([]))
    run(p)
    _host_work(key, "pipeline finished")  # only now may the loader finish
    assert LOAD_ENDED[key].wait(WAIT_S)  # the loader's thread records its end
    events = EVENTS[key]
    assert events.index("pipeline finished") < events.index("load finished"), events


_FAILS_WHILE_THE_WORKER_BUILDS = """
import atexit, pathlib, sys, threading
import apache_beam as beam
import jax.numpy as jnp
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
import beam_jax as bj
from beam_jax._src.engine import worker
from beam_jax._src.kernel.compiled import Kernel

out, hang = pathlib.Path(sys.argv[1]), sys.argv[2] == "hang"
worker.EXIT_WAIT_SECONDS = 2 if hang else 300
precompile = Kernel.precompile
exiting = threading.Event()
atexit.register(exiting.set)  # registered after beam_jax's own: runs before it

def recorded(self, *args, background=False, **kw):
    if background:
        (out / "compiled in the background").touch()
    return precompile(self, *args, background=background, **kw)

Kernel.precompile = recorded

def load_params():
    (out / "load started").touch()
    if hang:
        threading.Event().wait()  # never returns
    # Returns once the job has failed and the interpreter has begun to exit.
    if exiting.wait(300):
        (out / "parameters loaded").touch()
    return np.float32(2.0)

def scaled_sum(params, element, lengths):
    mask = bj.length_mask(lengths["L"], element.shape[0])
    return params * jnp.where(mask, element, jnp.float32(0)).sum()

def broken(x):
    raise RuntimeError("the reader broke (simulated)")

transform = bj.RunKernel(
    scaled_sum,
    spec=bj.ArraySpec(("L",), np.float32),
    bucketing=bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=4),
    load_params=load_params,
    precompile=True,
)
transform.start_worker_here()
p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
_ = p | beam.Create([np.ones(3, np.float32)]) | beam.Map(broken) | transform
p.run().wait_until_finish()
"""


def _fail_while_the_worker_builds(tmp_path, mode: str) -> subprocess.CompletedProcess:
    root = pathlib.Path(__file__).resolve().parent.parent
    return subprocess.run(
        [sys.executable, "-c", _FAILS_WHILE_THE_WORKER_BUILDS, str(tmp_path), mode],
        env=dict(os.environ, PYTHONPATH=str(root), JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_job_failing_while_its_worker_builds_exits_with_its_error_after_the_build(tmp_path):
    # The worker's thread is inside load_params (then XLA) as the interpreter exits: exit
    # waits for it (a daemon thread cut off inside XLA aborted the process), and the
    # compiles the finished build then starts compile nothing.
    proc = _fail_while_the_worker_builds(tmp_path, "wait")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "the reader broke (simulated)" in proc.stderr
    assert "terminate called" not in proc.stderr
    assert (tmp_path / "parameters loaded").exists(), "exit did not wait for the build"
    assert not (tmp_path / "compiled in the background").exists(), "compiled during exit"
    assert "exits without waiting longer" not in proc.stderr


def test_a_load_params_that_never_returns_cannot_keep_the_process_from_exiting(tmp_path):
    proc = _fail_while_the_worker_builds(tmp_path, "hang")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert (tmp_path / "load started").exists()
    assert "the reader broke (simulated)" in proc.stderr
    assert (
        "beam_jax: the process exits without waiting longer for a worker still being built "
        "after 2 s" in proc.stderr
    ), proc.stderr[-2000:]
