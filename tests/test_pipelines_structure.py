"""The example pipelines stay thin: at most 2,900 lines, no import cycles among the modules
of ``pipelines/``, and at most five levels of imports (a module that imports none of them is
level 1)."""

from __future__ import annotations

import ast
import functools
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent / "pipelines"


def _graph() -> dict[str, set[str]]:
    """Each module of ``pipelines/`` and the modules of ``pipelines/`` it imports (anywhere
    in it, function bodies included)."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipelines"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("pipelines")}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state:
                found = visit(dep, [*path, dep])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


MAX_LEVELS = 5


def _levels(graph: dict[str, set[str]]) -> dict[str, int]:
    @functools.cache
    def level(node: str) -> int:
        return 1 + max((level(d) for d in graph[node]), default=0)

    return {node: level(node) for node in graph}


def _chain(graph: dict[str, set[str]], levels: dict[str, int], node: str) -> list[str]:
    chain = [node]
    while graph[chain[-1]]:
        chain.append(max(graph[chain[-1]], key=levels.get))
    return chain


# As ruff formats them: 2,922 today. The headroom takes a flag or a small step; a helper copied
# from one pipeline into another (which belongs in the library) soon meets the limit.
MAX_LINES = 2950


def _formatted_lines(path: pathlib.Path) -> int:
    """The lines of ``path`` as ``ruff format`` writes it (the project's settings)."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
        input=path.read_text(),
        capture_output=True,
        text=True,
        cwd=ROOT.parent,
        check=True,
    )
    return len(proc.stdout.splitlines())


def test_pipelines_stay_under_max_lines_as_ruff_formats_them():
    """What a second pipeline would copy belongs in the library, not in the examples.

    Counted as the formatter writes each file, and no line may keep it from doing so
    (``fmt: skip``/``fmt: off``), so the count is of code laid out as everywhere else."""
    paths = sorted(ROOT.rglob("*.py"))
    unformatted = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in paths
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "fmt: skip" in line or "fmt: off" in line
    ]
    assert not unformatted, unformatted
    # Keyed by path: embed/ and curate/ each have a job.py, an __init__.py, a __main__.py.
    lines = {str(p.relative_to(ROOT)): _formatted_lines(p) for p in paths}
    assert sum(lines.values()) <= MAX_LINES, (
        sum(lines.values()),
        sorted(lines.items(), key=lambda kv: -kv[1])[:5],
    )


def test_pipelines_have_at_most_five_levels_of_imports():
    graph = _graph()
    levels = _levels(graph)
    deepest = max(levels, key=levels.get)
    assert levels[deepest] <= MAX_LEVELS, " -> ".join(_chain(graph, levels, deepest))


def test_the_graph_sees_the_flagships_imports():
    graph = _graph()
    assert "pipelines.embed.write" in graph["pipelines.embed.job"]
    assert "pipelines.embed.parts" in graph["pipelines.embed.write"]


def test_pipelines_import_no_cycle():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_levels_count_the_longest_chain():
    graph = {"a": {"b", "d"}, "b": {"c"}, "c": set(), "d": set()}
    assert _levels(graph) == {"a": 3, "b": 2, "c": 1, "d": 1}
    assert _chain(graph, _levels(graph), "a") == ["a", "b", "c"]


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
