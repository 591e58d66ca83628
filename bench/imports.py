"""What each of the launch's imports costs, in fresh processes, against other versions of them.

    python bench/imports.py                                  # this environment, 5 rounds
    python bench/imports.py --rounds 7 --against /tmp/mld070 # and with a folder first on the path

Every process a job starts imports the same stack before it does any work: the launch, each
worker of a portable runner, each test process. On one TPU v5e host those imports took
5.0-5.3 s of a warm 24 s flagship run (``bench/RESULTS.md``), so a version that imports
slowly costs every run. Each round runs, for each variant (the order rotated between
rounds), a fresh interpreter that imports ``--modules`` in order and records when each
import returned; the parent times the whole process, its start and exit included. An
import's seconds are what it adds to the ones before it (``jax`` after ``numpy`` and
``ml_dtypes`` leaves those two out).

A variant is this environment (``installed``) or this environment with a folder first on
``PYTHONPATH`` (``--against DIR``, repeatable), e.g. a folder another version of a package
was installed into with ``pip install --no-deps --target DIR ml-dtypes==0.7.0``. The table
gives each variant's median per import and whole process, the versions it imported, and
the whole process against the first variant's, with the machine's fingerprint and matmul
peak (measured after the runs, so that the runs are not perturbed by it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import harness  # noqa: E402

# The flagship's launch imports, in the order their dependencies come in.
MODULES = (
    "numpy",
    "ml_dtypes",
    "jax",
    "pyarrow",
    "tokenizers",
    "apache_beam",
    "beam_jax",
    "pipelines.embed.job",
)
# The distributions whose versions a variant reports.
VERSIONS = ("numpy", "ml-dtypes", "jax", "jaxlib", "pyarrow", "tokenizers", "apache-beam")


def _child(modules: list[str]) -> None:
    """Imports ``modules`` in order; emits each import's seconds and the versions seen."""
    seconds = {}
    for name in modules:
        start = time.perf_counter()
        importlib.import_module(name)
        seconds[name] = time.perf_counter() - start
    harness.emit({"seconds": seconds, "versions": {d: _version(d) for d in VERSIONS}})


def _version(dist: str) -> str:
    """The version this process imported: the module's own where it was imported (a folder
    first on the path may hold a module without its metadata), else the metadata's."""
    module = sys.modules.get(dist.replace("-", "_"))
    if getattr(module, "__version__", None):
        return module.__version__
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="DIR",
        help="a variant with DIR first on PYTHONPATH (repeatable)",
    )
    parser.add_argument("--modules", default=",".join(MODULES), help="comma-separated, in order")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", help="write the runs and the fingerprint here")
    args = parser.parse_args(argv)
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    missing = [d for d in args.against if not Path(d).is_dir()]
    if args.rounds < 1 or not modules or missing:
        parser.error(
            f"--rounds must be >= 1 ({args.rounds}), --modules must name one module or more "
            f"({args.modules!r}) and each --against must be a folder (not found: {missing})"
        )
    variants = {"installed": None, **{Path(d).name or d: d for d in args.against}}
    envs = {
        label: harness.child_env(*filter(None, [d, str(ROOT)])) for label, d in variants.items()
    }

    def run_one(label: str, _round: int) -> dict:
        argv_child = [sys.executable, __file__, "--child", json.dumps(modules)]
        start = time.perf_counter()
        out = harness.run_child(argv_child, timeout=args.timeout, env=envs[label], what=label)
        out["process_s"] = time.perf_counter() - start
        return out

    runs, orders = harness.run_rounds(list(variants), args.rounds, run_one)
    from fingerprint import fingerprint, format_fingerprint

    info = fingerprint()
    uncompiled = {label: harness.uncompiled(env=env) for label, env in envs.items()}
    print(format_fingerprint(info))
    for label, names in uncompiled.items():
        print(f"{label}: {harness.bytecode_line(names)}")
    print(f"{args.rounds} rounds, a fresh process per variant and round, the order rotated")
    names = " | ".join(modules)
    print(f"| variant | versions | {names} | whole process (s) | against the first |")
    print("|---|---|" + "---|" * len(modules) + "---|---|")
    first = None
    for label, done in runs.items():
        cols = " | ".join(
            f"{statistics.median(d['seconds'][m] for d in done):.3f}" for m in modules
        )
        process = statistics.median(d["process_s"] for d in done)
        first = first or process
        versions = ", ".join(f"{k} {v}" for k, v in done[-1]["versions"].items())
        spread = ", ".join(f"{d['process_s']:.2f}" for d in done)
        ratio = process / first
        print(f"| {label} | {versions} | {cols} | {process:.2f} ({spread}) | {ratio:.2f}x |")
    report = {
        "variants": variants,
        "runs": runs,
        "orders": orders,
        "uncompiled": uncompiled,
        "fingerprint": info,
    }
    harness.write_json(args.json, report)
    return report


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]))
    else:
        main()
