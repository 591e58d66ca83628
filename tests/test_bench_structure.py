"""bench/ is a suite, not a lab notebook: a few entry points a user runs, each listed with
its command in bench/README.md, what they share in one private package (``bench._lib``),
no import cycle, no module that patches the library or its dependencies, no module that
changes ``sys.path`` on import, and every module short (its code under its budget)."""

from __future__ import annotations

import ast
import pathlib

from tests.test_pipelines_structure import _formatted_lines

ROOT = pathlib.Path(__file__).parent.parent
BENCH = ROOT / "bench"
# What a user runs: the library against stock Beam and the limit, the embedding flagship
# against its peers and the limit (and with --profile), streaming, soak, the device check.
ENTRY_POINTS = {"run.py", "embed.py", "streaming.py", "soak.py", "device_check.sh"}
MAX_LINES = 400  # per module as ruff formats it (the longest, bench/embed.py, ~330 today)
MAX_TOTAL = 3500  # bench/'s code, its shell script included (~3,470 today)
# The libraries a bench module must not change: imported names bound to these.
GUARDED = ("beam_jax", "pipelines", "jax", "apache_beam", "numpy", "pyarrow", "tokenizers")


def _modules() -> dict[str, pathlib.Path]:
    paths = sorted(BENCH.rglob("*.py"))
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in paths}  # fmt: skip


def test_bench_is_a_few_entry_points_each_in_the_readme_and_one_private_package():
    top = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")} - {"__init__.py"}
    assert top == ENTRY_POINTS
    assert {p.name for p in BENCH.iterdir() if p.is_dir() and p.name != "__pycache__"} == {"_lib"}
    readme = (BENCH / "README.md").read_text()
    for name in ENTRY_POINTS:
        assert f"bench/{name}" in readme, name
    assert "bench/embed.py --profile" in readme and "--quick" in readme


def test_every_module_is_short_and_bench_stays_under_its_budget():
    lines = {name: _formatted_lines(path) for name, path in _modules().items()}
    over = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not over, over
    total = sum(lines.values()) + len((BENCH / "device_check.sh").read_text().splitlines())
    assert total <= MAX_TOTAL, total


def _imports(path: pathlib.Path) -> tuple[set[str], dict[str, str]]:
    """The ``bench`` modules ``path`` imports (anywhere in it), and every name it binds by an
    import, with the module it came from."""
    found, bound = set(), {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = node.module
                found |= {node.module, f"{node.module}.{alias.name}"}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                bound[(alias.asname or alias.name).split(".")[0]] = alias.name
                found.add(alias.name)
    return {m for m in found if m.startswith("bench")}, bound


def test_no_import_cycle_among_the_bench_modules():
    modules = _modules()
    graph = {name: {m for m in _imports(p)[0] if m in modules and m != name}
             for name, p in modules.items()}  # fmt: skip
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join([*path, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert "bench._lib.machine" in graph and "bench._lib.harness" in graph


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def test_no_bench_module_patches_the_library_or_its_dependencies():
    """No attribute of an imported module or class is assigned (``Tokenizer.encode_arrow =
    ...``, ``jax.local_devices = ...``) nor set with ``setattr``: a benchmark measures what
    the library exposes, so a release of Beam, JAX or beam_jax cannot break it silently."""
    patches = []
    for name, path in _modules().items():
        _, bound = _imports(path)
        guarded = {n for n, m in bound.items() if m.split(".")[0] in GUARDED}
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            for t in targets:
                if isinstance(t, ast.Attribute) and _root(t) in guarded:
                    patches.append(f"{name}:{node.lineno} {ast.unparse(t)}")
    assert not patches, patches


def test_no_bench_module_changes_sys_path_on_import():
    """Only a module run as a script (``python bench/run.py``: no ``__package__``) puts the
    repository's root on ``sys.path``; imported as ``bench.run`` (as the tests do) none does."""
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        guarded = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) == "not __package__"
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.path":
                assert id(node) in guarded, f"{name}:{node.lineno} changes sys.path"
