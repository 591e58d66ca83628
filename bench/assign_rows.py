"""Host cost of ``assign_rows`` (placing records in packed rows): this tree against a revision.

Pure and fast (tokenization and numpy, no encoder run). The built-in corpus, tokenized as
the flagship does (all-MiniLM-L6-v2's tokenizer, 256 tokens at most) and cycled to ``--n``
lengths, is placed in rows of (64, 256) tokens, buffer by buffer, by this tree's
``assign_rows`` and by the one in ``beam_jax/_src/bucketing/packing.py`` at ``--ref``,
alternately, ``--repeats`` times each; it prints the best time of each, their ratio, and
whether both placed every record alike (the first buffers compared in full).

Usage:
    python bench/assign_rows.py [--ref main] [--n 200000] [--buffers 0,8192,1024,128]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import beam_jax as bj  # noqa: E402
from beam_jax._src.bucketing.packing import assign_rows  # noqa: E402
from beam_jax.text import SentenceEncoder, builtin_corpus  # noqa: E402

FIELDS = ("row", "segment", "offset", "row_lengths", "used", "counts", "refused")
CONFIGS = {
    "first fit, classes (64, 256)": dict(row_lengths=(64, 256), pack_lengths=(64, 256)),
    "first fit, one class": dict(row_lengths=(64, 256)),
    "best fit, classes (64, 256)": dict(
        row_lengths=(64, 256), pack_lengths=(64, 256), algorithm="best_fit"
    ),
    "first fit, classes, max_segments=8": dict(
        row_lengths=(64, 256), pack_lengths=(64, 256), max_segments=8
    ),
}


def _module_at(ref: str, tmp: str):
    """``beam_jax/_src/bucketing/packing.py`` as it was at ``ref``, imported on its own."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:beam_jax/_src/bucketing/packing.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tmp) / "packing_at_ref.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("packing_at_ref", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["packing_at_ref"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="main")
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--buffers", default="0,8192,1024,128", help="0: one buffer of all")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    texts = [t for _, t in builtin_corpus()]
    tokenized = SentenceEncoder.from_dir().tokenizer().encode_batch(texts)
    base = np.asarray([len(ids) for ids in tokenized], np.int64)
    lengths = base[np.arange(args.n) % len(base)]
    print(
        f"{args.n} lengths: mean {lengths.mean():.1f}, max {lengths.max()}, "
        f"{len(np.unique(lengths))} distinct; this tree against {args.ref}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        old = _module_at(args.ref, tmp)
        for buffer in (int(b) for b in args.buffers.split(",")):
            step = buffer or args.n
            chunks = [lengths[s : s + step] for s in range(0, args.n, step)]
            for name, options in CONFIGS.items():
                then, now = old.Packing(**options), bj.Packing(**options)
                best = {"ref": np.inf, "tree": np.inf}
                for _ in range(args.repeats):  # alternately, so load drifts hit both
                    for label, place, packing in (
                        ("ref", old.assign_rows, then),
                        ("tree", assign_rows, now),
                    ):
                        start = time.perf_counter()
                        for chunk in chunks:
                            place(chunk, packing)
                        best[label] = min(best[label], time.perf_counter() - start)
                same = all(
                    np.array_equal(getattr(old.assign_rows(c, then), f), getattr(b, f))
                    for c in chunks[:3]
                    for b in [assign_rows(c, now)]
                    for f in FIELDS
                )
                print(
                    f"buffer {step:>7}  {name:36s} {args.ref} {best['ref'] * 1e3:8.1f} ms  "
                    f"tree {best['tree'] * 1e3:8.1f} ms  ratio {best['ref'] / best['tree']:5.1f}x"
                    f"  ({best['ref'] / args.n * 1e6:.2f} vs "
                    f"{best['tree'] / args.n * 1e6:.2f} us/record)  same: {same}"
                )


if __name__ == "__main__":
    main()
