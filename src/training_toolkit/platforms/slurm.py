"""Slurm: ``srun train`` (one task per node) inside an allocation makes one job of the step's nodes.

What slurmstepd gives every task (srun(1), sbatch(1) "OUTPUT ENVIRONMENT VARIABLES", and what a
real Slurm 22.05 gave a task here, test/integration/platforms/test_slurm.py):

- ``SLURM_JOB_ID``; ``SLURM_STEP_ID`` only inside a step (``srun``), never in the batch script;
- ``SLURM_STEP_NODELIST`` (the step's nodes) and ``SLURM_JOB_NODELIST`` (the allocation's), in
  Slurm's compressed hostlist form (``node[01-04,07]``), expanded in the order Slurm numbers them;
- ``SLURMD_NODENAME``: this node's name as Slurm knows it; ``SLURM_NODEID``: its index;
- ``SLURM_STEP_NUM_NODES``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_LOCALID``: the toolkit starts the
  ranks itself, so one task per node is required and anything else is refused by name;
- ``SLURM_GPUS_ON_NODE`` (and ``SLURM_GPUS_PER_NODE``) when GPUs were asked for: the job's GPU count on
  this node (the node may have more than were allocated), unless ``TRAINING_TOOLKIT_NUM_GPUS`` says;
- ``SLURM_LAUNCH_NODE_IPADDR``: the address of the node that ran srun.

The hosts are the step's node names (a real cluster's nodes resolve each other by them); the
interface is the one this node's routes use to reach the launching node (``/proc/net/route``),
which is the cluster's network.  Hyperparameters, code and channels are given as on
Kubernetes (``TRAINING_TOOLKIT_HYPERPARAMETERS[_FILE]``, volumes under ``input/data``).  The
grace fits Slurm's default ``KillWait`` (30 s between scancel's SIGTERM and its SIGKILL).
"""

from __future__ import annotations

import re

from training_toolkit.core.errors import ConfigError
from training_toolkit.core.names import LAUNCH_SLURM
from training_toolkit.platforms.kubernetes import channels, hyperparameters
from training_toolkit.platforms.view import EMPTY, Facts, JobView, integer
from training_toolkit.config.settings import Overrides, Settings

JOB_ID = "SLURM_JOB_ID"
STEP_ID = "SLURM_STEP_ID"
STEP_NODELIST = "SLURM_STEP_NODELIST"
JOB_NODELIST = "SLURM_JOB_NODELIST"
NODENAME = "SLURMD_NODENAME"
NODEID = "SLURM_NODEID"
#: What the user's script may still see of Slurm: the job's identity, never the task's.  Every other
#: ``SLURM_*`` describes train's own task (one per node): Open MPI's mpirun takes ``SLURM_JOBID`` as
#: an allocation to launch into with srun (it hung, here), torch Lightning takes ``SLURM_PROCID`` as
#: every rank's rank.  The ranks the toolkit starts are not Slurm tasks, so those are unset for them.
KEPT = frozenset({JOB_ID, "SLURM_JOB_NAME", "SLURM_CLUSTER_NAME", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST",
                  "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_CONF"})
GRACE_S = 25.0  # KillWait defaults to 30: 5 s left for the toolkit's own ending
ROUTES_FILE = "/proc/net/route"
SOURCE = "Slurm step"

_ITEM = re.compile(r"([^\[\]]*)\[([^\[\]]*)\]")


def expand_hostlist(text: str, source: str = SOURCE, field: str = JOB_NODELIST) -> tuple[str, ...]:
    """Slurm's compressed hostlist (``node[01-04,07],gpu[1-2]-ib``) as names in Slurm's order.

    Items are separated by commas outside brackets; each bracket holds numbers and ranges
    ``lo-hi``, zero-padded to the width of ``lo`` (``[08-10]`` gives 08, 09, 10), and several
    brackets in one item multiply out, the rightmost fastest, as Slurm's hostlist does.
    """
    def bad(why: str) -> ConfigError:
        return ConfigError(source, field, f"{why} in hostlist {text!r}")

    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise bad("nested brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise bad("an unmatched ']'")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise bad("an unmatched '['")
    items.append(text[start:])
    names: list[str] = []
    for item in items:
        if not item.strip() or item != item.strip():
            raise bad("an empty name or one with spaces")
        names.extend(_expand_item(item, bad))
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise bad(f"node(s) {', '.join(duplicates)} listed twice")
    return tuple(names)


def _expand_item(item: str, bad) -> list[str]:
    expanded = [""]
    end = 0
    for match in _ITEM.finditer(item):
        if match.start() != end:
            raise bad(f"text {item[end:match.start()]!r} outside a name")
        prefix, ranges = match.groups()
        numbers = [_numbers(part, bad) for part in ranges.split(",")]
        expanded = [f"{head}{prefix}{n}" for head in expanded for group in numbers for n in group]
        end = match.end()
    rest = item[end:]
    if "[" in rest or "]" in rest:
        raise bad("a stray bracket")
    return [head + rest for head in expanded]


def _numbers(part: str, bad) -> list[str]:
    lo, sep, hi = part.partition("-")
    hi = hi if sep else lo
    if not (lo.isascii() and lo.isdigit() and hi.isascii() and hi.isdigit()):
        raise bad(f"range {part!r} is not N or N-M")
    if int(hi) < int(lo):
        raise bad(f"range {part!r} runs backwards")
    width = len(lo)
    return [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]


def task_variables(environ) -> tuple[str, ...]:
    """The variables of train's own Slurm task, which no child inherits (``KEPT`` stay), sorted."""
    return tuple(sorted(k for k in environ if (k.startswith("SLURM_") or k.startswith("SLURMD_")) and k not in KEPT))


def gpus_on_node(environ) -> int | None:
    """``SLURM_GPUS_ON_NODE``, else a plain count in ``SLURM_GPUS_PER_NODE`` (``[type:]N``); None when unset."""
    if environ.get("SLURM_GPUS_ON_NODE"):
        return integer(environ, "SLURM_GPUS_ON_NODE", SOURCE)
    raw = environ.get("SLURM_GPUS_PER_NODE", "")
    count = raw.rpartition(":")[2]
    if not raw:
        return None
    if not (count.isascii() and count.isdigit()):
        raise ConfigError(SOURCE, "SLURM_GPUS_PER_NODE", f"expected [type:]N, got {raw!r}")
    return int(count)


def interface_towards(routes: str | None, address: str | None) -> str | None:
    """The interface of the most specific route in ``/proc/net/route``'s text that holds ``address`` (IPv4)."""
    if not routes or not address:
        return None
    try:
        target = int.from_bytes(bytes(int(x) for x in address.split(".")), "big")
    except ValueError:
        return None
    best: tuple[int, str] | None = None
    for line in routes.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:  # the kernel writes addresses and masks as little-endian hex
            dest = int.from_bytes(int(fields[1], 16).to_bytes(4, "little"), "big")
            mask = int.from_bytes(int(fields[7], 16).to_bytes(4, "little"), "big")
        except ValueError:
            continue
        if target & mask == dest and (best is None or mask > best[0]):
            best = (mask, fields[0])
    return best[1] if best else None


class Slurm:
    name = "slurm"

    def detected(self, facts: Facts) -> bool:
        return bool(facts.environ.get(JOB_ID))

    def view(self, facts: Facts) -> JobView:
        env = facts.environ
        job = env.get(JOB_ID, "")
        if STEP_ID not in env:
            hosts = expand_hostlist(env.get(JOB_NODELIST, "") or facts.hostname)
            if len(hosts) > 1:
                raise ConfigError(SOURCE, STEP_ID, f"train runs in the batch script of job {job} on "
                                  f"{len(hosts)} nodes, outside a step: start it with "
                                  "`srun --ntasks-per-node=1 train` so that every node takes part")
            step_hosts, current = hosts, env.get(NODENAME) or hosts[0]
        else:
            step_hosts = expand_hostlist(env.get(STEP_NODELIST, ""), field=STEP_NODELIST)
            current = env.get(NODENAME, "")
            self._check_step(env, step_hosts, current)
        if current not in step_hosts:
            raise ConfigError(SOURCE, NODENAME, f"node {current!r} is not one of the step's nodes "
                              f"{', '.join(step_hosts)}")
        gpus = gpus_on_node(env)
        interface = interface_towards(facts.read(ROUTES_FILE), env.get("SLURM_LAUNCH_NODE_IPADDR"))
        notes = [f"slurm: job {job} step {env.get(STEP_ID, 'batch')}: host {current} of {', '.join(step_hosts)}"
                 f"; interface {interface or 'unknown'}" + (f"; {gpus} GPU(s) on this node" if gpus is not None else "")]
        return JobView(self.name, step_hosts, current, interface, hyperparameters(facts, EMPTY), channels(facts),
                       Overrides(grace_s=GRACE_S, num_gpus=gpus, mpi_launcher=LAUNCH_SLURM, one_stop=True),
                       notes=tuple(notes), unset=task_variables(env))

    @staticmethod
    def _check_step(env, hosts: tuple[str, ...], current: str) -> None:
        nodes = integer(env, "SLURM_STEP_NUM_NODES", SOURCE, 1)
        tasks = integer(env, "SLURM_STEP_NUM_TASKS", SOURCE, 1)
        if nodes != len(hosts):
            raise ConfigError(SOURCE, "SLURM_STEP_NUM_NODES", f"{nodes} node(s), but {STEP_NODELIST} lists "
                              f"{len(hosts)}: {', '.join(hosts)}")
        if tasks != nodes or env.get("SLURM_LOCALID", "0") != "0":
            raise ConfigError(SOURCE, "SLURM_STEP_NUM_TASKS", f"{tasks} tasks on {nodes} node(s): train starts "
                              "the ranks itself and needs one task per node (`srun --ntasks-per-node=1 train`; "
                              "ranks per node go in the distribution's processes-per-host; srun takes the task "
                              "count of an allocation made with more tasks per node from SLURM_NTASKS: allocate "
                              "with --ntasks-per-node=1 or give srun --ntasks=<nodes>)")
        node_id = integer(env, NODEID, SOURCE)
        whole_job = env.get(JOB_NODELIST) == env.get(STEP_NODELIST)  # then the node id is the step's index too
        if whole_job and current in hosts and hosts.index(current) != node_id:
            raise ConfigError(SOURCE, NODEID, f"node {current} is number {hosts.index(current)} of "
                              f"{env.get(STEP_NODELIST)}, but {NODEID} is {node_id}")

    def wait(self, view: JobView, settings: Settings) -> None:
        """Nothing to wait for: srun starts a task on every node of the step only once all are allocated."""

    def report_end(self, facts: Facts, view: JobView | None, exit_code: int, reason: str | None) -> None:
        """The exit code is the report: slurmstepd records it for the step (sacct, srun's own message)."""
