"""The toolkit's own lines on stderr."""

from __future__ import annotations

import io
import sys

from training_toolkit.core.log import log


def test_a_line_with_the_prefix_on_stderr(capsys):
    log("failed: algo-2: train.py exited with code 3")
    assert capsys.readouterr().err == "training-toolkit: failed: algo-2: train.py exited with code 3\n"


def test_a_closed_stderr_is_not_an_error(monkeypatch):
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    log("nobody hears this")
