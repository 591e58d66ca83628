"""The shape of a BERT encoder, as its ``config.json`` states it."""

from __future__ import annotations

import dataclasses
from typing import Any

from beam_jax._src.errors import SpecError

__all__ = ["ACTIVATIONS", "BertConfig"]

# hidden_act values of Hugging Face's ACT2FN that the encoder implements: "gelu" is the
# exact erf form; "gelu_new", "gelu_pytorch_tanh" and "gelu_fast" are the tanh approximation.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT encoder (the defaults are all-MiniLM-L6-v2's).

    Example:
        >>> BertConfig(hidden_size=64, num_attention_heads=4).head_dim
        16

    Args:
        vocab_size: Rows of the token table.
        hidden_size: Width of the token vectors.
        num_attention_heads: Heads per attention layer; must divide ``hidden_size``.
        num_hidden_layers: Transformer layers.
        intermediate_size: Width of the feed-forward layer.
        hidden_act: The feed-forward activation, one of :data:`ACTIVATIONS`.
        layer_norm_eps: Epsilon of every LayerNorm.
        max_position_embeddings: Rows of the position table: the longest input possible.
        type_vocab_size: Rows of the token-type table (only type 0 is used).

    Raises:
        SpecError: A value is out of range; the message names the field and the value.
    """

    vocab_size: int = 30522
    hidden_size: int = 384
    num_attention_heads: int = 12
    num_hidden_layers: int = 6
    intermediate_size: int = 1536
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "layer_norm_eps":
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise SpecError(f"layer_norm_eps must be a float in (0, 1), got {value!r}")
                if not 0 < value < 1:
                    raise SpecError(f"layer_norm_eps must be in (0, 1), got {value!r}")
            elif field.name == "hidden_act":
                if value not in ACTIVATIONS:
                    raise SpecError(
                        f"hidden_act {value!r} is not supported; expected one of {ACTIVATIONS}. "
                        "Use a model whose config.json names one of them"
                    )
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"{field.name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise SpecError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}); check the model's config.json"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, config: dict[str, Any], source: str = "config.json") -> BertConfig:
        """The fields of a Hugging Face ``config.json`` that shape the encoder.

        Other keys (dropout, architectures, versions) are ignored; a model that is not a
        BERT with absolute positions is refused.

        Raises:
            SpecError: ``model_type`` is not ``bert``, positions are not absolute, or a
                value is out of range.
        """
        model_type = config.get("model_type", "bert")
        if model_type != "bert":
            raise SpecError(
                f"{source} has model_type {model_type!r}; expected 'bert' (a BERT-family "
                "encoder such as all-MiniLM-L6-v2, BGE or E5). RoBERTa-style models offset "
                "their positions and other architectures name their weights differently"
            )
        positions = config.get("position_embedding_type", "absolute")
        if positions != "absolute":
            raise SpecError(
                f"{source} has position_embedding_type {positions!r}; only 'absolute' "
                "position embeddings are supported"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names})
