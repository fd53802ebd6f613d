"""The toolkit's native parts, built from the C sources beside this file at install time (setup.py).

Found next to this module, never on PATH: the paths are the same on every host of a
job because every host runs the same image (the same holds for mpirun and Python).
"""

from __future__ import annotations

from pathlib import Path

from training_toolkit.core.errors import ToolkitError

HOSTNAME_LIBRARY = "libtrainingtoolkit_hostname.so"  # preloaded into every MPI rank: gethostname() is its host
NETSHIM_LIBRARY = "libtrainingtoolkit_netshim.so"  # preloaded into Open MPI's runtime and ranks: outsiders' connections closed
RANK_STOP_LIBRARY = "libtrainingtoolkit_rankstop.so"  # preloaded into ranks: one stop; MPI_Abort during a stop ends its rank alone
RANK_PROGRAM = "training-toolkit-rank"  # what every MPI rank runs: its command and environment from its host's file
DEADMAN_PROGRAM = "training-toolkit-deadman"  # ends what must not outlive its owner when the owner dies (supervise/deadman.py)
SSH_AGENT_PROGRAM = "training-toolkit-ssh"  # mpirun's and every daemon's rsh agent: ssh with its host's job config
TERM_BLOCKED_PROGRAM = "training-toolkit-term-blocked"  # Open MPI 5's daemons start with SIGTERM blocked through it

HERE = Path(__file__).parent  # absolute already (a module's __file__ is): nothing read at import


class NativeMissing(ToolkitError):
    """The toolkit was installed without its native parts (no C compiler at install time)."""

    exit_code = 70


def path_of(name: str, directory: Path = HERE) -> Path:
    """The built file ``name``; NativeMissing saying how to build it when it is not there."""
    path = directory / name
    if not path.is_file():
        raise NativeMissing(
            f"{path} is missing: the toolkit's native parts are built when it is installed, with a C compiler "
            "(pip install . ; from a checkout: python setup.py build_ext --inplace)")
    return path
