"""The README's quick start runs as written, in a fresh interpreter, with its kernel under
JAX's strict dtype promotion (docs/testing.md)."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_quick_start_runs_as_written(tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", readme, re.S)[0]
    script = tmp_path / "quick_start.py"
    strict = 'import jax\njax.config.update("jax_numpy_dtype_promotion", "strict")\n'
    script.write_text(strict + code)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert sum(line.startswith(("(0,", "(1,", "(2,", "(3,")) for line in lines) == 4, lines
    assert any(
        line.startswith("bad validation") and "axis 1 must have size 64" in line for line in lines
    ), lines
    assert "make run" in readme and "make test" in readme and "make install" in readme
