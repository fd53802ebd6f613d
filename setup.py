"""Builds the toolkit's native parts (libraries and programs) at install time (metadata is in setup.cfg).

- ``libtrainingtoolkit_hostname.so``, preloaded into every MPI rank so that ``gethostname()``
  returns the rank's own host where every container has the kernel host name ``aws``;
- ``libtrainingtoolkit_netshim.so``, preloaded into mpirun, the Open MPI daemons and the ranks:
  a connection accepted from outside the job is closed before the program sees it;
- ``libtrainingtoolkit_rankstop.so``, preloaded into MPI's ranks (and, under Slurm, the script's processes):
  SIGTERMs that come together are one stop, and during a stop a rank's MPI_Abort ends that rank alone;
- ``training-toolkit-rank``, what every MPI rank runs first: it takes the rank's command and
  environment from a file its own host's ``train`` wrote, so that mpirun carries nothing of
  the job, and it starts in about a millisecond where a Python wrapper took ~50 ms; it stays the rank's
  parent, and holds the rank's end from Open MPI's runtime during a stop;
- ``training-toolkit-term-blocked``, which starts Open MPI 5's daemons with SIGTERM blocked;
- ``training-toolkit-deadman``, the dead-man switch (supervise/deadman.py): it waits on a pipe from
  ``train`` (or ``local``) for the whole job and ends what they leave should they be killed.

All are plain C (no Python headers): the install needs a C compiler, nothing else.  The
reference toolkit builds its ``gethostname`` library the same way (a C extension of its
package); AWS's framework images compile theirs when the container starts, which needs a
compiler in every image.
"""

import os
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "training_toolkit.native"
HOSTNAME_LIBRARY = "libtrainingtoolkit_hostname.so"
NETSHIM_LIBRARY = "libtrainingtoolkit_netshim.so"
RANK_STOP_LIBRARY = "libtrainingtoolkit_rankstop.so"
LIBRARIES = {"_hostname": HOSTNAME_LIBRARY, "_netshim": NETSHIM_LIBRARY, "_rankstop": RANK_STOP_LIBRARY}  # plain shared libraries, not modules
RANK_PROGRAM = "training-toolkit-rank"
# Every native part is built with every warning an error: a warning in these files is a bug in code
# that runs inside Open MPI's processes and every rank (test/unit/test_native.py builds them so too).
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
#: programs, from their sources
PROGRAMS = {RANK_PROGRAM: "rank_exec.c", "training-toolkit-deadman": "deadman.c", "training-toolkit-ssh": "ssh_agent.c",
            "training-toolkit-term-blocked": "term_blocked.c"}


class BuildNative(build_ext):
    """A plain shared library (not a Python module) and a program, next to the package's modules."""

    def get_ext_filename(self, fullname):
        # called with the module's last part while building, with its full name when copying in place
        parts = fullname.split(".")
        if parts[-1] in LIBRARIES:
            return os.path.join(*parts[:-1], LIBRARIES[parts[-1]])
        return super().get_ext_filename(fullname)

    def build_extensions(self):
        super().build_extensions()
        for program, source in PROGRAMS.items():
            path = Path("src", *NATIVE.split("."), source)
            objects = self.compiler.compile([str(path)], output_dir=self.build_temp, extra_postargs=["-O2", *WARNINGS])
            self.compiler.link_executable(objects, program, output_dir=self._native_dir(self.build_lib))

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        package_dir = self.get_finalized_command("build_py").get_package_dir(NATIVE)
        for program in PROGRAMS:
            # a copy beside it, then a rename: a program still running from the old file (a job's dead-man
            # switch) keeps it, where writing over it fails with "Text file busy"
            target = os.path.join(package_dir, program)
            shutil.copy2(os.path.join(self._native_dir(self.build_lib), program), target + ".new")
            os.replace(target + ".new", target)

    @staticmethod
    def _native_dir(root):
        path = os.path.join(root, *NATIVE.split("."))
        os.makedirs(path, exist_ok=True)
        return path


setup(
    ext_modules=[Extension(f"{NATIVE}._hostname", sources=["src/training_toolkit/native/hostname.c"],
                           extra_compile_args=["-O2", *WARNINGS]),
                 Extension(f"{NATIVE}._netshim", sources=["src/training_toolkit/native/netshim.c"],
                           extra_compile_args=["-O2", *WARNINGS], libraries=["dl"]),
                 Extension(f"{NATIVE}._rankstop", sources=["src/training_toolkit/native/rank_stop.c"],
                           extra_compile_args=["-O2", *WARNINGS], libraries=["dl"])],
    cmdclass={"build_ext": BuildNative},
)
