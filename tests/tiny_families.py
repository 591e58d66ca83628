"""Writes small randomly initialised MPNet and XLM-RoBERTa models in the sentence-transformers
directory layout, as the Hugging Face libraries write them.

MPNet: ``model_type`` mpnet, its own attention weight names and relative-position table, a
WordPiece ``tokenizer.json`` with ``<s>``/``</s>``. XLM-RoBERTa: BERT's weight names, one
token type, positions after the padding index, and a SentencePiece-style Unigram
``tokenizer.json`` (``▁`` word starts, ``<s>``/``</s>``) built with the ``tokenizers``
library. Both with ``tokenizer_config.json`` and the module configs, so sentence-transformers
itself loads the directory.
"""

from __future__ import annotations

import json
import pathlib
import string

import numpy as np

WORDS = (
    "the a cat dog sat ran on mat fast slow big small red blue tree house river over under "
    "and with from to of in it is was be"
).split()
PUNCTUATION = list(".,!?;:'-()")
# <s>, <pad>, </s>, <unk>: the ids every RoBERTa and MPNet vocabulary starts with.
SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]
PAD = 1


def _normal(rng, *shape: int, scale: float = 0.2) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _linear(weights, rng, name: str, n_out: int, n_in: int) -> None:
    weights[f"{name}.weight"] = _normal(rng, n_out, n_in, scale=n_in**-0.5)
    weights[f"{name}.bias"] = _normal(rng, n_out, scale=0.1)


def _norm(weights, rng, name: str, hidden: int) -> None:
    weights[f"{name}.weight"] = 1 + _normal(rng, hidden, scale=0.1)
    weights[f"{name}.bias"] = _normal(rng, hidden, scale=0.1)


def _modules(path: pathlib.Path, hidden: int, pooling: str, normalize: bool, max_seq: int):
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
    ]  # fmt: skip
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})  # fmt: skip
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
            }
        )
    )
    (path / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq, "do_lower_case": False})
    )


def _tokenizer_config(path: pathlib.Path, cls: str, max_positions: int) -> None:
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": cls,
                "model_max_length": max_positions - PAD - 1,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "cls_token": "<s>",
                "sep_token": "</s>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "mask_token": "<mask>",
            }
        )
    )
    (path / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "cls_token": "<s>",
                "sep_token": "</s>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "mask_token": "<mask>",
            }
        )  # fmt: skip
    )


def write_tiny_mpnet(
    path: pathlib.Path,
    *,
    pooling: str = "mean",
    normalize: bool = True,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    intermediate: int = 128,
    max_positions: int = 66,
    max_seq_length: int = 48,
    buckets: int = 32,
    seed: int = 0,
) -> pathlib.Path:
    """An MPNet directory at ``path`` (returned): WordPiece vocabulary, lower-casing."""
    import safetensors.numpy
    import tokenizers
    from tokenizers import models, normalizers, pre_tokenizers, processors

    path.mkdir(parents=True, exist_ok=True)
    vocab_list = list(dict.fromkeys(
        SPECIAL + WORDS + PUNCTUATION + list(string.ascii_lowercase + string.digits)
        + ["##" + c for c in string.ascii_lowercase + string.digits]
        + ["##s", "##ing", "##ed", "##er", "<mask>"]
    ))  # fmt: skip
    vocab = {t: i for i, t in enumerate(vocab_list)}
    config = {
        "architectures": ["MPNetModel"],
        "model_type": "mpnet",
        "vocab_size": len(vocab),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": intermediate,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": max_positions,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-05,
        "relative_attention_num_buckets": buckets,
        "pad_token_id": PAD,
        "bos_token_id": 0,
        "eos_token_id": 2,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed)
    w: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": _normal(rng, len(vocab), hidden, scale=1.0),
        "embeddings.position_embeddings.weight": _normal(rng, max_positions, hidden, scale=0.5),
        "embeddings.position_ids": np.arange(max_positions, dtype=np.int64)[None, :],
        "encoder.relative_attention_bias.weight": _normal(rng, buckets, heads, scale=1.0),
    }
    _norm(w, rng, "embeddings.LayerNorm", hidden)
    for n in range(layers):
        p = f"encoder.layer.{n}"
        for name in ("q", "k", "v", "o"):
            _linear(w, rng, f"{p}.attention.attn.{name}", hidden, hidden)
        _norm(w, rng, f"{p}.attention.LayerNorm", hidden)
        _linear(w, rng, f"{p}.intermediate.dense", intermediate, hidden)
        _linear(w, rng, f"{p}.output.dense", hidden, intermediate)
        _norm(w, rng, f"{p}.output.LayerNorm", hidden)
    _linear(w, rng, "pooler.dense", hidden, hidden)
    safetensors.numpy.save_file(w, str(path / "model.safetensors"), metadata={"format": "pt"})

    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tokenizer.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer.save(str(path / "tokenizer.json"))
    _tokenizer_config(path, "MPNetTokenizer", max_positions)
    (path / "vocab.txt").write_text("\n".join(vocab_list) + "\n")
    _modules(path, hidden, pooling, normalize, max_seq_length)
    return path


def write_tiny_xlm_roberta(
    path: pathlib.Path,
    *,
    pooling: str = "mean",
    normalize: bool = False,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    intermediate: int = 128,
    max_positions: int = 66,
    max_seq_length: int = 48,
    seed: int = 1,
) -> pathlib.Path:
    """An XLM-RoBERTa directory at ``path`` (returned): a Unigram vocabulary of ``▁``-led
    words and single characters (so every text tokenizes), no lower-casing."""
    import safetensors.numpy
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    path.mkdir(parents=True, exist_ok=True)
    chars = string.ascii_letters + string.digits + "".join(PUNCTUATION) + "éüß日本"
    pieces = (
        [("▁" + word, -2.0 - 0.1 * i) for i, word in enumerate(WORDS)]
        + [("▁", -3.0)]
        + [(c, -5.0) for c in chars]
        + [("▁" + c, -5.5) for c in chars]
        + [("ing", -4.0), ("ed", -4.0), ("s", -4.5)]
    )
    pieces = list(dict((p, s) for p, s in pieces).items())
    vocab = [(t, 0.0) for t in SPECIAL] + pieces + [("<mask>", 0.0)]
    config = {
        "architectures": ["XLMRobertaModel"],
        "model_type": "xlm-roberta",
        "vocab_size": len(vocab),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": intermediate,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": max_positions,
        "type_vocab_size": 1,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-05,
        "pad_token_id": PAD,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "position_embedding_type": "absolute",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed)
    w: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": _normal(rng, len(vocab), hidden, scale=1.0),
        "embeddings.position_embeddings.weight": _normal(rng, max_positions, hidden, scale=0.5),
        "embeddings.token_type_embeddings.weight": _normal(rng, 1, hidden, scale=0.5),
    }
    _norm(w, rng, "embeddings.LayerNorm", hidden)
    for n in range(layers):
        p = f"encoder.layer.{n}"
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):  # fmt: skip
            _linear(w, rng, f"{p}.{name}", hidden, hidden)
        _norm(w, rng, f"{p}.attention.output.LayerNorm", hidden)
        _linear(w, rng, f"{p}.intermediate.dense", intermediate, hidden)
        _linear(w, rng, f"{p}.output.dense", hidden, intermediate)
        _norm(w, rng, f"{p}.output.LayerNorm", hidden)
    _linear(w, rng, "pooler.dense", hidden, hidden)
    safetensors.numpy.save_file(w, str(path / "model.safetensors"), metadata={"format": "pt"})

    tokenizer = tokenizers.Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(tokenizers.Regex(" {2,}"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tokenizer.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer.save(str(path / "tokenizer.json"))
    _tokenizer_config(path, "XLMRobertaTokenizer", max_positions)
    _modules(path, hidden, pooling, normalize, max_seq_length)
    return path


def sample_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts of 0 to ~60 pieces: known words, punctuation, unknown words, capitals,
    accents and CJK, some over the fixtures' 48-token limit."""
    rng = np.random.default_rng(seed)
    pool = WORDS + PUNCTUATION + ["Cats", "RUNNING", "Ünder", "xyzzy", "42", "日本", "straße"]
    return [" ".join(rng.choice(pool, size=int(rng.integers(0, 60))).tolist()) for _ in range(n)]
