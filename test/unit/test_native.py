"""Every native part compiles without a warning (-Wall -Wextra -Werror, as setup.py builds them) at every optimisation level.

Some of gcc's warnings (string overflows, uninitialised values) come only with the optimiser's
analysis, so the sources are compiled at each level, not only at setup.py's -O2.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from training_toolkit import native

pytestmark = pytest.mark.process  # tier: starts processes (test/helpers/tiers.py)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(native.HERE.glob("*.c"))
COMPILER = shutil.which("cc") or shutil.which("gcc")
PROGRAMS = ("rank_exec.c", "deadman.c", "ssh_agent.c", "term_blocked.c")


def test_setup_builds_every_part_with_every_warning_an_error():
    text = (ROOT / "setup.py").read_text()
    assert 'WARNINGS = ["-Wall", "-Wextra", "-Werror"]' in text
    # every library's compile arguments (one Extension per library source) and the rank program's
    libraries = [p for p in SOURCES if p.name not in PROGRAMS]  # the programs
    assert len(re.findall(r"extra_compile_args=\[\"-O2\", \*WARNINGS\]", text)) == len(libraries)
    assert len(re.findall(r"extra_compile_args=", text)) == len(libraries)
    assert 'extra_postargs=["-O2", *WARNINGS]' in text
    assert {p.name for p in SOURCES} == {"hostname.c", "netshim.c", "rank_exec.c", "rank_stop.c", "deadman.c",
                                         "ssh_agent.c", "term_blocked.c"}


@pytest.mark.skipif(COMPILER is None, reason="no C compiler")
@pytest.mark.parametrize("level", ["-O0", "-O2", "-O3", "-Os"])
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_warning(source, level, tmp_path):
    shared = [] if source.name in PROGRAMS else ["-fPIC", "-shared"]
    proc = subprocess.run([COMPILER, level, "-Wall", "-Wextra", "-Werror", *shared, "-o", str(tmp_path / "out"),
                           str(source), "-ldl"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
