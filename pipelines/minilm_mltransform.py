"""The flagship's JAX MiniLM as an ``MLTransform`` embeddings manager (``MiniLMEmbeddings``).

Its handler tokenizes each batch of strings and embeds them with ``beam_jax.JaxModelHandler``,
so padding and compiles follow the token-length buckets (limits: docs/beam_ml.md).

Example:
    >>> from apache_beam.ml.transforms.base import MLTransform
    >>> embed = MLTransform(write_artifact_location=tmp).with_transform(  # doctest: +SKIP
    ...     MiniLMEmbeddings(columns=["text"]))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import ModelHandler, RunInference
from apache_beam.ml.transforms.base import EmbeddingsManager, _TextEmbeddingHandler

import beam_jax as bj
from beam_jax.text import SentenceEncoder
from pipelines.embed.flags import DEFAULT_BUCKETS, DEFAULT_TOKENS_PER_CHUNK


class _Loaded:
    """One process's tokenizer and worker (weak-referenceable for Beam's model sharing)."""

    def __init__(self, tokenizer: Any, worker: Any):
        self.tokenizer = tokenizer
        self.worker = worker


class MiniLMTextHandler(bj.JaxModelHandler):
    """Strings in, ``float32[384]`` unit vectors out: tokenize, then ``JaxModelHandler``.

    Args:
        model_dir: a sentence-transformers BERT directory, as for the flagship's
            ``--model_dir``; default the packaged all-MiniLM-L6-v2.
        bucketing: token-length buckets and batch sizes; default the flagship's buckets in
            batches of at most 1,024 padded tokens (what its model runs at once).
    """

    def __init__(self, model_dir: str | None = None, bucketing: bj.Bucketing | None = None):
        self._encoder = SentenceEncoder.from_dir(model_dir)
        super().__init__(
            self._encoder.element_fn,
            spec=self._encoder.spec,
            bucketing=bucketing
            or bj.Bucketing(
                boundaries={"L": DEFAULT_BUCKETS},
                batch_size=64,
                max_padded_size=DEFAULT_TOKENS_PER_CHUNK,  # what the model runs at once
            ),
            load_params=self._encoder.load_params,
            max_batch_duration_secs=None,  # rows reach Beam's batching, not token ids
        )

    def load_model(self) -> _Loaded:
        return _Loaded(self._encoder.tokenizer(), super().load_model())

    def run_inference(
        self, batch: Sequence[str], model: _Loaded, inference_args: dict | None = None
    ) -> list[np.ndarray]:
        texts = [t.decode("utf-8") if isinstance(t, bytes) else t for t in batch]
        ids = model.tokenizer.encode_batch(texts)
        results = super().run_inference([{"input_ids": x} for x in ids], model.worker)
        return [r.inference for r in results]


class MiniLMEmbeddings(EmbeddingsManager):
    """all-MiniLM-L6-v2 in JAX for ``MLTransform``: each listed text column becomes its
    embedding (a list of 384 floats).

    Args:
        columns: the text columns to embed.
        model_dir, bucketing: as for ``MiniLMTextHandler``.
        **kwargs: ``EmbeddingsManager``'s (``min_batch_size``, ``max_batch_size``, ...).
    """

    def __init__(
        self,
        columns: list[str],
        *,
        model_dir: str | None = None,
        bucketing: bj.Bucketing | None = None,
        **kwargs: Any,
    ):
        super().__init__(columns=columns, **kwargs)
        self._handler = MiniLMTextHandler(model_dir, bucketing)

    def get_model_handler(self) -> ModelHandler:
        return self._handler

    def get_ptransform_for_processing(self, **kwargs) -> beam.PTransform:
        return RunInference(
            model_handler=_TextEmbeddingHandler(self), inference_args=self.inference_args
        )
