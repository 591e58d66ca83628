"""``bench/imports.py``: each launch import's seconds in fresh processes, a folder first on
the path against the installed packages; and ``harness.uncompiled``, which says when the
processes timed compile their modules at every import."""

from __future__ import annotations

import os
import py_compile
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402
import imports  # noqa: E402


def _package(root: Path, name: str, body: str) -> Path:
    (root / name).mkdir(parents=True)
    init = root / name / "__init__.py"
    init.write_text(body)
    return init


def test_a_folder_first_on_the_path_is_a_variant_timed_beside_the_installed(tmp_path, capsys):
    # The folder's colorsys shadows the standard library's and sleeps as it imports: its
    # variant must be the one that takes the extra 0.3 s, in its own processes.
    slow = tmp_path / "slow_colorsys"
    _package(slow, "colorsys", "import time\ntime.sleep(0.3)\n")
    report = imports.main(
        ["--rounds", "2", "--modules", "csv,colorsys", "--against", str(slow),
         "--json", str(tmp_path / "r.json")]
    )  # fmt: skip
    runs = report["runs"]
    assert list(runs) == ["installed", "slow_colorsys"]
    assert report["orders"] == [["installed", "slow_colorsys"], ["slow_colorsys", "installed"]]
    for done in runs["slow_colorsys"]:
        assert done["seconds"]["colorsys"] >= 0.3
    for done in runs["installed"]:
        assert done["seconds"]["colorsys"] < 0.3
        assert done["process_s"] > done["seconds"]["csv"] + done["seconds"]["colorsys"]
    out = capsys.readouterr().out
    assert "| variant | versions | csv | colorsys | whole process (s) | against the first |" in out
    assert "| slow_colorsys | " in out and "matmul peak" in out
    assert (tmp_path / "r.json").exists()


def test_a_missing_folder_or_no_module_is_refused(tmp_path, capsys):
    for argv in (["--against", str(tmp_path / "nowhere")], ["--modules", " , "], ["--rounds", "0"]):
        try:
            imports.main(argv)
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"{argv} was accepted")
    assert "each --against must be a folder" in capsys.readouterr().err


def test_packages_without_cached_bytecode_are_named_where_processes_cannot_write_it(tmp_path):
    init = _package(tmp_path, "bench_fake_pkg", "X = 1\n")
    env = harness.child_env(str(tmp_path))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONPYCACHEPREFIX", None)
    names = ["bench_fake_pkg", "json"]
    assert harness.uncompiled(names, env=env) == ["bench_fake_pkg"]
    assert "NOT cached for bench_fake_pkg" in harness.bytecode_line(["bench_fake_pkg"])
    # Compiled as an install would: nothing is missing.
    py_compile.compile(str(init), cfile=_cached(init))
    assert harness.uncompiled(names, env=env) == []
    assert harness.bytecode_line([]).startswith("bytecode: cached for every package")


def _cached(source: Path) -> str:
    import importlib.util

    path = importlib.util.cache_from_source(str(source))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path
