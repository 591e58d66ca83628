"""What both embedding steps share: tokenize, then embed with a kernel transform whose
worker can start (load the model, compile) before the first row arrives."""

from __future__ import annotations

from typing import Any

import apache_beam as beam

import beam_jax as bj
from pipelines import text_rows as tr


class EmbedStep(beam.PTransform):
    """Tokenize with ``tokenize`` (a DoFn with a ``tr.DEAD_LETTERS`` output), then run
    ``embed`` (a kernel transform with exception handling); results and dead letters out.

    Args:
        tokenize: The tokenizing DoFn.
        embed: The kernel transform, e.g. ``bj.RunKernel(...).with_exception_handling()``.
        tokens_type: The tokens' element type, if Beam should be told it.
        accelerator: A Beam ``accelerator`` resource hint (e.g. Dataflow's
            ``"type:nvidia-l4;count:1;install-nvidia-driver"``) for the kernel step and its
            worker start only: reading and tokenizing stay on the runner's default workers.
    """

    def __init__(
        self,
        tokenize: beam.DoFn,
        embed: Any,
        tokens_type: Any = None,
        *,
        accelerator: str | None = None,
    ):
        super().__init__()
        self._tokenize = tokenize
        self._embed = embed
        self._tokens_type = tokens_type
        self.accelerator = accelerator

    def _on_accelerator(self, transform: beam.PTransform) -> beam.PTransform:
        if self.accelerator:
            transform = transform.with_resource_hints(accelerator=self.accelerator)
        return transform

    def start_workers(self) -> beam.PTransform:
        """Apply to the pipeline: the model loads and its shapes compile from its start."""
        # On the kernel's own workers, so that it compiles for their accelerator.
        return self._on_accelerator(self._embed.start_workers())

    def start_worker_here(self) -> None:
        """Load the model and start compiling in this process (in-process runners)."""
        self._embed.start_worker_here()

    def forget_worker_here(self) -> None:
        """Drop that worker if the pipeline did not take it."""
        self._embed.forget_worker_here()

    def expand(self, batches):
        tokenize = beam.ParDo(self._tokenize)
        if self._tokens_type is not None:
            tokenize = tokenize.with_output_types(self._tokens_type)
        tokens = batches | "Tokenize" >> tokenize.with_outputs(tr.DEAD_LETTERS, main="tokens")
        results, kernel_dead = tokens.tokens | "Embed" >> self._on_accelerator(self._embed)
        dead = (tokens[tr.DEAD_LETTERS], kernel_dead) | "AllDeadLetters" >> beam.Flatten()
        return bj.RunKernelResult(results, dead)
