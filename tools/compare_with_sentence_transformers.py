"""The flagship on a model directory against sentence-transformers, on the same texts.

Runs ``python -m pipelines.embed --model_dir DIR`` on texts written to a JSON-lines file
(the first N built-in texts, and texts longer than the model's max_seq_length, which both
truncate), embeds the same texts with sentence-transformers (float32, CPU) in another
Python that has it and torch, and prints the cosine of each pair's vectors (min, mean) per
set. Nothing is downloaded: the model directory is given (``tools/assemble_mpnet.py`` makes
all-mpnet-base-v2's).

Usage:
    python tools/compare_with_sentence_transformers.py --model_dir DIR \\
        --st_python /path/to/python-with-sentence-transformers [--builtin_texts 300]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ST_SCRIPT = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
texts = [json.loads(line)["text"] for line in open(sys.argv[2])]
np.save(sys.argv[3], model.encode(texts, batch_size=16, convert_to_numpy=True))
"""


def texts(builtin: int, long: int) -> dict[str, list[str]]:
    """The sets compared: the first ``builtin`` built-in texts, and ``long`` texts of
    several built-in passages each (over 384 tokens)."""
    from beam_jax.text import builtin_corpus

    corpus = [t for _, t in builtin_corpus()]
    joined = []
    for i in range(long):
        parts = corpus[i * 12 : (i + 1) * 12]
        joined.append(" ".join(parts))
    return {"built-in corpus": corpus[:builtin], "longer than max_seq_length": joined}


def flagship(model_dir: str, rows: list[str], work: pathlib.Path) -> np.ndarray:
    source = work / "texts.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(rows)))
    out = work / "out"
    subprocess.run(
        [sys.executable, "-m", "pipelines.embed", "--input", str(source), "--output", str(out),
         "--model_dir", model_dir, "--matmuls", "float32", "--no-progress"],
        check=True,
    )  # fmt: skip
    table = pa.concat_tables(
        pq.read_table(f) for f in sorted(glob.glob(f"{out}/embeddings-*.parquet"))
    )
    order = np.argsort(table.column("id").to_numpy())
    return np.array(table.column("embedding").to_pylist(), np.float64)[order]


def sentence_transformers(model_dir: str, st_python: str, work: pathlib.Path) -> np.ndarray:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [st_python, "-c", ST_SCRIPT, model_dir, str(work / "texts.jsonl"), str(work / "st.npy")],
        check=True, env={**env, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    return np.load(work / "st.npy").astype(np.float64)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, help="a sentence-transformers directory")
    parser.add_argument("--st_python", required=True,
                        help="a Python with sentence-transformers and torch")  # fmt: skip
    parser.add_argument("--builtin_texts", type=int, default=300,
                        help="how many built-in texts (default 300)")  # fmt: skip
    parser.add_argument("--long_texts", type=int, default=20,
                        help="how many texts over max_seq_length (default 20)")  # fmt: skip
    args = parser.parse_args(argv)
    found = {}
    for name, rows in texts(args.builtin_texts, args.long_texts).items():
        with tempfile.TemporaryDirectory() as work:
            work = pathlib.Path(work)
            ours = flagship(args.model_dir, rows, work)
            theirs = sentence_transformers(args.model_dir, args.st_python, work)
        c = cosines(ours, theirs)
        found[name] = (float(c.min()), float(c.mean()))
        print(f"{name}: {len(rows)} texts, cosine min {c.min():.7f}, mean {c.mean():.7f}")
    return found


if __name__ == "__main__":
    main()
