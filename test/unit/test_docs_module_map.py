"""docs/architecture.md's module map names every module of src/training_toolkit, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "training_toolkit"


def modules_in_tree() -> set[str]:
    found = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    return found | {str(p.relative_to(PACKAGE)) for p in PACKAGE.glob("native/*.c")}


def modules_in_map() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| layer")]
    return {name for row in rows for name in re.findall(r"`([\w/]+\.(?:py|c))`", row.split("|")[2])}


def test_the_module_map_is_the_tree():
    tree, mapped = modules_in_tree(), modules_in_map()
    assert sorted(tree - mapped) == [], "modules missing from docs/architecture.md's module map"
    assert sorted(mapped - tree) == [], "the module map names modules that do not exist"
