"""beam_jax's DaskRunner: Beam's DaskRunner with what it lacks to run beam_jax's jobs.

Beam's ``apache_beam.runners.dask.dask_runner.DaskRunner`` (2.78) translates a pipeline
into Dask bags and computes them on a ``dask.distributed`` cluster. This subclass keeps its
options (``--dask_client_address``, ``--dask_npartitions``, ...), its overrides and its
result, and changes what beam_jax's transforms and jobs need (docs/runners.md lists each
gap with a reproduction):

- every sink of the pipeline is computed, not only the step applied last;
- each output of a multi-output step goes to its own consumers only, windows and
  timestamps kept (:mod:`.dask_bags`);
- ``Impulse`` and bounded ``Read`` run; ``Reshuffle`` spreads over the cluster;
- a DoFn is set up once per worker process and step, not once per task;
- metrics are counted and returned (:mod:`.dask_metrics`);
- what it cannot run is refused at launch, naming the step and the alternative:
  streaming, state and timers (beam_jax's cross-bundle batching), splittable DoFns, and
  primitive transforms it has no translation for.

Example:
    >>> options = PipelineOptions(["--runner=beam_jax.runners.DaskRunner",  # doctest: +SKIP
    ...                            "--dask_client_address=tcp://127.0.0.1:8786"])
"""

from __future__ import annotations

import logging
import uuid

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask import dask_runner
from apache_beam.runners.dask.overrides import dask_overrides
from apache_beam.runners.runner import PipelineState

from beam_jax._src.compat.beam import dask_bag_options
from beam_jax._src.runners import dask_bags, dask_metrics
from beam_jax._src.runners.dask_refusals import refuse_unsupported

__all__ = ["DaskJobResult", "DaskRunner"]

_LOG = logging.getLogger(__name__)


class DaskRunner(dask_runner.DaskRunner):
    """Runs a pipeline on a ``dask.distributed`` cluster (Beam's ``DaskRunner``, adapted).

    Takes Beam's Dask options: ``--dask_client_address=tcp://HOST:8786`` (or
    ``--dask_scheduler_file``; without either a ``LocalCluster`` starts in this process),
    ``--dask_npartitions`` / ``--dask_partition_size`` for ``beam.Create``,
    ``--dask_connection_timeout``, ``--dask_client_name``.

    Raises:
        UnsupportedOnDaskError: at launch, for a streaming pipeline, a stateful or
            splittable DoFn, or a primitive transform with no Dask translation.
    """

    def run_pipeline(self, pipeline, options: PipelineOptions) -> DaskJobResult:
        import dask.distributed as ddist

        pipeline.replace_all(dask_overrides())
        refuse_unsupported(pipeline, options)
        dask_options = options.view_as(dask_runner.DaskOptions).get_all_options(
            drop_default=True, current_only=True
        )
        partitions = dask_bag_options(dask_options)
        dask_options.pop("lazy_side_inputs", None)  # side inputs are computed once, in-graph
        # Not the process's default client: a job changes nothing else in its process.
        client = ddist.Client(set_as_default=False, **dask_options)
        try:
            threads = sum(client.nthreads().values())
            job = dask_bags.Job(uuid.uuid4().hex, spread=max(1, threads), **partitions)
            translator = dask_bags.Translator(job)
            pipeline.visit(translator)
            metrics = dask_metrics.DaskMetrics()
            client.subscribe_topic(dask_metrics.topic(job.id), metrics.receive)
            # Only completion travels back: each sink's partitions end as empty lists.
            futures = client.compute([bag.map_partitions(_drain) for bag in translator.sinks()])
        except BaseException:
            client.close()
            raise
        return DaskJobResult(client, futures, job.id, metrics)


def _drain(elements) -> list:
    for _ in elements:
        pass
    return []


class DaskJobResult(dask_runner.DaskRunnerResult):
    """A job on the cluster: waited for, cancelled, its metrics queried.

    When the job ends (``wait_until_finish`` returns or raises, or ``cancel``), the DoFns its
    workers kept are torn down and the client disconnects.
    """

    def __init__(self, client, futures, job: str, metrics: dask_metrics.DaskMetrics):
        super().__init__(client, futures)
        self._job = job
        self._metrics = metrics
        self._closed = False

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Waits for the job (at most ``duration`` ms) and returns its state; ``RUNNING``
        if it has not ended by then.

        Raises:
            Exception: the error of the first task that failed (``KilledWorker`` where
                workers died running it too often); the job's other tasks are cancelled.
        """
        import dask.distributed as ddist

        if self._state in (PipelineState.DONE, PipelineState.CANCELLED):
            return self._state
        timeout = None if duration is None else duration / 1000
        try:
            done = ddist.as_completed(
                self.futures, loop=self.client.loop, with_results=True, timeout=timeout
            )
            for _ in done:
                pass  # with_results: a task's error is raised here
        except TimeoutError:
            return self._state
        except BaseException:
            self._state = PipelineState.FAILED
            self._close(cancel=True)
            raise
        self._state = PipelineState.DONE
        self._close()
        return self._state

    def cancel(self) -> str:
        self._state = PipelineState.CANCELLING
        self._close(cancel=True)
        self._state = PipelineState.CANCELLED
        return self._state

    def metrics(self) -> dask_metrics.DaskMetrics:
        return self._metrics

    def _close(self, cancel: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if cancel:
                self.client.cancel(self.futures)
            self.client.unsubscribe_topic(dask_metrics.topic(self._job))
            self.client.run(dask_bags.teardown_job, self._job)
        except Exception as e:  # noqa: BLE001 - the job's own outcome is what to report
            _LOG.warning("beam_jax: tearing down the job's DoFns on the workers failed: %s", e)
        finally:
            self.client.close()
