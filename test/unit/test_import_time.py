"""Importing a module of ``src/`` reads nothing: no environment, no file, no kernel probe, no setting looked up.

Module-level code may build constants only: the calls it makes are those listed in ``PURE`` (compiled
patterns, frozen sets, paths made of strings, the module's own record classes), checked with ``ast``
without importing anything.  What must run at import is listed in ``AT_IMPORT`` with its reason.
docs/development.md, "Who reads the environment", says the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "training_toolkit"

PURE = {"re.compile", "frozenset", "tuple", "str", "object", "TypeVar", "Path", "Path(__file__).parent",
        "range", "MappingProxyType", "ipaddress.ip_network", "weakref.WeakValueDictionary", "one_of", "' or '.join"}
AT_IMPORT = {
    "__main__.py": "`python -m training_toolkit`: running `main` when run is its job",
    "stalls/stackhook/sitecustomize.py": "it is the user's ranks' sitecustomize: installing its hook at import is its job",
}


def module_level_calls(path: Path) -> list[tuple[int, str]]:
    """The calls module-level code of ``path`` makes that are neither ``PURE`` nor its own classes."""
    tree = ast.parse(path.read_text(), str(path))
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.If) and ("__name__" in ast.unparse(node.test) or "TYPE_CHECKING" in ast.unparse(node.test)):
            continue
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            callee = ast.unparse(call.func)
            if callee not in PURE and callee not in classes:
                found.append((call.lineno, callee))
    return found


def test_module_level_code_builds_constants_only():
    found = {path.relative_to(SRC).as_posix(): calls for path in sorted(SRC.rglob("*.py"))
             if (calls := module_level_calls(path))}
    assert {name: calls for name, calls in found.items() if name not in AT_IMPORT} == {}
    assert sorted(set(AT_IMPORT) - set(found)) == []  # a module that no longer needs it leaves the list


def test_the_check_sees_a_probe_at_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\nfrom typing import NamedTuple\n\nclass Row(NamedTuple):\n    a: int\n\n"
                      "ROWS = (Row(1),)\nPIDFDS = _probe()\nHOME = os.environ.get('HOME')\n"
                      "if __name__ == '__main__':\n    print(ROWS)\n")
    assert module_level_calls(source) == [(8, "_probe"), (9, "os.environ.get")]
