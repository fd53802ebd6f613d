"""What each MPI rank runs and sees, delivered on its own host: nothing of the job travels with mpirun.

Open MPI's launch messages cross the job's network in clear (zlib, no encryption): every
variable passed with ``-x`` and the ranks' whole command line, hyperparameters included,
could be read by anyone on that network.  So each host's ``train`` writes, once, a
*rank file* on its own host: the working directory, the command and the environment
of its ranks, the contract of that host (its own ``SM_CURRENT_HOST``...).  mpirun
starts every rank as ``training-toolkit-rank`` (a C program: about a millisecond,
where a Python wrapper took ~50 ms), which reads the file ``TRAINING_TOOLKIT_RANK_FILE``
names: each host sets it for whatever starts its ranks there (mpirun's environment on the
lead, its own sshd's ``SetEnv`` for the daemons elsewhere), so each host's file is at
a path of that host's own choosing, in a new private directory of a random name
(``rundir``): unique even where hosts share ``/tmp``, and where an ordinary user may write.
The program keeps only Open MPI's runtime variables of what it inherits
(native/rank_exec.c), so a rank sees the same on every host.

Builders are pure; ``write_rank_file`` is the one writer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from training_toolkit.supervise import rundir

from training_toolkit.config import settings
from training_toolkit.core.errors import ClusterError
from training_toolkit.job.mpi_options import CustomMpiOptions
from training_toolkit.runners.netshim import PRELOAD, preload_list
from training_toolkit.config.settings import without_secrets

# The reference sets these for every MPI rank (mpirun -x); a value the platform or the user put in the
# environment is kept (the reference overrides it), --NCCL_DEBUG and -x of the custom options win over both.
NCCL_DEFAULTS = {"NCCL_DEBUG": "INFO", "NCCL_MIN_NRINGS": "4"}
# What mpirun itself needs of the toolkit's environment: finding programs and libraries, ssh's home, the
# locale, and Open MPI's own settings (the MCA variables, which it does pass on to its daemons).
MPIRUN_VARIABLES = frozenset({"PATH", "LD_LIBRARY_PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TMPDIR",
                              "OPAL_PREFIX"})
MPIRUN_PREFIXES = ("LC_", "OMPI_MCA_", "PMIX_MCA_", "PRTE_MCA_")
HOST_VARIABLE = "SM_CURRENT_HOST"  # what native/hostname.c answers gethostname() with
FILE_MAGIC = "training-toolkit-rank-1"  # native/rank_exec.c reads this version only
DIR_PREFIX = "training-toolkit-ranks-"
FILE_NAME = "rank.env"
RANK_FILE_VAR = settings.RANK_FILE_VAR  # native/rank_exec.c reads the file it names when given none
# mpirun runs ``training-toolkit-rank --attempt N``: the rank waits until its host's file holds ATTEMPT_VAR=N (the
# file of the attempt's hosts, written after the barrier that chose them), at most 60 s (native/rank_exec.c)
ATTEMPT_FLAG = "--attempt"
ATTEMPT_VAR = settings.RANK_ATTEMPT_VAR
_JOB_ID = re.compile(r"^[0-9a-f]{1,64}$")


def rank_environment(script_env: Mapping[str, str], *, interface: str, custom: CustomMpiOptions,
                     extra: Mapping[str, str], preload: Sequence[str]) -> dict[str, str]:
    """Every rank's environment on this host: the host's contract, NCCL's defaults, the custom options' variables.

    ``-x NAME`` without a value keeps this host's own value (every host of a job has the
    same environment, so it is what mpirun would have forwarded).  ``preload`` (the
    gethostname library, the accept() shim) is added after the user's ``LD_PRELOAD``,
    never instead of it.
    """
    env = dict(script_env)
    for name, value in {**NCCL_DEFAULTS, "NCCL_SOCKET_IFNAME": interface}.items():
        env.setdefault(name, value)
    if custom.nccl_debug is not None:
        env["NCCL_DEBUG"] = custom.nccl_debug
    for name, value in custom.rank_variables:
        if value is not None:
            env[name] = value
    env.update(extra)
    if preload:
        env[PRELOAD] = preload_list(env.get(PRELOAD), preload)
    return without_secrets(env)


def needs_hostname_preload(kernel_name: str, host: str) -> bool:
    """Whether gethostname() must be told the rank's host: not where the kernel already says it.

    SageMaker names every container ``aws``: there it must.  A pod, a Slurm node and a local host
    are named after their host already, a pod whose job names it by its FQDN (JobSet: ``pod.subdomain``)
    by the FQDN's first label: there ``gethostname()`` stays what the kernel says, as it does for every
    other program of that host (and Open MPI 5's mpirun finds itself in ``--host`` by that name).
    """
    return kernel_name not in (host, host.split(".", 1)[0])


def mpirun_environment(environ: Mapping[str, str], preload: Sequence[str] = (),
                       extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """mpirun's own environment: what it needs to run, nothing of the job (it would not stay on this host).

    ``preload`` and ``extra`` are what the libraries need (runners/mpi.py: the gethostname
    library with ``SM_CURRENT_HOST``, so that Open MPI 5 (PRRTE) finds itself in ``--host``
    by its name where every kernel host name is ``aws``; the accept() shim with its addresses).
    """
    env = {k: v for k, v in without_secrets(environ).items() if k in MPIRUN_VARIABLES or k.startswith(MPIRUN_PREFIXES)}
    env.update(extra or {})
    if preload:
        env[PRELOAD] = preload_list(None, preload)
    return env


def encode_rank_file(cwd: str, argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """The file native/rank_exec.c reads: NUL-separated magic, cwd, argc, argv, then NAME=VALUE entries."""
    if not argv:
        raise ValueError("a rank needs a command")
    records = [FILE_MAGIC, cwd, str(len(argv)), *argv, *(f"{k}={v}" for k, v in sorted(env.items()))]
    for name in env:
        if not name or "=" in name:
            raise ValueError(f"{name!r} cannot be an environment variable's name")
    data = [r.encode("utf-8", "surrogateescape") for r in records]
    if any(b"\0" in r for r in data):
        raise ValueError("a rank's command or environment holds a NUL byte")
    return b"".join(r + b"\0" for r in data)


def rank_dir_prefix(job_id: str) -> str:
    """The name of this host's ranks' directory, before its random part: the job's id (not a secret), checked."""
    if not _JOB_ID.match(job_id):
        raise ClusterError(f"the job id {job_id!r} from the lead is not a hex string")
    return f"{DIR_PREFIX}{job_id}-"


def new_rank_file_path(job_id: str, where: Path) -> Path:
    """Where this host keeps its ranks' file: in a new private directory of a random name under ``where``
    (``rundir.parent``)."""
    prefix = rank_dir_prefix(job_id)
    try:
        return rundir.new_private_dir(prefix, where) / FILE_NAME
    except OSError as exc:
        raise ClusterError(f"{where}: cannot make the ranks' directory: {exc.strerror or exc}") from None


def node_rank_file_path(job_id: str, node: str, where: Path) -> Path:
    """Through Slurm's launch: this host's ranks' file in a new private directory named after the job and the node.

    Every daemon gets mpirun's one environment there, so the name is one each host computes alike but for its
    node's name (runners/mpi.py: ``slurm_paths``), not a random one; made as ``mkdir`` makes it (0700, an
    existing one refused: the job fails naming it rather than use a directory it did not make).
    """
    if not node or "/" in node or node.startswith("."):
        raise ClusterError(f"the node name {node!r} cannot name a directory")
    path = where / f"{rank_dir_prefix(job_id)}{node}"
    try:
        os.mkdir(path, 0o700)
    except OSError as exc:
        raise ClusterError(f"{path}: cannot make the ranks' directory: {exc.strerror or exc}") from None
    return path / FILE_NAME


def rewrite_rank_file(path: Path, data: bytes) -> None:
    """Replace an existing rank file whole (a restart's attempt): written aside, then renamed over it."""
    aside = path.with_name(path.name + ".next")
    try:
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(aside, path)
    except OSError as exc:
        raise ClusterError(f"{path}: cannot rewrite the ranks' file: {exc.strerror or exc}") from None


def write_rank_file(path: Path, data: bytes) -> None:
    """Write it readable by its owner only, as a new file (an existing one is refused) in its new directory."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise ClusterError(f"{path}: cannot write the ranks' file: {exc.strerror or exc}") from None
