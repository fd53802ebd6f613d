"""The import graph of ``src/`` has no cycle: no module imports one that imports it back, directly or
through others, and no package does (a subpackage counted as one node).

Every import counts: at the top of a module, inside a function, under ``TYPE_CHECKING``.  Read from
the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "training_toolkit"


def module_names() -> dict[str, Path]:
    found = {}
    for path in (ROOT / PACKAGE).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules ``name`` imports (a ``from X import Y`` of a submodule Y counts as Y)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: imports(name, path, known) for name, path in known.items()}


def node_of(name: str) -> str:
    """A module's node at package granularity: a subpackage of ``training_toolkit`` is one node."""
    parts = name.split(".")
    return ".".join(parts[:2])


def package_graph(modules: dict[str, set[str]], package: str = PACKAGE) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for name, targets in modules.items():
        edges = packages.setdefault(node_of(name), set())
        edges.update(node_of(t) for t in targets if node_of(t) not in (node_of(name), package))
    return packages


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_reader_sees_the_agent_and_the_runners():
    modules = graph()
    assert "training_toolkit.runners" in modules and "training_toolkit.agent" in modules
    assert modules["training_toolkit.runners.mpi"], "the reader found none of mpi's imports"


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(graph()) == []


def test_no_package_imports_one_that_imports_it_back():
    """A subpackage (``runners``, ``cluster``, ...) is one node; a top-level module is its own."""
    assert cycles(package_graph(graph())) == []


def test_the_cycle_finder_finds_a_back_arrow_through_a_package():
    modules = {"t.agent": {"t.runners.base"}, "t.runners.single": {"t.agent"}, "t.runners.base": set()}
    assert cycles(modules) == []
    assert cycles(package_graph(modules, "t")) == [["t.agent", "t.runners"]]


def test_no_runner_imports_the_agent_and_the_agent_imports_no_runner():
    """A runner is a spec (runspec.py): the agent and the runners meet there, and in cli, never in each other."""
    modules = graph()
    agent = {m for m in modules if m.startswith("training_toolkit.agent")}
    runners = {m for m in modules if m.startswith("training_toolkit.runners")}
    assert agent and runners
    assert {(r, t) for r in runners for t in modules[r] if t in agent} == set()
    assert {(a, t) for a in agent for t in modules[a] if t in runners} == set()
