"""Spares on the simulated Kubernetes operators: replicas = hosts + spares, a pod lost and made again under its name.

A PyTorchJob's pods (helpers/kubernetes.py: what training-operator gives each) run the real ``train``;
``restartPolicy: ExitCode`` (our manifests: the operator gives the pod ``Never``, and makes a pod whose node died
again).  A worker pod's node is lost: everything in the pod is
killed at once (``helpers/deadhost.py``), and the operator makes the pod again under its name (a
replica's missing pod): a new address, its DNS record moved there, a fresh emptyDir ``/opt/ml``
(``Simulation.replace``).  The made-again pod's ``train`` joins the job that went on without it (the
first host looks its name up again: docs/security.md) and waits as a spare.  Nothing here is a real cluster.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from pathlib import Path

import pytest

from helpers import kubernetes as k8s
from helpers.deadhost import HostKiller, cut, wait_for
from helpers.kubelet import Kubelet, job_condition, retryable
from helpers.multihost import hps, source_dir
from training_toolkit.core.errors import EXIT_NO_MAJORITY
from training_toolkit.core.names import CONTROL_PORT

pytestmark = [pytest.mark.root]

MASTER, LOST = "ptj-master-0", "ptj-worker-0"
BASE = {"TRAINING_TOOLKIT_DNS_TIMEOUT": "60", "TRAINING_TOOLKIT_JOIN_TIMEOUT": "60", "TRAINING_TOOLKIT_GRACE_PERIOD": "10",
        "TRAINING_TOOLKIT_MAX_RESTARTS": "2", "STEPS": "20", "STEP_S": "0.3"}


class Node:
    """``lost``'s node dies once attempt 0 made 3 steps (``progress``); the operator makes its pod again, by its
    ``restartPolicy: ExitCode`` rule (``kubelet.retryable``), once attempt 1 runs ``seated`` processes; the test's
    ``release`` file is made once that pod holds a link to the ``first`` host's control channel.  ``cut``: the node is
    cut off instead (its link at the switch: its pod runs on and ends by itself), and the pod made again reaches the
    others (the link mended: a node that does)."""

    def __init__(self, tmp_path: Path, seated: int, first: str = MASTER, lost: str = LOST, progress: str = "step-0-0",
                 cut: bool = False):
        self.shared = tmp_path / "shared"
        self.shared.mkdir()
        self.killer = HostKiller()
        self._never = Kubelet("Never")
        self.seated = seated
        self.first, self.lost, self.progress, self.cut = first, lost, progress, cut
        self.cluster = None
        self.replaced: list[int] = []
        self.errors: list[BaseException] = []
        self.rejoined_at: float | None = None
        self.dead = threading.Event()  # everything in the lost pod was killed

    @property
    def ended(self) -> list[tuple[str, int]]:
        """Every container end, in order: (pod, exit code)."""
        return self._never.ended

    def kubelet(self, pod: str, exit_code: int) -> float | None:
        """The pod's restartPolicy Never (our manifests' ExitCode); a dead node's pod is looked at once nothing runs in
        it."""
        if pod == self.lost and not self.replaced:
            assert self.dead.wait(60), f"{pod}: its node never died"
        return self._never(pod, exit_code)

    def run(self, pods, tmp_path: Path, hyperparameters, env: dict, timeout_s: float) -> dict:
        """The pods' job with this node lost (and its pod made again); each pod's result by name, once the test's
        thread saw nothing go wrong."""
        results = {r.host: r for r in k8s.run(pods, tmp_path, hyperparameters, env=env, timeout_s=timeout_s,
                                              kubelet=self.kubelet, operator=self.operator, before_start=self.start)}
        assert not self.errors, self.errors
        return results

    def env(self, **extra) -> dict:
        return {**BASE, "SHARED_DIR": str(self.shared), "HOLD_FILE": str(self.shared / "release"), **extra}

    def start(self, cluster) -> None:
        self.killer.before_start(cluster)
        self.cluster = cluster
        threading.Thread(target=self._kill_then_watch, args=(cluster,), daemon=True).start()

    def operator(self, pod: str, exit_code: int) -> float | None:
        """The pod made again (once, and not before the job went on without it); 0: its container starts at once."""
        if pod != self.lost or self.replaced or not retryable(exit_code):
            return None
        self.replaced.append(exit_code)
        if self.cut:
            cut(self.cluster, pod, mend=True)
        end = time.monotonic() + 240
        while len(list(self.shared.glob("seen-1-*.json"))) < self.seated:  # as a node's loss takes minutes to be seen
            assert time.monotonic() < end, "attempt 2 never started"
            time.sleep(0.1)
        return 0.0

    def _kill_then_watch(self, cluster) -> None:
        try:
            wait_for(self.shared / self.progress, timeout_s=300, at_least=3)
            if self.cut:
                cut(cluster, self.lost)
            else:
                self.killer.kill(self.lost)
            self.dead.set()
            new = str(ipaddress.ip_address(cluster.host(self.lost).address) + k8s.REPLACED_OFFSET)
            end = time.monotonic() + 240
            while not self._linked(cluster, self.first, new):
                assert time.monotonic() < end, f"{self.lost} never linked again from {new}"
                time.sleep(0.2)
            self.rejoined_at = time.monotonic()
            time.sleep(3)  # its ready for the next attempt follows its welcome
            (self.shared / "release").write_text("")
        except BaseException as exc:  # noqa: BLE001 - seen by the test after the job
            errors = self.errors
            errors.append(exc)
            (self.shared / "release").write_text("")

    @staticmethod
    def _linked(cluster, first: str, address: str) -> bool:
        done = cluster.run(first, ["ss", "-Htn", "state", "established", f"( sport = :{CONTROL_PORT} )"], timeout=15,
                           capture_output=True, text=True)
        return f"{address}:" in done.stdout


def ended_with_the_new_leads_verdict(tmp_path: Path, made_again: str, lead: str) -> None:
    """The pod made again ended with the job's verdict, 0, and the summary of the lead that took over, as that lead
    did (its termination message: what the operator reads)."""
    message = k8s.termination_log(tmp_path / "cluster", made_again)
    assert message == k8s.termination_log(tmp_path / "cluster", lead), message
    assert message.startswith("training completed (exit code 0)\ntraining-toolkit: summary: attempts=2 faults=1 "), \
        message


def seen(shared: Path, attempt: int) -> list[tuple[int, str]]:
    infos = [json.loads(f.read_text()) for f in shared.glob(f"seen-{attempt}-*.json")]
    return sorted((i["rank"], i["host"]) for i in infos)


def infos(shared: Path, attempt: int) -> list[dict]:
    return [json.loads(f.read_text()) for f in shared.glob(f"seen-{attempt}-*.json")]


@pytest.mark.torch
def test_a_lost_pods_seat_goes_to_the_waiting_spare_and_the_pod_made_again_waits_as_a_spare(tmp_path, capfd):
    src = source_dir(tmp_path, "torch_spares.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=3, nproc=1)  # 4 replicas: 3 hosts and a spare
    node = Node(tmp_path, seated=3)
    results = node.run(pods, tmp_path, hps("torch_spares.py", src), node.env(TRAINING_TOOLKIT_MAX_HOSTS="3"), 420)
    assert node.replaced == [-9] and node.rejoined_at is not None
    for pod in (MASTER, "ptj-worker-1", "ptj-worker-2", LOST):  # the pod made again too: it heard the verdict
        assert results[pod].exit_code == 0, (pod, results[pod].exit_code, results[pod].failure)
    assert seen(node.shared, 0) == [(0, MASTER), (1, LOST), (2, "ptj-worker-1")]
    assert seen(node.shared, 1) == [(0, MASTER), (1, "ptj-worker-2"), (2, "ptj-worker-1")]  # the spare in its seat
    assert all(i["world"] == 3 and i["start"] >= 3 for i in infos(node.shared, 1))
    assert not list(node.shared.glob("seen-2-*")), "no restart was made for the pod that came back"
    # a new pod's verdict, with the job's summary line after it: the lead's, the same in every pod's message
    message = k8s.termination_log(tmp_path / "cluster", LOST)
    assert message.startswith("training completed (exit code 0)\ntraining-toolkit: summary: attempts=2 faults=1 "), \
        message
    assert message == k8s.termination_log(tmp_path / "cluster", MASTER)
    out = capfd.readouterr().out
    assert f"{LOST} lost" in out and "ptj-worker-2 takes its place" in out, out[-3000:]


@pytest.mark.torch
def test_a_pod_made_again_is_seated_at_the_next_restart_while_the_job_is_below_its_maximum(tmp_path, capfd):
    src = source_dir(tmp_path, "torch_spares.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=2, nproc=1)  # 3 replicas, no spare: the job may shrink to 2
    node = Node(tmp_path, seated=2)
    results = {r.host: r for r in k8s.run(
        pods, tmp_path, hps("torch_spares.py", src), env=node.env(TRAINING_TOOLKIT_MIN_HOSTS="2", HOLD_EXIT="3"),
        timeout_s=420, kubelet=node.kubelet, operator=node.operator, before_start=node.start)}
    assert not node.errors, node.errors
    for pod in (MASTER, "ptj-worker-1", LOST):
        assert results[pod].exit_code == 0, (pod, results[pod].exit_code, results[pod].failure)
    assert seen(node.shared, 1) == [(0, MASTER), (1, "ptj-worker-1")]  # shrunk while the pod was away
    # attempt 2's rank 0 failed once the pod made again had joined: the restart seats it, back at 3
    assert seen(node.shared, 2) == [(0, MASTER), (1, "ptj-worker-1"), (2, LOST)]
    third = infos(node.shared, 2)
    assert all(i["world"] == i["env_world"] == 3 and i["hosts"] == [MASTER, "ptj-worker-1", LOST] for i in third)
    assert len({i["start"] for i in third}) == 1 and third[0]["start"] >= 3
    out = capfd.readouterr().out
    assert f"{LOST} seated" in out, out[-3000:]
    assert f"listener guard: {LOST} now at" in out, out[-3000:]  # torch's store admits its new address


def tfjob_with_a_pod_lost(tmp_path: Path, first: str, lost: str) -> Node:
    """A TFJob (Chief + 2 Workers, ``MAX_HOSTS=2``: worker 1 the spare) running the parameter server (``ps_spares.py``),
    ``lost``'s pod lost with its node at epoch 3 and made again, ``first`` leading the job after it; every pod, the one
    made again included (it waited as a spare and heard the verdict), ended 0."""
    src = source_dir(tmp_path, "ps_spares.py")
    pods = k8s.tfjob("tfj", "ns1", {"Chief": 1, "Worker": 2})
    node = Node(tmp_path, seated=2, first=first, lost=lost, progress="epoch-0")
    env = node.env(TRAINING_TOOLKIT_MAX_HOSTS="2", TRAINING_TOOLKIT_GRACE_PERIOD="5", TF_CPP_MIN_LOG_LEVEL="2",
                   EPOCHS="12", EPOCH_S="0.5", TRAINING_TOOLKIT_MAX_RESTARTS="1")
    results = node.run(pods, tmp_path, hps("ps_spares.py", src), env, 480)
    assert node.replaced == [-9]
    for pod in pods:
        assert results[pod.name].exit_code == 0, (pod.name, results[pod.name].exit_code, results[pod.name].failure)
    return node


@pytest.mark.tensorflow
def test_a_tfjob_parameter_server_job_seats_its_spare_worker_in_a_lost_workers_place(tmp_path):
    """TFJob Chief + 2 Workers, ``MAX_HOSTS=2``: worker 1 is the spare; worker 0's pod (worker 0, ps 1) is lost."""
    chief, lost, spare = (f"tfj-{t}.ns1.svc" for t in ("chief-0", "worker-0", "worker-1"))
    node = tfjob_with_a_pod_lost(tmp_path, first="tfj-chief-0", lost="tfj-worker-0")
    first = {f.name: json.loads(f.read_text()) for f in node.shared.glob("seen-0-*.json")}
    assert first["seen-0-worker-0.json"]["host"] == lost and len(first) == 2  # the spare ran nothing
    second = {f.name: json.loads(f.read_text()) for f in node.shared.glob("seen-1-*.json")}
    assert second["seen-1-worker-0.json"]["host"] == spare and len(second) == 2  # in the lost worker's seat
    assert all(t["cluster"] == {"chief": [f"{chief}:2222"], "worker": [f"{spare}:2222"],
                                "ps": [f"{chief}:2223", f"{spare}:2223"]} for t in second.values()), second
    assert second["seen-1-chief-0.json"]["start"] >= 3  # the chief resumed from its checkpoint
    done = json.loads((node.shared / "done-1.json").read_text())
    assert abs(done["w"] - 3.0) < 0.3 and abs(done["b"] + 1.0) < 0.3, done
    assert not list(node.shared.glob("seen-2-*"))


@pytest.mark.torch
def test_the_master_pods_node_lost_the_job_fails_over_and_the_master_made_again_joins_as_a_spare(tmp_path, capfd):
    """The PyTorchJob's Master pod (the lead) lost with its node: ptj-worker-0 leads attempt 2 with rank 0, the spare
    takes its old seat; the Master pod made again (a new address) finds the job running and joins as a spare, hears
    the verdict and exits 0, which is what makes the PyTorchJob Succeeded (docs/kubernetes.md)."""
    src = source_dir(tmp_path, "torch_spares.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=3, nproc=1)  # 4 replicas: 3 hosts and a spare
    node = Node(tmp_path, seated=3, first="ptj-worker-0", lost=MASTER)
    results = node.run(pods, tmp_path, hps("torch_spares.py", src), node.env(TRAINING_TOOLKIT_MAX_HOSTS="3"), 420)
    assert node.replaced == [-9] and node.rejoined_at is not None
    for pod in ("ptj-worker-0", "ptj-worker-1", "ptj-worker-2", MASTER):  # the Master made again: the job's verdict
        assert results[pod].exit_code == 0, (pod, results[pod].exit_code, results[pod].failure)
    assert seen(node.shared, 0) == [(0, MASTER), (1, "ptj-worker-0"), (2, "ptj-worker-1")]
    assert seen(node.shared, 1) == [(0, "ptj-worker-0"), (1, "ptj-worker-2"), (2, "ptj-worker-1")]
    assert all(i["world"] == 3 and i["start"] >= 3 for i in infos(node.shared, 1))
    assert not list(node.shared.glob("seen-2-*")), "no restart was made for the Master that came back"
    assert job_condition(node.ended, MASTER) == "Succeeded", node.ended
    ended_with_the_new_leads_verdict(tmp_path, MASTER, "ptj-worker-0")
    out = capfd.readouterr().out
    assert "ptj-worker-0: leading the job from attempt 2" in out, out[-3000:]
    assert f"{MASTER}: the job runs without this host" in out, out[-3000:]


@pytest.mark.torch
def test_a_master_pod_cut_off_exits_for_the_operator_to_make_it_again_and_the_pytorchjob_succeeds(tmp_path, capfd):
    """The Master pod's node cut off from the others (not dead): the Master, the lead, finds no majority of the
    members at its restart, stops its ranks and exits 203 (``EXIT_NO_MAJORITY``), a code ``restartPolicy: ExitCode``
    retries, where 69 would have failed the whole PyTorchJob while the others went on.  ptj-worker-0 leads attempt 2
    with the spare seated; the operator makes the Master pod again on a node that reaches the others, which joins as
    a spare and exits with the job's verdict: no pod ended with a code that fails the job, and the PyTorchJob
    succeeds on its Master's 0."""
    src = source_dir(tmp_path, "torch_spares.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=3, nproc=1)  # 4 replicas: 3 hosts and a spare
    node = Node(tmp_path, seated=3, first="ptj-worker-0", lost=MASTER, cut=True)
    # the default minimum (every seat): the Master alone is short of hosts as well, and must still say no majority
    results = node.run(pods, tmp_path, hps("torch_spares.py", src), node.env(TRAINING_TOOLKIT_MAX_HOSTS="3"), 420)
    assert node.replaced == [EXIT_NO_MAJORITY] and node.rejoined_at is not None, node.replaced
    for pod in ("ptj-worker-0", "ptj-worker-1", "ptj-worker-2", MASTER):  # the Master made again: the job's verdict
        assert results[pod].exit_code == 0, (pod, results[pod].exit_code, results[pod].failure)
    assert job_condition(node.ended, MASTER) == "Succeeded", node.ended
    assert seen(node.shared, 1) == [(0, "ptj-worker-0"), (1, "ptj-worker-2"), (2, "ptj-worker-1")]
    assert not list(node.shared.glob("seen-2-*")), "the Master cut off ran no attempt of its own, made again none"
    ended_with_the_new_leads_verdict(tmp_path, MASTER, "ptj-worker-0")
    out = capfd.readouterr().out
    assert f"{MASTER}: no majority to lead the job" in out, out[-3000:]
    assert "ptj-worker-0: leading the job from attempt 2" in out, out[-3000:]


@pytest.mark.torch
def test_a_master_pod_made_again_after_the_work_is_done_hears_the_verdict_and_never_starts_the_work_again(tmp_path):
    """The Master's node lost mid-run; the operator makes the pod again only once the job's work is done (its node
    took minutes to be declared gone).  The lead keeps the verdict for it (TRAINING_TOOLKIT_VERDICT_WAIT, 420 s on
    Kubernetes): the pod made again exits 0 and runs no attempt of its own, so the PyTorchJob succeeds."""
    src = source_dir(tmp_path, "torch_spares.py")
    pods = k8s.pytorchjob("ptj", "ns1", workers=2, nproc=1)  # 3 replicas, no spare: the job may shrink to 2
    node = Node(tmp_path, seated=2, first="ptj-worker-0", lost=MASTER)

    def operator(pod: str, exit_code: int) -> float | None:
        if pod != MASTER or node.replaced:
            return None
        node.replaced.append(exit_code)
        wait_for(node.shared / "done-1-1", timeout_s=240)  # the work is done: both ranks of attempt 2 finished
        (node.shared / "release").write_text("")
        return 0.0

    results = {r.host: r for r in k8s.run(
        pods, tmp_path, hps("torch_spares.py", src), env=node.env(TRAINING_TOOLKIT_MIN_HOSTS="2", HOLD_ATTEMPT="9"),
        timeout_s=420, kubelet=node.kubelet, operator=operator, before_start=node.start)}
    for pod in (MASTER, "ptj-worker-0", "ptj-worker-1"):  # the Master made again: the job's verdict, 0
        assert results[pod].exit_code == 0, (pod, results[pod].exit_code, results[pod].failure)
    assert node.replaced == [-9]
    assert seen(node.shared, 1) == [(0, "ptj-worker-0"), (1, "ptj-worker-1")]  # shrunk to 2 under the new lead
    assert not list(node.shared.glob("seen-2-*")), "the Master made again started no work"
    ended_with_the_new_leads_verdict(tmp_path, MASTER, "ptj-worker-0")


@pytest.mark.mpi
@pytest.mark.sshd
def test_an_mpijobs_launcher_lost_mpirun_fails_over_and_the_launcher_made_again_joins_and_ends_with_the_verdict(
        tmp_path, capfd):
    """An MPIJob (mpi-operator v2beta1, the launcher a worker too): the launcher pod, where mpirun ran, lost with its
    node.  mpj-worker-0 leads attempt 2 and runs mpirun there, ranks 0-1 on its host, the spare in its old seat; the
    launcher Job's pod made again (its hostname, a new address, the hostfile mounted again) finds the job running,
    joins as a spare and exits with the job's verdict, 0: the launcher Job's, and so the MPIJob's (docs/kubernetes.md).
    """
    src = source_dir(tmp_path, "mpi_spares.py")
    launcher = "mpj-launcher"
    pods = k8s.mpijob("mpj", "ns1", workers=3, slots=2)  # 4 pods: 3 hosts and a spare
    fqdn = {p.name: f"{p.name}.mpj.ns1.svc" for p in pods}
    node = Node(tmp_path, seated=6, first="mpj-worker-0", lost=launcher)
    results = node.run(pods, tmp_path, hps("mpi_spares.py", src), node.env(TRAINING_TOOLKIT_MAX_HOSTS="3"), 480)
    assert node.replaced == [-9] and node.rejoined_at is not None
    for pod in (launcher, "mpj-worker-0", "mpj-worker-1", "mpj-worker-2"):  # the launcher made again: the verdict, 0
        assert results[pod].exit_code == 0, (pod, results[pod].exit_code, results[pod].failure)
    first = seen(node.shared, 0)
    assert first == [(0, fqdn[launcher]), (1, fqdn[launcher]), (2, fqdn["mpj-worker-0"]), (3, fqdn["mpj-worker-0"]),
                     (4, fqdn["mpj-worker-1"]), (5, fqdn["mpj-worker-1"])], first
    second = seen(node.shared, 1)  # mpirun from mpj-worker-0; the spare in mpj-worker-0's old seat
    assert second == [(0, fqdn["mpj-worker-0"]), (1, fqdn["mpj-worker-0"]), (2, fqdn["mpj-worker-2"]),
                      (3, fqdn["mpj-worker-2"]), (4, fqdn["mpj-worker-1"]), (5, fqdn["mpj-worker-1"])], second
    assert all(i["world"] == 6 and i["start"] >= 3 for i in infos(node.shared, 1))  # resumed from the checkpoint
    assert not list(node.shared.glob("seen-2-*")), "no restart was made for the launcher that came back"
    ended_with_the_new_leads_verdict(tmp_path, launcher, "mpj-worker-0")
    out = capfd.readouterr().out
    assert f"{fqdn['mpj-worker-0']}: leading the job from attempt 2" in out, out[-3000:]  # the hostfile's names
    assert f"{fqdn[launcher]}: the job runs without this host" in out, out[-3000:]


@pytest.mark.tensorflow
def test_a_tfjobs_chief_pod_lost_the_chief_fails_over_and_the_chief_made_again_joins_and_ends_with_the_verdict(
        tmp_path):
    """TFJob Chief + 2 Workers, ``MAX_HOSTS=2`` (worker 1 the spare), parameter servers: the Chief's pod, the lead
    running the chief, lost with its node.  tfj-worker-0 leads attempt 2 and runs the chief there (``TF_CONFIG``'s
    chief is the attempt's lead), the spare its old seat as worker 0; the operator makes the Chief pod again
    (``restartPolicy: ExitCode``, a dead node's pod), which joins as a spare and exits with the verdict, 0: with a
    Chief replica the TFJob succeeds when the Chief pod does (docs/kubernetes.md)."""
    chief, lead, spare = (f"tfj-{t}.ns1.svc" for t in ("chief-0", "worker-0", "worker-1"))
    node = tfjob_with_a_pod_lost(tmp_path, first="tfj-worker-0", lost="tfj-chief-0")
    assert node.rejoined_at is not None
    first = {f.name: json.loads(f.read_text()) for f in node.shared.glob("seen-0-*.json")}
    assert first["seen-0-chief-0.json"]["host"] == chief and len(first) == 2  # the spare ran nothing
    second = {f.name: json.loads(f.read_text()) for f in node.shared.glob("seen-1-*.json")}
    assert second["seen-1-chief-0.json"]["host"] == lead and second["seen-1-worker-0.json"]["host"] == spare, second
    assert all(t["cluster"] == {"chief": [f"{lead}:2222"], "worker": [f"{spare}:2222"],
                                "ps": [f"{lead}:2223", f"{spare}:2223"]} for t in second.values()), second
    assert second["seen-1-chief-0.json"]["start"] >= 3  # the chief resumed from the lost chief's checkpoint
    done = json.loads((node.shared / "done-1.json").read_text())
    assert abs(done["w"] - 3.0) < 0.3 and abs(done["b"] + 1.0) < 0.3, done
    assert not list(node.shared.glob("seen-2-*")), "no restart was made for the Chief that came back"
    ended_with_the_new_leads_verdict(tmp_path, "tfj-chief-0", "tfj-worker-0")
