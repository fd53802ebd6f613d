"""The goodput benchmark's job scripts (torch DDP on gloo, and its Horovod elastic twin) and the fault driver.

Both scripts do the same fixed work: ``STEPS`` steps, each a DDP forward/backward of a tiny model (one
allreduce of its gradients) and a sleep of ``STEP_S * FULL_WORLD / world`` (the same global batch on
fewer hosts takes longer).  Each rank stamps ``time.monotonic()`` (system-wide) once its group is formed,
in ``$SHARED_DIR/started-<attempt>-<rank>-<pid>``; rank 0 writes ``$SHARED_DIR/done`` at the end.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from goodput_plan import Fault, attempts_by_time, recoveries, victim

from training_toolkit.supervise import procfs
from training_toolkit.local.netns import NamespaceCluster

H4 = ("algo-1", "algo-2", "algo-3", "algo-4")
TAGS: list[str] = []  # every cluster's the bench brought up, to check that nothing of it is left

TORCH_JOB = """\
import os, time
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

shared = Path(os.environ["SHARED_DIR"])
steps, step_s, every, full = (int(os.environ["STEPS"]), float(os.environ["STEP_S"]), int(os.environ["CKPT_EVERY"]),
                              int(os.environ["FULL_WORLD"]))
timeout = os.environ.get("GLOO_TIMEOUT_S")  # torchrun tuned: a short one; otherwise torch's default
dist.init_process_group("gloo", **({"timeout": timedelta(seconds=float(timeout))} if timeout else {}))
rank, world = dist.get_rank(), dist.get_world_size()
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
(shared / f"started-{attempt}-{rank}-{os.getpid()}").write_text(repr(time.monotonic()))
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = shared / "checkpoint.pt"
start = torch.tensor([0])
if rank == 0 and ckpt.exists():
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    start[0] = state["step"] + 1
dist.broadcast(start, 0)  # every rank resumes at rank 0's step
for p in model.parameters():
    dist.broadcast(p.data, 0)
for step in range(int(start), steps):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()  # DDP: the gradients' allreduce
    opt.step()
    time.sleep(step_s * full / world)
    if rank == 0 and ((step + 1) % every == 0 or step == steps - 1):
        torch.save({"model": model.module.state_dict(), "step": step}, shared / "checkpoint.tmp")
        os.replace(shared / "checkpoint.tmp", ckpt)
        if "TRAINING_TOOLKIT_HEARTBEAT_DIR" in os.environ:  # the toolkit's checkpoint mark: its record's goodput
            Path(os.environ["TRAINING_TOOLKIT_HEARTBEAT_DIR"], "checkpoint").touch()
dist.barrier()
if rank == 0:
    (shared / "done").write_text(repr(time.monotonic()))
dist.destroy_process_group()
"""

# Horovod here is built with TensorFlow only (no horovod.torch extension: docs/benchmarks.md), so its twin
# is TensorFlow: the same tiny model's gradients allreduced (DistributedGradientTape), the same sleeps.
# As Horovod's elastic docs say: the state is hvd.elastic.TensorFlowKerasState (its constructor
# broadcasts nothing, unlike TensorFlowState's), and no collective runs before hvd.elastic.run.
# Horovod 0.28 predates Keras 3: its broadcast of a Keras 3 model's variables fails ("'SymbolicTensor'
# object has no attribute 'assign'") and it calls ``optimizer.variables()``, a list in Keras 3.  So the
# state is given what it reads of a model and an optimizer (``built``, ``variables``; ``variables()``)
# over plain tf.Variables, and nothing else.
HOROVOD_JOB = """\
import os, time
from pathlib import Path
import tensorflow as tf
import horovod.tensorflow as hvd

shared = Path(os.environ["SHARED_DIR"])
steps, step_s, every, full = (int(os.environ["STEPS"]), float(os.environ["STEP_S"]), int(os.environ["CKPT_EVERY"]),
                              int(os.environ["FULL_WORLD"]))
hvd.init()
w = tf.Variable(tf.zeros([4, 1]))


class Model:  # what TensorFlowKerasState reads of a Keras model
    built, variables = True, [w]


class Optimizer:  # and of its optimizer: plain SGD keeps no variables
    def variables(self):
        return []


@hvd.elastic.run
def train(state):
    (shared / f"started-{state.resets}-{hvd.rank()}-{os.getpid()}").write_text(repr(time.monotonic()))
    while state.step < steps:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.ones([2, 4]), w))
        grad, = hvd.DistributedGradientTape(tape).gradient(loss, [w])  # the gradients' allreduce
        w.assign_sub(0.01 * grad)
        time.sleep(step_s * full / hvd.size())
        state.step += 1
        if state.step % every == 0:
            state.commit()  # in memory: what every rank rolls back to after a host's loss


state = hvd.elastic.TensorFlowKerasState(Model(), Optimizer(), step=0, resets=0)
state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])
train(state)
if hvd.rank() == 0:
    (shared / "done").write_text(repr(time.monotonic()))
"""


class Faults:
    """Runs a schedule against a job in a thread: kills a host whole at each fault, brings it back later.

    The schedule's times count from the first rank's start (its stamp in ``shared``): a fault hits the
    training, not the launcher's start, which differs between the systems compared.

    ``running()``: the hosts running a rank of the job now; ``up()``: the hosts not killed (or back);
    ``kill(host)``: the host killed whole; ``back(host)``: its replacement started (None: the caller's
    platform model brings it back itself, as ``run_local``'s ``restart`` does).
    """

    def __init__(self, schedule: Sequence[Fault], first: str, *, running: Callable[[], list[str]],
                 kill: Callable[[str], None], back: Callable[[str], None] | None = None,
                 shared: Path | None = None) -> None:
        self.schedule, self.first, self._running, self._kill, self._back = schedule, first, running, kill, back
        self.shared = shared
        self.kills: list[tuple[str, float]] = []
        self.down: dict[str, float] = {}  # host -> when it comes back (monotonic)
        self.errors: list[BaseException] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = 0.0

    def start(self, hosts: Sequence[str]) -> None:
        """The schedule's clock starts when the first rank of the job has started (its stamp in ``shared``)."""
        self.t0, self.hosts = float("inf"), list(hosts)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(30)

    def up(self) -> list[str]:
        return [h for h in self.hosts if h not in self.down]

    def _wait_until(self, when: float) -> bool:
        return not self._done.wait(max(0.0, when - time.monotonic()))

    def _run(self) -> None:
        try:
            while not any(self.shared.glob("started-*")):
                if self._done.wait(0.1):
                    return
            self.t0 = time.monotonic()
            pending: list[tuple[float, str]] = []  # (when it comes back, host)
            faults = list(self.schedule)
            while faults or pending:
                due = min([when for when, _ in pending] + ([self.t0 + faults[0].at_s] if faults else []))
                if not self._wait_until(due):
                    return
                self._bring_back(pending, time.monotonic())
                if faults and time.monotonic() >= self.t0 + faults[0].at_s:
                    self._fault(faults.pop(0), pending)
        except BaseException as exc:  # noqa: BLE001 - reported by the bench after the job
            self.errors.append(exc)

    def _fault(self, fault: Fault, pending: list[tuple[float, str]]) -> None:
        # a rank's host, if one runs within a few seconds (not one in the middle of a restart)
        deadline = time.monotonic() + 5
        while True:
            running = [h for h in self._running() if h not in self.down]
            if running or time.monotonic() > deadline or self._done.is_set():
                break
            time.sleep(0.2)
        host = victim(fault.pick, running, self.up(), self.first)
        if host is None:
            return
        self.kills.append((host, time.monotonic()))
        self.down[host] = self.t0 + fault.back_s
        self._kill(host)
        pending.append((self.t0 + fault.back_s, host))

    def _bring_back(self, pending: list[tuple[float, str]], now: float) -> None:
        for item in sorted(pending):
            if item[0] <= now:
                pending.remove(item)
                self.down.pop(item[1], None)
                if self._back is not None:
                    self._back(item[1])


class Outcome:
    def __init__(self, label: str, wall: float | None, note: str = "", kills=(), recover=()) -> None:
        self.label, self.wall, self.note, self.kills, self.recover = label, wall, note, list(kills), list(recover)


def started(shared: Path) -> dict[int, list[float]]:
    """The ranks' start stamps, grouped into attempts by time (``goodput_plan.attempts_by_time``)."""
    return attempts_by_time(float(f.read_text()) for f in shared.glob("started-*"))


def timed(outcome: Outcome, shared: Path) -> Outcome:
    """Each kill to the next attempt's first rank running and to its every rank running, from the ranks' stamps."""
    groups = started(shared)
    outcome.recover = recoveries(outcome.kills, groups)
    outcome.first_rank = recoveries(outcome.kills, groups, which=min)
    return outcome


def running(cluster: NamespaceCluster | None, needle: str) -> list[str]:
    """The hosts with a process whose command line names ``needle`` (a rank of the job, or its launcher)."""
    if cluster is None:
        return []
    return [name for name, pids in cluster.pids().items()
            if any(needle in (procfs.cmdline(pid) or "") for pid in pids)]


def job_env(shared: Path, args) -> dict[str, str]:
    return {"SHARED_DIR": str(shared), "STEPS": str(args.steps), "STEP_S": str(args.step_s),
            "CKPT_EVERY": str(args.ckpt_every), "FULL_WORLD": "4", "OMP_NUM_THREADS": "1"}


class StampedLog:
    """A launcher's output to a file, each line after its arrival time (``time.monotonic()``, 3 decimals)."""

    def __init__(self, path: Path) -> None:
        self._file, self._buf = open(path, "wb"), b""  # noqa: SIM115 - closed by close()

    def write(self, data: bytes) -> int:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        now = b"%.3f " % time.monotonic()
        self._file.write(b"".join(now + line + b"\n" for line in lines))
        return len(data)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.write(self._buf)
        self._file.close()


def decisions(log: Path, hosts: Sequence[str]) -> list[float]:
    """When the lead, any of ``hosts``, said each attempt's hosts (``algo-1: attempt N of M: ...``), from a
    ``StampedLog``."""
    names = b"|".join(re.escape(h.encode()) for h in hosts)
    said = re.compile(rb"^([0-9.]+) .*(?:" + names + rb"): attempt [0-9]+ of [0-9]+: ")
    return [float(m.group(1)) for line in log.read_bytes().splitlines() if (m := said.match(line))]

