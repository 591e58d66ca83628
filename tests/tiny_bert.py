"""Writes a small randomly initialised BERT in the sentence-transformers directory layout.

The files are those the Hugging Face libraries write and read: ``config.json``,
``model.safetensors`` (torch's ``(out, in)`` linear weights), a WordPiece ``tokenizer.json``
built with the ``tokenizers`` library (with the padding and truncation a saved tokenizer
carries, which sentence-transformers overrides), ``tokenizer_config.json``,
``special_tokens_map.json``, ``modules.json``, ``1_Pooling/config.json`` and
``sentence_bert_config.json``: sentence-transformers itself loads the directory.
"""

from __future__ import annotations

import json
import pathlib
import string

import numpy as np

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a cat dog sat ran on mat fast slow big small red blue tree house river over under "
    "and with from to of in it is was be"
).split()
PUNCTUATION = list(".,!?;:'-()")
# Whole words, single letters and continuation pieces, so WordPiece splits unknown words.
VOCAB = list(dict.fromkeys(
    SPECIAL
    + WORDS
    + PUNCTUATION
    + list(string.ascii_lowercase + string.digits)
    + ["##" + c for c in string.ascii_lowercase + string.digits]
    + ["##s", "##ing", "##ed", "##er"]
))  # fmt: skip


def write_tiny_bert(
    path: pathlib.Path,
    *,
    pooling: str = "cls",
    normalize: bool = False,
    hidden_act: str = "gelu",
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    intermediate: int = 128,
    max_positions: int = 64,
    max_seq_length: int | None = 32,
    prefix: str = "",
    seed: int = 0,
) -> pathlib.Path:
    """Writes the model directory at ``path`` and returns it.

    Args:
        pooling: ``cls``, ``mean`` or ``max``: the Pooling module's single mode.
        normalize: Add a Normalize module.
        hidden_act: config.json's activation.
        max_seq_length: sentence_bert_config.json's; ``None`` writes no such file.
        prefix: Prepended to every weight name (``"bert."`` as ``BertFor...`` saves them).
        seed: The weights' random seed.
    """
    import safetensors.numpy
    import tokenizers
    from tokenizers import models, normalizers, pre_tokenizers, processors

    path.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(VOCAB)}
    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": len(vocab),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": intermediate,
        "hidden_act": hidden_act,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": max_positions,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))

    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {
        "embeddings.word_embeddings.weight": normal(len(vocab), hidden, scale=1.0),
        "embeddings.position_embeddings.weight": normal(max_positions, hidden, scale=0.5),
        "embeddings.token_type_embeddings.weight": normal(2, hidden, scale=0.5),
        "embeddings.LayerNorm.weight": 1 + normal(hidden, scale=0.1),
        "embeddings.LayerNorm.bias": normal(hidden, scale=0.1),
        "embeddings.position_ids": np.arange(max_positions, dtype=np.int64)[None, :],
        "pooler.dense.weight": normal(hidden, hidden),
        "pooler.dense.bias": normal(hidden),
    }
    for n in range(layers):
        p = f"encoder.layer.{n}"
        for name, (n_out, n_in) in {
            "attention.self.query": (hidden, hidden),
            "attention.self.key": (hidden, hidden),
            "attention.self.value": (hidden, hidden),
            "attention.output.dense": (hidden, hidden),
            "intermediate.dense": (intermediate, hidden),
            "output.dense": (hidden, intermediate),
        }.items():
            weights[f"{p}.{name}.weight"] = normal(n_out, n_in, scale=n_in**-0.5)
            weights[f"{p}.{name}.bias"] = normal(n_out, scale=0.1)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            weights[f"{p}.{name}.weight"] = 1 + normal(hidden, scale=0.1)
            weights[f"{p}.{name}.bias"] = normal(hidden, scale=0.1)
    safetensors.numpy.save_file(
        {prefix + k: v for k, v in weights.items()},
        str(path / "model.safetensors"),
        metadata={"format": "pt"},
    )

    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    # A saved tokenizer often pads and truncates; sentence-transformers overrides both.
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=12)
    tokenizer.enable_truncation(12)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "BertTokenizer",
                "do_lower_case": True,
                "model_max_length": max_positions,
                "unk_token": "[UNK]",
                "sep_token": "[SEP]",
                "pad_token": "[PAD]",
                "cls_token": "[CLS]",
                "mask_token": "[MASK]",
            }
        )
    )
    (path / "special_tokens_map.json").write_text(
        json.dumps({t.strip("[]").lower() + "_token": t for t in SPECIAL})
    )

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"}
        )  # fmt: skip
        (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": hidden,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": pooling == "max",
                "pooling_mode_mean_sqrt_len_tokens": False,
            },
            indent=2,
        )
    )
    if max_seq_length is not None:
        (path / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
        )
    return path


def sample_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts of 0 to ~40 tokens: known words, punctuation, unknown words split into
    pieces, capitals and accents (lower-cased and stripped by the normalizer)."""
    rng = np.random.default_rng(seed)
    pool = WORDS + PUNCTUATION + ["Cats", "RUNNING", "Ünder", "xyzzy", "42", "日本"]
    texts = []
    for _ in range(n):
        k = int(rng.integers(0, 36))
        texts.append(" ".join(rng.choice(pool, size=k).tolist()))
    return texts
