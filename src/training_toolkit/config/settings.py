"""Settings: every ``TRAINING_TOOLKIT_*`` variable (and ``SAGEMAKER_BASE_DIR``), parsed once at the start.

One table, ``VARIABLES``, gives each variable its field, kind of value
(``settings_values``), default and a one-line doc; the parsing, README's
settings table and the ``--help`` texts (``settings_help``) all come from it.  A bad value is one ``ConfigError``
naming the variable and what was expected (exit 78), raised before anything
starts.  Flags (``--base-dir``, ``--grace-period``) win over variables.  An
empty variable counts as unset.

The result, ``Settings``, reaches the runners through ``RunContext``; nothing
else reads these variables from the environment.  The job secret is read here
too (the variable, else the file ``input/config/job_secret``), once; the caller
then drops it from the environment it passes on (``without_secrets``), so no
child can inherit it.  A platform adds what it knows as typed ``Overrides``
(``override``): they stand in for a variable the job did not set, and never
win over one that it did.

On the launch path: ``NamedTuple``s and small functions, no ``dataclasses``,
no ``argparse`` (see docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from training_toolkit.core import names
from training_toolkit.config import settings_values as values
from training_toolkit.core.errors import ConfigError
from training_toolkit.core.paths import Paths
from training_toolkit.config.settings_values import KeyFiles

JOB_SECRET = "TRAINING_TOOLKIT_JOB_SECRET"
SECRET_VARIABLES = (JOB_SECRET,)  # never passed to a child: the script, pip, mpirun, ssh


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a child process: the toolkit's secrets left out."""
    return {k: v for k, v in environ.items() if k not in SECRET_VARIABLES}


# Set by the toolkit for its own children, never by a platform: not settings, yet not typos either.
SUPERVISOR_VAR = "TRAINING_TOOLKIT_SUPERVISOR"  # marks every descendant of a supervised child (supervise/process.py)
RANK_TAG_VAR = "TRAINING_TOOLKIT_RANK_TAG"  # how each host finds its own MPI ranks (runners/mpi.py)
RESTART_COUNT_VAR = "TRAINING_TOOLKIT_RESTART_COUNT"  # the script's attempt, from 0 (docs/resilience.md)
HEARTBEAT_DIR_VAR = "TRAINING_TOOLKIT_HEARTBEAT_DIR"  # where a rank may touch a file as its heartbeat
STACKS_DIR_VAR = "TRAINING_TOOLKIT_STACKS_DIR"  # where a rank's faulthandler writes its stack (stackhook)
NETSHIM_ALLOW_VAR = "TRAINING_TOOLKIT_NETSHIM_ALLOW"  # the accept() shim's job addresses (native/netshim.c)
NETSHIM_PORTS_VAR = "TRAINING_TOOLKIT_NETSHIM_PORTS"  # the local ports it checks, LOW-HIGH (unset: every port)
RANK_STOP_FLAG_VAR = "TRAINING_TOOLKIT_RANK_STOP_FLAG"  # a rank's: while this file exists, its host stops its ranks
RANK_RESTART_FLAG_VAR = "TRAINING_TOOLKIT_RANK_RESTART_FLAG"  # a rank's: its host stops it for a restart (no hold)
RANK_STOP_WAIT_VAR = "TRAINING_TOOLKIT_RANK_STOP_WAIT_MS"  # SIGTERMs within it are one stop; a rank's end after one
#                                                           waits as long for one of those files (native/rank_exec.c)
RANK_PID_VAR = "TRAINING_TOOLKIT_RANK_PID"  # the rank's own process (native/rank_exec.c sets it, rank_stop.c reads it)
RANK_PARENT_VAR = "TRAINING_TOOLKIT_RANK_PARENT"  # its parent, training-toolkit-rank, told of its first SIGTERM
RANK_FILE_VAR = "TRAINING_TOOLKIT_RANK_FILE"  # this host's MPI ranks' file (native/rank_exec.c, runners/rank_env.py)
SSH_CONFIG_VAR = "TRAINING_TOOLKIT_SSH_CONFIG"  # this host's job ssh config, for Open MPI's rsh agent (native/ssh_agent.c)
RANK_ATTEMPT_VAR = "TRAINING_TOOLKIT_RANK_ATTEMPT"  # in that file: the attempt it is of (native/rank_exec.c waits for it)
RANKS_DIR_VAR = "TRAINING_TOOLKIT_RANKS_DIR"  # where a rank's parent reports it to its host's train (supervise/reported.py)
INTERNAL_VARIABLES = (SUPERVISOR_VAR, RANK_TAG_VAR, RESTART_COUNT_VAR, HEARTBEAT_DIR_VAR, STACKS_DIR_VAR,
                      NETSHIM_ALLOW_VAR, NETSHIM_PORTS_VAR, RANK_STOP_FLAG_VAR, RANK_RESTART_FLAG_VAR,
                      RANK_STOP_WAIT_VAR, RANK_PID_VAR, RANK_PARENT_VAR, RANK_FILE_VAR, SSH_CONFIG_VAR, RANK_ATTEMPT_VAR,
                      RANKS_DIR_VAR)
PREFIX = "TRAINING_TOOLKIT_"


class Variable(NamedTuple):
    name: str  # the environment variable
    field: str  # its field in Settings
    parse: Callable[[str], Any]  # raw text -> value; ValueError("expected ...") when it is not one
    default: Any
    shown_default: str  # the default as the README and --help show it
    doc: str
    flag: str | None = None  # the command-line flag that wins over it


VARIABLES = (
    Variable("SAGEMAKER_BASE_DIR", "base_dir", values.text, "/opt/ml", "`/opt/ml`", "the job directory", "--base-dir"),
    Variable("TRAINING_TOOLKIT_GRACE_PERIOD", "grace_s", values.grace, 120.0, "120",
             "seconds between forwarding SIGTERM to the script and killing it", "--grace-period"),
    Variable(JOB_SECRET, "job_secret", values.secret, None, "none",
             "the platform's job secret (or the file `input/config/job_secret`); without one, hosts are admitted by "
             "address and every key is random (docs/security.md)"),
    Variable("TRAINING_TOOLKIT_CONTROL_PORT", "control_port", values.port, names.CONTROL_PORT, str(names.CONTROL_PORT),
             "port of the job's control channel on the lead"),
    Variable("TRAINING_TOOLKIT_JOIN_TIMEOUT", "join_timeout_s", values.seconds, 180.0, "180",
             "seconds for every host to join and be ready"),
    Variable("TRAINING_TOOLKIT_HEARTBEAT", "heartbeat_s", values.seconds, names.HEARTBEAT_S, f"{names.HEARTBEAT_S:g}",
             "seconds between the control channel's heartbeats"),
    Variable("TRAINING_TOOLKIT_PEER_TIMEOUT", "peer_timeout_s", values.seconds, names.PEER_TIMEOUT_S, f"{names.PEER_TIMEOUT_S:g}",
             "seconds of silence after which a host is declared lost"),
    Variable("TRAINING_TOOLKIT_SSH_PORT", "ssh_port", values.port, names.SSH_PORT, str(names.SSH_PORT),
             "port of the toolkit's own sshd on each host (MPI)"),
    Variable("TRAINING_TOOLKIT_SSH_KEYS", "ssh_keys", values.key_files, None, "random",
             "a directory of mounted keys (`id_ed25519`, `ssh_host_ed25519_key`, with `.pub`, any modes) instead of "
             "keys made for the job"),
    Variable("TRAINING_TOOLKIT_SSHD", "sshd", values.text, None, "`sshd` on PATH", "the sshd binary"),
    Variable("TRAINING_TOOLKIT_MPI_FLAVOR", "mpi_flavor", values.mpi_flavor, None, "detected at run time",
             f"{' or '.join(f'`{f}`' for f in names.MPI_FLAVORS)} (else `mpirun --version` decides)"),
    Variable("TRAINING_TOOLKIT_PYTHON", "python", values.text, None, "the toolkit's python",
             "the interpreter for the user's script"),
    Variable("TRAINING_TOOLKIT_NUM_GPUS", "num_gpus", values.count, None, "probed", "the GPU count, instead of probing"),
    # Kubernetes (docs/kubernetes.md): what builds /opt/ml when no platform did
    Variable("TRAINING_TOOLKIT_PLATFORM", "platform", values.platform, "auto", "auto",
             "`sagemaker` (use /opt/ml as it is), `tfjob`, `pytorchjob`, `mpijob`, `jobset`, `job` (a plain indexed "
             "Job), `slurm` (docs/slurm.md) or `pod`; `auto`: the first platform whose facts this container has (docs/kubernetes.md)",
             "--platform"),
    Variable("TRAINING_TOOLKIT_HYPERPARAMETERS", "hyperparameters", values.text, None, "none",
             "on Kubernetes: a JSON object of hyperparameters, over the mounted file's"),
    Variable("TRAINING_TOOLKIT_HYPERPARAMETERS_FILE", "hyperparameters_file", values.text,
             "/etc/training-toolkit/hyperparameters.json", "/etc/training-toolkit/hyperparameters.json",
             "on Kubernetes: a mounted JSON file of hyperparameters (a ConfigMap), if present"),
    Variable("TRAINING_TOOLKIT_DNS_TIMEOUT", "dns_timeout_s", values.seconds, 300.0, "300",
             "on Kubernetes: seconds to wait for every pod's name to resolve"),
    Variable("TRAINING_TOOLKIT_TERMINATION_LOG", "termination_log", values.text, "/dev/termination-log",
             "/dev/termination-log", "on Kubernetes: where the verdict's cause goes (`terminationMessagePath`)"),
    Variable("TRAINING_TOOLKIT_JOBSET_SHAPE", "jobset_shape", values.text, None, "none",
             "under JobSet: `NAME:JOBS:PODS` per replicated job, in rank order (the pods cannot see it)"),
    Variable("TRAINING_TOOLKIT_COMPLETIONS", "completions", values.completions, None, "none",
             "under a plain indexed Job: its `completions`, the number of pods (the pods cannot see it)"),
    # Resilience (docs/resilience.md)
    Variable("TRAINING_TOOLKIT_STALL_TIMEOUT", "stall_timeout_s", values.seconds_or_off, None, "0 (never)",
             "seconds the job may go without progress (an output line of any rank, or a heartbeat) before it "
             "counts as stalled: every rank's stack is gathered, then the job ends or restarts"),
    Variable("TRAINING_TOOLKIT_STALL_STARTUP", "stall_startup_s", values.seconds, 600.0, "600",
             "seconds an attempt may take to its first progress (imports, data loading), if longer than the "
             "stall timeout"),
    Variable("TRAINING_TOOLKIT_PY_SPY", "py_spy", values.text, None, "beside the toolkit's python, else on PATH",
             "the py-spy that reads a stalled rank's stack where its faulthandler hook cannot (needs ptrace); "
             "`none`: never use py-spy"),
    Variable("TRAINING_TOOLKIT_MAX_RESTARTS", "max_restarts", values.count, 0, "0",
             "job-wide restarts after a failure or a stall (every host stops its ranks, meets at a new barrier "
             "and starts them again), counted from the platform's own restart attempt (JobSet); a stopping signal "
             "from the platform never restarts; a pod whose container restarted rejoins the next attempt "
             "(docs/resilience.md)"),
    Variable("TRAINING_TOOLKIT_MAX_HOSTS", "max_hosts", values.hosts, None, "all hosts",
             "how many of the platform's hosts the job runs on; the others are spares, each taking a lost host's "
             "place at the next restart (docs/resilience.md)"),
    Variable("TRAINING_TOOLKIT_MIN_HOSTS", "min_hosts", values.hosts, None, "the max",
             "the fewest hosts the job may go on with after losing hosts with no spare left (it shrinks, "
             "renumbering ranks); below it the job ends (docs/resilience.md)"),
    Variable("TRAINING_TOOLKIT_NETSHIM", "netshim", values.on_off, True, "on",
             "`off`: Open MPI's runtime and ranks are not preloaded with the accept() shim that closes connections "
             "from outside the job before Open MPI reads them (docs/security.md)"),
    Variable("TRAINING_TOOLKIT_MPI_LAUNCHER", "mpi_launcher", values.mpi_launcher, names.LAUNCH_SSH, "ssh",
             "how mpirun starts Open MPI's daemons on the other hosts: `ssh` (the toolkit's own sshd and keys) or "
             "`slurm` (`srun --overlap` inside the job's step: no sshd, no keys; the default under Slurm; "
             "docs/slurm.md)"),
    Variable("TRAINING_TOOLKIT_ONE_STOP", "one_stop", values.on_off, False, "off",
             "`on`: a SIGTERM that reaches a process of the user's script again within 2 s of its first is the same "
             "stop, and the script's handler runs once (a small library preloaded into it); the default under Slurm, "
             "which signals every process of the job itself while each host's train passes the stop on as well "
             "(docs/slurm.md; MPI ranks have it everywhere)"),
    Variable("TRAINING_TOOLKIT_VERDICT_WAIT", "verdict_wait_s", values.seconds, 10.0, "10",
             "seconds a lead that took over from a lost one keeps the job's verdict, once the job ended, for hosts "
             "that have not joined it (the lost lead's pod made again); on Kubernetes 420: a dead node's pod is made "
             "again after about 340 s, and a PyTorchJob succeeds only when its Master pod exits 0 (docs/kubernetes.md)"),
    Variable("TRAINING_TOOLKIT_REJOIN_WAIT", "rejoin_wait_s", values.seconds, 60.0, "60",
             "seconds a host that found no majority (it may be the one cut off from the others) keeps looking for the "
             "job under another lead, to join it as a spare once the cut mends, before it leaves with 203; it never "
             "starts a job of its own meanwhile; on Kubernetes 0: the operator makes its pod again, which does the same "
             "(docs/resilience.md)"),
)


class Settings(NamedTuple):
    """The toolkit's settings, one field per row of ``VARIABLES`` (same order); build with ``parse``."""

    base_dir: str
    grace_s: float
    job_secret: bytes | None  # the variable's, else input/config/job_secret's (when parse is given ``read``)
    control_port: int
    join_timeout_s: float
    heartbeat_s: float
    peer_timeout_s: float
    ssh_port: int
    ssh_keys: KeyFiles | None
    sshd: str | None
    mpi_flavor: str | None  # None: detected at run time
    python: str | None  # None: the toolkit's own interpreter
    num_gpus: int | None  # None: probed
    platform: str = "auto"
    hyperparameters: str | None = None
    hyperparameters_file: str = "/etc/training-toolkit/hyperparameters.json"
    dns_timeout_s: float = 300.0
    termination_log: str = "/dev/termination-log"
    jobset_shape: str | None = None
    completions: int | None = None
    stall_timeout_s: float | None = None  # None: stalls are not watched for
    stall_startup_s: float = 600.0
    py_spy: str | None = None
    max_restarts: int = 0
    max_hosts: int | None = None  # None: every host the platform gave
    min_hosts: int | None = None  # None: the max
    netshim: bool = True  # preload the accept() shim into Open MPI's runtime and ranks
    mpi_launcher: str = names.LAUNCH_SSH  # how mpirun starts its daemons: ssh, or srun under Slurm
    one_stop: bool = False  # preload the user's processes so that repeated SIGTERMs are one stop (Slurm)
    verdict_wait_s: float = 10.0  # a lead that took over keeps the verdict this long for the lost one (Kubernetes: 420)
    rejoin_wait_s: float = 60.0  # a host out of the job with no majority looks for it this long (Kubernetes: 0)
    given: frozenset[str] = frozenset()  # fields the job set (flag or variable): a platform's Overrides never win over them

    def __repr__(self) -> str:  # the secret never reaches a log or a traceback
        shown = self._replace(job_secret="<redacted>") if self.job_secret else self
        return "Settings(" + ", ".join(f"{f}={getattr(shown, f)!r}" for f in self._fields if f != "given") + ")"


class Overrides(NamedTuple):
    """What a platform knows of settings, typed: each stands in for its variable when the job did not set it.

    None leaves the setting alone.  Kubernetes: a grace period that fits ``terminationGracePeriodSeconds``;
    MPIJob: the mounted keys under mpi-operator's names, and a job secret derived from them.
    """

    grace_s: float | None = None
    ssh_keys: KeyFiles | None = None
    job_secret: bytes | None = None
    num_gpus: int | None = None  # Slurm: the GPUs allocated on this node (SLURM_GPUS_ON_NODE), not all it has
    mpi_launcher: str | None = None  # Slurm: mpirun starts its daemons with srun, not over ssh
    one_stop: bool | None = None  # Slurm: every process gets the platform's SIGTERM and its host's train's
    verdict_wait_s: float | None = None  # Kubernetes: a lost host's pod made again minutes later hears the verdict
    rejoin_wait_s: float | None = None  # Kubernetes: a pod out of the job leaves at once, and is made again


NO_OVERRIDES = Overrides()


def parse(environ: Mapping[str, str], read: Callable[[str], bytes | None] | None = None, **flags: Any) -> Settings:
    """The settings from ``environ``; a flag given (not None, already a value) wins over its variable.

    ``read`` (a path's bytes, or None when it is missing) lets the job secret come from
    ``input/config/job_secret`` when its variable is unset; without it no file is consulted.
    """
    unknown = set(flags) - set(Settings._fields)
    if unknown:
        raise TypeError(f"no such setting: {', '.join(sorted(unknown))}")
    found = {var.field: value_of(var.field, environ, flags.get(var.field)) for var in VARIABLES}
    given = {var.field for var in VARIABLES
             if environ.get(var.name) or flags.get(var.field) not in (None, "")}
    if found["job_secret"] is None and read is not None:
        path = str(Paths.at(found["base_dir"]).job_secret_file)
        data = read(path)
        if data is not None and data.strip():
            try:
                found["job_secret"] = values.secret(data)
            except ValueError as exc:
                raise ConfigError(path, None, str(exc)) from None
            given.add("job_secret")
    return Settings(**found, given=frozenset(given))


def override(config: Settings, overrides: Overrides) -> Settings:
    """``config`` with a platform's overrides standing in for the settings the job left unset."""
    changes = {field: value for field, value in overrides._asdict().items()
               if value is not None and field not in config.given}
    return config._replace(**changes) if changes else config


def value_of(field: str, environ: Mapping[str, str], flag: Any = None) -> Any:
    """One setting: the flag if given, else its variable if set (not empty), else the default.

    Alone, for the job directory: the verdict needs it even when another setting is bad.
    """
    var = variable(field)
    if flag is not None and flag != "":
        return flag
    raw = environ.get(var.name)
    if not raw:
        return var.default
    try:
        return var.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"environment variable {var.name}", None, f"{exc}, got {raw!r}") from None


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """``TRAINING_TOOLKIT_*`` names that are no setting (a typo is otherwise silently ignored)."""
    known = {var.name for var in VARIABLES} | set(INTERNAL_VARIABLES)
    return sorted(name for name in environ if name.startswith(PREFIX) and name not in known)


def meant(name: str) -> str | None:
    """The setting an unknown name is most likely a typo of (``MAX_RESTART`` for ``MAX_RESTARTS``), if one is close."""
    from difflib import get_close_matches  # only where a name is unknown

    close = get_close_matches(name, [var.name for var in VARIABLES], n=1, cutoff=0.85)
    return close[0] if close else None


def variable(field: str) -> Variable:
    return next(var for var in VARIABLES if var.field == field)


def default(field: str) -> Any:
    """A setting's default, for code that has a value to fall back on when no Settings reach it."""
    return variable(field).default
