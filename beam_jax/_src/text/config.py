"""The shape of a BERT-family encoder, as its ``config.json`` states it.

Three families share one layer stack (attention, feed-forward, post-LayerNorm) and differ
in a few places, all stated here once (``config.json``'s ``model_type``):

* ``bert``: positions ``0..L-1``; a token-type row added to every token.
* ``roberta`` / ``xlm-roberta``: positions start at ``pad_token_id + 1`` (Hugging Face's
  ``create_position_ids_from_input_ids``: the running count of real tokens plus the
  padding index), so the table holds ``max_position_embeddings - pad_token_id - 1`` tokens;
  a token-type row as BERT (``type_vocab_size`` 1).
* ``mpnet``: positions as RoBERTa's; no token types; every layer adds a learned bias per
  head and bucket of relative position (``relative_attention_num_buckets``, T5-style
  buckets up to a distance of 128) to its attention logits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from beam_jax._src.errors import SpecError

__all__ = ["ACTIVATIONS", "MODEL_TYPES", "BertConfig"]

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "mpnet")
"""The ``model_type`` values of ``config.json`` the encoder implements."""
# The families whose positions start after the padding index (RoBERTa's rule).
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "mpnet")

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish")
"""The ``hidden_act`` values (of Hugging Face's ``ACT2FN``) the encoder implements: ``gelu``
is the exact erf form; ``gelu_new``, ``gelu_pytorch_tanh`` and ``gelu_fast`` the tanh
approximation; ``silu`` and ``swish`` the same function."""


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT-family encoder (the defaults are all-MiniLM-L6-v2's).

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
        model_type: The family, one of :data:`MODEL_TYPES`.
        pad_token_id: The padding token, which RoBERTa and MPNet positions count from.
        relative_attention_num_buckets: MPNet's buckets of relative position.

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
    model_type: str = "bert"
    pad_token_id: int = 0
    relative_attention_num_buckets: int = 32

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "model_type":
                if value not in MODEL_TYPES:
                    raise SpecError(
                        f"model_type {value!r} is not one the encoder implements; expected "
                        f"one of {MODEL_TYPES}"
                    )
            elif field.name == "pad_token_id":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise SpecError(f"pad_token_id must be an int >= 0, got {value!r}")
            elif field.name == "layer_norm_eps":
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

        if self.max_tokens < 2:
            raise SpecError(
                f"max_position_embeddings ({self.max_position_embeddings}) leaves no room for "
                f"two tokens after the {self.position_offset} positions a {self.model_type} "
                "model skips; check the model's config.json"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def position_offset(self) -> int:
        """The position-table row of a text's first token: 0 for BERT, ``pad_token_id + 1``
        for RoBERTa, XLM-RoBERTa and MPNet."""
        return self.pad_token_id + 1 if self.model_type in _OFFSET_POSITIONS else 0

    @property
    def max_tokens(self) -> int:
        """The most tokens of one text the position table holds.

        Example:
            >>> BertConfig().max_tokens, BertConfig(model_type="mpnet", pad_token_id=1,
            ...     max_position_embeddings=514).max_tokens
            (512, 512)
        """
        return self.max_position_embeddings - self.position_offset

    @property
    def token_types(self) -> bool:
        """Whether a token-type row is added to every token (all but MPNet)."""
        return self.model_type != "mpnet"

    @property
    def relative_attention(self) -> bool:
        """Whether every layer adds a bias per bucket of relative position (MPNet)."""
        return self.model_type == "mpnet"

    @classmethod
    def from_json(cls, config: dict[str, Any], source: str = "config.json") -> BertConfig:
        """The fields of a Hugging Face ``config.json`` that shape the encoder.

        Other keys (dropout, architectures, versions) are ignored; a model type the
        encoder does not know, or positions that are not absolute, are refused.

        Raises:
            SpecError: ``model_type`` is not one of :data:`MODEL_TYPES`, positions are not
                absolute, or a value is out of range.
        """
        model_type = config.get("model_type", "bert")
        if model_type not in MODEL_TYPES:
            raise SpecError(
                f"{source} has model_type {model_type!r}, which the encoder does not "
                f"implement; the known model types are {', '.join(MODEL_TYPES)} (e.g. "
                "all-MiniLM-L6-v2, BGE and E5 are bert, all-mpnet-base-v2 is mpnet, "
                "multilingual-e5 and paraphrase-multilingual-* are xlm-roberta). Use a "
                "sentence-transformers model of one of these types"
            )
        positions = config.get("position_embedding_type", "absolute")
        if positions != "absolute":
            raise SpecError(
                f"{source} has position_embedding_type {positions!r}; only 'absolute' "
                "position embeddings are supported"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in config.items() if k in names and v is not None}
        if "pad_token_id" not in fields and model_type in _OFFSET_POSITIONS:
            fields["pad_token_id"] = 1  # the padding index of every RoBERTa and MPNet
        return cls(**{"model_type": model_type, **fields})
