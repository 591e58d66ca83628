"""Helpers for testing pipelines that use beam_jax (also used by beam_jax's own tests)."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from beam_jax._src.engine.metrics import NAMESPACE, Summary, summarize


def assert_conserved(result: Any, *, namespace: str = NAMESPACE) -> Summary:
    """Assert every element that entered RunKernel ended as one result or one dead letter.

    Examples:
        >>> result = pipeline.run(); result.wait_until_finish()  # doctest: +SKIP
        >>> assert_conserved(result).dead_letters  # doctest: +SKIP

    Args:
        result: a finished ``PipelineResult``, or a ``Summary``.
        namespace: the metrics namespace the transforms used.

    Returns:
        The summary, for further checks.

    Raises:
        AssertionError: elements in != results + dead letters, or nothing was counted.
    """
    summary = result if isinstance(result, Summary) else summarize(result, namespace)
    if summary.elements == 0:
        raise AssertionError(
            f"no elements were counted in metrics namespace {namespace!r}; did the pipeline "
            "run RunKernel, and has it finished?"
        )
    if not summary.conserved:
        raise AssertionError(
            f"conservation broken: {summary.elements} elements in, but {summary.results} "
            f"results + {summary.dead_letters} dead letters = "
            f"{summary.results + summary.dead_letters}."
        )
    return summary


class CountingLoader:
    """A ``load_params`` that records each call's process id in ``directory``.

    Use it to check that parameters are loaded once per worker process.

    Args:
        directory: where to record calls (one file per call).
        params: what the loader returns.
    """

    def __init__(self, directory: str, params: Any):
        self.directory = str(directory)
        self.params = params

    def __call__(self) -> Any:
        os.makedirs(self.directory, exist_ok=True)
        pid = os.getpid()
        n = len([f for f in os.listdir(self.directory) if f.startswith(f"{pid}-")])
        with open(os.path.join(self.directory, f"{pid}-{n}"), "w") as f:
            f.write(str(pid))
        return self.params

    def calls(self) -> Counter:
        """``{pid: number of loads}`` recorded so far."""
        if not os.path.isdir(self.directory):
            return Counter()
        return Counter(int(f.split("-")[0]) for f in os.listdir(self.directory))
