"""What a cluster of namespaces needs of this machine: root, the tools on PATH, a kernel with the namespaces.

Checked before anything is made, every missing part named at once (``netns.NamespaceCluster.start``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from training_toolkit.core.errors import ClusterError

# What start() needs on PATH, with the package that has it.
TOOLS = (("ip", "iproute2"), ("nsenter", "util-linux"), ("unshare", "util-linux"), ("setpriv", "util-linux"),
         ("mount", "mount"), ("umount", "mount"))


def require_privileges_and_tools() -> dict[str, str]:
    """Each tool's path; ClusterError naming every missing prerequisite at once, before anything is created."""
    problems = []
    if os.geteuid() != 0:
        problems.append(
            f"needs root (network and mount namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN; "
            f"running as uid {os.geteuid()})"
        )
    tools = {tool: shutil.which(tool) for tool, _package in TOOLS}
    missing = [f"`{tool}` ({package})" for tool, package in TOOLS if tools[tool] is None]
    if missing:
        problems.append(f"needs {', '.join(missing)} on PATH")
    if not Path("/proc/self/ns/pid_for_children").exists():
        problems.append("needs a kernel with network and PID namespaces (/proc/self/ns/pid_for_children is missing)")
    if problems:
        raise ClusterError("a local cluster " + "; ".join(problems))
    return {tool: path for tool, path in tools.items() if path is not None}
