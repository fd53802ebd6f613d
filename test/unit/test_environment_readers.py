"""Who reads the process environment: only the modules listed here, each for its stated reason.

Everything else is handed what it needs: settings parsed once (``settings.parse`` of the mapping
``cli`` read), the platform's view of ``Facts.environ``, or the caller's environment as an argument
(``RunContext.environ``, ``run_local(environ=...)``).  Read from the source with ``ast``, nothing
imported: ``os.environ``, ``os.environb``, ``os.getenv``, ``os.putenv``, ``os.unsetenv``, however
``os`` was imported or renamed, and ``from os import environ``.  docs/development.md, "Who reads the
environment", says the same and what is still to go.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "training_toolkit"
READERS = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}

ALLOWED = {
    # entry points: each reads its own process's environment once and hands it on
    "cli.py": "`train` and `training-toolkit`: hands os.environ to flow/settings and to `local`",
    "runners/ps_server.py": "the parameter server's own program: the TF_CONFIG its runner gave it",
    "local/reaper.py": "the reaper's own program: the launcher's environment (DOCKER_HOST) through its dead-man switch",
    "stalls/stackhook/sitecustomize.py": "runs inside the user's ranks, not the toolkit: where its runner said stacks go",
}


def environment_reads(path: Path) -> list[int]:
    """The lines of ``path`` that read (or change) the process environment."""
    tree = ast.parse(path.read_text(), str(path))
    os_names = {"os"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names.update(alias.asname or alias.name for alias in node.names if alias.name == "os")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [node.lineno for alias in node.names if alias.name in READERS]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in READERS
                and isinstance(node.value, ast.Name) and node.value.id in os_names):
            found.append(node.lineno)
    return sorted(found)


def readers() -> dict[str, list[int]]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        lines = environment_reads(path)
        if lines:
            found[path.relative_to(SRC).as_posix()] = lines
    return found


def test_only_the_listed_modules_read_the_environment():
    found = readers()
    unlisted = {name: lines for name, lines in found.items() if name not in ALLOWED}
    assert unlisted == {}, ("these modules read os.environ/getenv: take the value from the settings or as an "
                            f"argument from the caller (docs/development.md, 'Who reads the environment'): {unlisted}")


def test_every_listed_module_still_reads_it():
    """A module that no longer reads the environment leaves the list (it cannot be allowed to again by mistake)."""
    assert sorted(set(ALLOWED) - set(readers())) == []


def test_the_check_sees_every_way_of_reading(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os as o\nfrom os import getenv\nimport sys\n\n"
                      "def f():\n    return o.environ.get('A'), getenv('B'), sys.path, o.path.join('a')\n"
                      "def g(environ):\n    return environ.get('C')\n")
    assert environment_reads(source) == [2, 6]
