"""The private names of Apache Beam that beam_jax uses, all here (see
``compat/__init__.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def default_sampling_period(period_ms: int) -> Iterator[bool]:
    """State samplers created in this process while the block runs sleep at most
    ``period_ms`` between samples; yields whether that applies (``False``: samplers are set
    otherwise already, and nothing changes).

    Public API to move to: a pipeline option for the state sampler's period (Beam 2.78's
    SDK worker builds ``StateSampler`` with its default, ``DEFAULT_SAMPLING_PERIOD_MS``).
    """
    from apache_beam.runners.worker import statesampler

    init = statesampler.StateSampler.__init__
    default = getattr(statesampler, "DEFAULT_SAMPLING_PERIOD_MS", None)
    if init.__defaults__ != (default,):
        yield False
        return
    init.__defaults__ = (period_ms,)
    try:
        yield True
    finally:
        init.__defaults__ = (default,)


@contextlib.contextmanager
def direct_runner_clock(clock: Any) -> Iterator[None]:
    """The direct runner's ``TestStream`` pipelines run on ``clock`` (its ``TestClock``)
    while the block runs, so a test reads the time its timers fire at.

    Public API to move to: a clock argument of the direct runner (Beam 2.78 builds its own
    ``TestClock`` per run, as ``direct_runner.TestClock()``).
    """
    from apache_beam.runners.direct import direct_runner

    original = direct_runner.TestClock
    direct_runner.TestClock = lambda: clock
    try:
        yield
    finally:
        direct_runner.TestClock = original


@contextlib.contextmanager
def metrics_per_bundle() -> Iterator[None]:
    """While the block runs, each bundle a state sampler scopes gets its own metrics
    container: the BundleBasedDirectRunner keeps one ``ScopedState`` per step and thread
    holding its first bundle's container, so later bundles' counter updates are lost.

    Public API to move to: none; the fix belongs in Beam (``StateSampler.scoped_state``
    caches by counter name, in ``_states_by_name``, whatever the container).
    """
    from apache_beam.runners.worker import statesampler

    original = statesampler.StateSampler.scoped_state

    def scoped_state(sampler, name_context, state_name, io_target=None, metrics_container=None):
        state = original(sampler, name_context, state_name, io_target, metrics_container)
        if metrics_container is not None and state.metrics_container is not metrics_container:
            for name, cached in list(sampler._states_by_name.items()):
                if cached is state:
                    del sampler._states_by_name[name]
            state = original(sampler, name_context, state_name, io_target, metrics_container)
        return state

    statesampler.StateSampler.scoped_state = scoped_state
    try:
        yield
    finally:
        statesampler.StateSampler.scoped_state = original


def dataflow_environment(job: Any, options: Any, staging_location: str) -> Any:
    """The ``Environment`` proto Dataflow's client builds for ``job`` before submitting it,
    built offline (no file uploaded; the pipeline's URL is where it would be staged), the
    SDK environment overrides applied to its pipeline.

    Public API to move to: a public way to build a job's request without submitting it
    (Beam 2.78's ``DataflowApplicationClient`` does it in private methods, at submission).
    """
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.runners.dataflow.internal import apiclient
    from apache_beam.runners.internal import names

    staged = FileSystems.join(staging_location, names.STAGED_PIPELINE_FILENAME)
    apiclient.DataflowApplicationClient._apply_sdk_environment_overrides(
        job.proto_pipeline, {}, options
    )
    return apiclient.Environment(
        packages=[],
        options=options,
        environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
        proto_pipeline_staged_url=staged,
        proto_pipeline=job.proto_pipeline,
    ).proto


def dask_primitives() -> dict[str, type]:
    """The transforms Beam's Dask overrides replace the primitives with (``Create``,
    ``Read``, ``Flatten``, ``GroupByKey``'s core, ``Reshuffle``), by name; the Dask adapter
    translates each into a bag operation.

    Public API to move to: none yet; Beam 2.78 keeps them private in
    ``apache_beam.runners.dask.overrides`` (``_Create``, ``_Read``, ...).
    """
    from apache_beam.runners.dask import overrides

    return {
        "Create": overrides._Create,
        "Read": overrides._Read,
        "Flatten": overrides._Flatten,
        "GroupByKeyOnly": overrides._GroupByKeyOnly,
        "Reshuffle": overrides._Reshuffle,
    }


def dask_bag_options(dask_options: dict[str, Any]) -> dict[str, Any]:
    """The ``dask.bag.from_sequence`` partitioning options (``npartitions``,
    ``partition_size``) taken out of Beam's Dask options, which keeps the rest for
    ``dask.distributed.Client``.

    Public API to move to: none yet (Beam 2.78's ``DaskOptions._extract_bag_kwargs``).
    """
    from apache_beam.runners.dask.dask_runner import DaskOptions

    return DaskOptions._extract_bag_kwargs(dask_options)
