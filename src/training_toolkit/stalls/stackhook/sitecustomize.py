"""On a rank's ``PYTHONPATH`` while the toolkit watches for stalls: its stack, on request, without ptrace.

A default docker or podman container grants no ``CAP_SYS_PTRACE``, so py-spy
cannot read a stuck rank there.  Python's own faulthandler can: registered on
a real-time signal at interpreter start, it writes every thread's stack from
a C signal handler, even while the main thread is blocked in native code (an
MPI allreduce, a NCCL wait).  The file is ``$TRAINING_TOOLKIT_STACKS_DIR/<pid>.stack``;
``training_toolkit.stalls.stacks`` sends the signal only to a process whose
``/proc/<pid>/status`` shows the signal caught, so a process that exec'd
something else (handler gone) is never killed by it.

This directory holds nothing else: then the ``sitecustomize`` it shadows (a
distribution's, a virtualenv's) is imported as if this one were not there.
"""

import os
import sys

STACK_SIGNAL_OFFSET = 3  # SIGRTMIN + 3; training_toolkit.stalls.stacks sends the same


def _register():
    directory = os.environ.get("TRAINING_TOOLKIT_STACKS_DIR")
    if not directory:
        return None
    try:
        import faulthandler
        import signal

        out = open(os.path.join(directory, f"{os.getpid()}.stack"), "w")  # noqa: SIM115 - faulthandler keeps it
        faulthandler.register(signal.SIGRTMIN + STACK_SIGNAL_OFFSET, file=out, all_threads=True, chain=False)
        return out
    except (OSError, ValueError, AttributeError, RuntimeError):
        return None  # no stacks directory (a process outside the job's host) or no such signal: no hook


def _chain():
    """Import the next ``sitecustomize`` on the path, the one this file shadows."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401 - the shadowed one, run for its side effects
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved


_stack_file = _register()
_chain()
