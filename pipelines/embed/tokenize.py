"""The tokenize step: ``beam_jax.text.TokenizeBatches``, one tokenizer call per part, ids
checked against the run's type (docs/embed_text.md).

Example:
    >>> step = tokenize_parts(pa.int64(), model, "text")  # doctest: +SKIP
"""

from __future__ import annotations

import pyarrow as pa

from beam_jax.text import INPUT_IDS, TOKENIZE, IdType, TokenizeBatches
from pipelines.embed.parts import KEY, METRICS_NAMESPACE

__all__ = ["INPUT_IDS", "METRICS_NAMESPACE", "TOKENIZE", "tokenize_parts"]


def tokenize_parts(id_type: pa.DataType, model, text_column: str = "text") -> TokenizeBatches:
    """The step for record batches of ``key``, ``id``, ``text`` (the read step's parts):
    ``key`` and ``input_ids`` out; dead letters keyed by the id, with file and row;
    ``rows`` and dead letters counted in the job's metrics."""
    return TokenizeBatches(
        model,
        id_type=IdType(id_type),
        carry=KEY,
        metrics_namespace=METRICS_NAMESPACE,
        text_name=text_column,  # the read step names the input's text column "text"
    )
