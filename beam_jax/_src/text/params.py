"""A BERT-family checkpoint's weights (``model.safetensors``) as a pytree of float32 numpy
arrays: BERT, RoBERTa / XLM-RoBERTa (BERT's names) and MPNet (its own names for the
attention, and a relative-position table)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from beam_jax._src.core.tensor_file import read_safetensors
from beam_jax._src.text.config import BertConfig

__all__ = ["Params", "read_weights"]

Params = dict[str, Any]

# The prefix a task model (``...For...``) puts before the base model's weight names.
_PREFIXES = {"bert": "bert.", "roberta": "roberta.", "xlm-roberta": "roberta.", "mpnet": "mpnet."}
# Each layer's attention weights, by family (the feed-forward names are shared).
_BERT_ATTENTION = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attention_out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
}
_MPNET_ATTENTION = {
    "query": "attention.attn.q",
    "key": "attention.attn.k",
    "value": "attention.attn.v",
    "attention_out": "attention.attn.o",
    "attention_norm": "attention.LayerNorm",
}


def read_weights(path: str | pathlib.Path, config: BertConfig) -> Params:
    """Reads ``model.safetensors`` into the encoder's pytree, without torch.

    Linear weights are transposed from torch's ``(out, in)`` to ``(in, out)``, so the forward
    pass is ``x @ w + b``. Keys are accepted with or without the family's prefix
    (``bert.``, ``roberta.``, ``mpnet.``: Hugging Face saves ``BertModel`` without it and
    ``BertFor...`` with it); weights the encoder does not use (the pooler, a task head,
    ``position_ids``) are ignored. MPNet's attention weights (``attention.attn.q`` ...) are
    read into the same places as BERT's.

    Args:
        path: The safetensors file.
        config: The encoder's shape; every weight is checked against it.

    Returns:
        ``{"embeddings": {word, position, token_type, norm}, "layers": [...]}``: nested
        dicts of float32 arrays, one dict per layer with ``query``, ``key``, ``value``,
        ``attention_out``, ``intermediate``, ``output`` (``w``, ``b``) and
        ``attention_norm``, ``output_norm`` (``scale``, ``bias``); MPNet has no
        ``token_type`` and adds ``relative_attention_bias`` (float32[buckets, heads]).

    Raises:
        FileNotFoundError: The file does not exist.
        KeyError: A weight the encoder needs is missing; the message lists what the file has.
        ValueError: A weight's shape disagrees with ``config``.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        others = sorted(p.name for p in path.parent.glob("*.bin")) if path.parent.is_dir() else []
        hint = (
            f" The directory has {others}: convert the checkpoint to safetensors (e.g. "
            "model.save_pretrained(dir, safe_serialization=True) with transformers)"
            if others
            else ""
        )
        raise FileNotFoundError(f"{path} does not exist; expected the model's weights.{hint}")
    raw = read_safetensors(path.read_bytes())  # bfloat16 too, which safetensors.numpy refuses
    prefix = _PREFIXES.get(config.model_type, "bert.")
    raw = {k.removeprefix(prefix): v for k, v in raw.items()}

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in raw:
            # Checkpoints from before 2020 name the LayerNorm parameters gamma and beta.
            old = name.replace(".LayerNorm.weight", ".LayerNorm.gamma").replace(
                ".LayerNorm.bias", ".LayerNorm.beta"
            )
            if old not in raw:
                raise KeyError(
                    f"weight {name!r} not found in {path}; it holds {sorted(raw)[:8]}... "
                    f"Expected a {config.model_type} checkpoint (its base model's weights, "
                    f"with or without {prefix!r}), as config.json's model_type says"
                )
            name = old
        value = raw[name]
        if tuple(value.shape) != shape:
            raise ValueError(
                f"weight {name!r} in {path} has shape {tuple(value.shape)}, expected {shape} "
                "from config.json; the weights and config.json belong to different models"
            )
        return np.ascontiguousarray(value, dtype=np.float32)

    h, i = config.hidden_size, config.intermediate_size

    def linear(prefix: str, n_in: int, n_out: int) -> dict[str, np.ndarray]:
        w = get(f"{prefix}.weight", (n_out, n_in))
        return {"w": np.ascontiguousarray(w.T), "b": get(f"{prefix}.bias", (n_out,))}

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {"scale": get(f"{prefix}.weight", (h,)), "bias": get(f"{prefix}.bias", (h,))}

    mpnet = config.model_type == "mpnet"
    names = _MPNET_ATTENTION if mpnet else _BERT_ATTENTION
    layers = []
    for n in range(config.num_hidden_layers):
        p = f"encoder.layer.{n}"
        layers.append(
            {
                "query": linear(f"{p}.{names['query']}", h, h),
                "key": linear(f"{p}.{names['key']}", h, h),
                "value": linear(f"{p}.{names['value']}", h, h),
                "attention_out": linear(f"{p}.{names['attention_out']}", h, h),
                "attention_norm": norm(f"{p}.{names['attention_norm']}"),
                "intermediate": linear(f"{p}.intermediate.dense", h, i),
                "output": linear(f"{p}.output.dense", i, h),
                "output_norm": norm(f"{p}.output.LayerNorm"),
            }
        )
    embeddings = {
        "word": get("embeddings.word_embeddings.weight", (config.vocab_size, h)),
        "position": get(
            "embeddings.position_embeddings.weight", (config.max_position_embeddings, h)
        ),
        "norm": norm("embeddings.LayerNorm"),
    }
    if config.token_types:
        embeddings["token_type"] = get(
            "embeddings.token_type_embeddings.weight", (config.type_vocab_size, h)
        )
    params: Params = {"embeddings": embeddings, "layers": layers}
    if config.relative_attention:
        params["relative_attention_bias"] = get(
            "encoder.relative_attention_bias.weight",
            (config.relative_attention_num_buckets, config.num_attention_heads),
        )
    return params
