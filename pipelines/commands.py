"""What the flagship registers with the ``beam-jax`` command (entry points in pyproject.toml).

Light on purpose: ``beam-jax --help`` reads the pipelines' one-line help from here without
importing JAX or Beam; the kernel and tokenizer load the model only when called.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

# (module whose main(argv) runs the pipeline, one-line help)
EMBED = ("pipelines.embed", "sentence embeddings (MiniLM in JAX) of a text column")
CURATE = ("pipelines.curate", "find mislabelled records by per-record gradient scores")


def minilm_kernel() -> dict[str, Any]:
    """``beam-jax plan --kernel minilm``: the flagship's encoder, one element at a time."""
    import numpy as np

    import beam_jax as bj
    from pipelines import minilm
    from pipelines import text_rows as tr

    return {
        "fn": minilm.embed_element,
        "spec": {"input_ids": bj.ArraySpec(("L",), np.int32)},
        "load_params": functools.partial(tr.load_params, None),
    }


def minilm_token_counts() -> Callable[[list[str]], list[int]]:
    """``beam-jax plan --tokenizer minilm``: token counts as the flagship embeds texts
    (truncated at 256 tokens, with [CLS] and [SEP])."""
    from pipelines import minilm
    from pipelines import text_rows as tr

    tokenizer = minilm.Tokenizer(tr.local_model_dir())
    return lambda texts: [
        len(ids) for ids in tokenizer.encode_batch([tr.tokenizer_prefix(t) for t in texts])
    ]
