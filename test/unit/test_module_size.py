"""An alarm, not a design rule: no module of ``src/`` is over 320 lines.

A module is split where its concepts split (docs/architecture.md); a module that grows past this
length usually holds two, and the alarm asks the next engineer to look.  There are no exceptions.
"""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "training_toolkit"
MOST_LINES = 320


def lengths() -> dict[str, int]:
    return {path.relative_to(SRC).as_posix(): len(path.read_text().splitlines()) for path in SRC.rglob("*.py")}


def over_the_limit(found: dict[str, int]) -> dict[str, int]:
    return {name: n for name, n in found.items() if n > MOST_LINES}


def test_no_module_is_over_the_limit():
    found = lengths()
    assert "cli.py" in found and len(found) > 50  # it read the package, not an empty tree
    over = over_the_limit(found)
    assert over == {}, f"look at these (at most {MOST_LINES} lines each: one concept a module): {over}"


def test_the_check_finds_what_it_is_for():
    assert over_the_limit({"long.py": MOST_LINES + 1, "edge.py": MOST_LINES, "short.py": 10}) == {"long.py": MOST_LINES + 1}
