"""The Slurm platform: hostlists, the step's checks and the view, with what a real Slurm 22.05 srun gave a task.

``TASK`` (helpers.slurm) is what a real srun gave a task here; test/integration/platforms/test_slurm.py
checks it against a live one.
"""

from __future__ import annotations

import pytest

from helpers.slurm import TASK
from training_toolkit import platforms
from training_toolkit.config import settings
from training_toolkit.core.errors import ConfigError
from training_toolkit.core.hardware import Hardware
from training_toolkit.core.paths import Paths
from training_toolkit.platforms.slurm import Slurm, expand_hostlist, gpus_on_node, interface_towards
from training_toolkit.platforms.view import Facts

CPU = Hardware(num_cpus=2, num_gpus=0, num_neurons=0)
# /proc/net/route in a namespace host: a default route and the cluster's /24 on eth0, a /16 on ib0.
ROUTES = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
          "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
          "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
          "ib0\t0000000A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n")


def facts(environ, files=None, hostname="node2"):
    files = {"/proc/net/route": ROUTES, **(files or {})}
    return Facts(environ, hostname, files.get, lambda path: (), Paths.at("/opt/ml"), settings.parse(environ), CPU)


@pytest.mark.parametrize("text, names", [
    ("node[1-2]", ("node1", "node2")),
    ("node[01-04,07]", ("node01", "node02", "node03", "node04", "node07")),
    ("n[08-10]", ("n08", "n09", "n10")),
    ("n[8-10]", ("n8", "n9", "n10")),
    ("login1,gpu[1-2]-ib", ("login1", "gpu1-ib", "gpu2-ib")),
    ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
    ("a[3],b", ("a3", "b")),
    ("single", ("single",)),
])
def test_hostlists_expand_as_slurm_numbers_them(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text, why", [
    ("", "an empty name"), ("node[1-2", "unmatched '\\['"), ("node1-2]", "unmatched '\\]'"),
    ("node[[1]]", "nested"), ("node[3-1]", "backwards"), ("node[a-b]", "not N or N-M"),
    ("node[1-2],node2", "node2 listed twice"), ("node[1]x[", "unmatched"), ("a,,b", "an empty name"),
    ("x]y[1]", "unmatched"), ("pre]fix", "unmatched"),
])
def test_a_bad_hostlist_is_refused_naming_the_variable(text, why):
    with pytest.raises(ConfigError, match=f"SLURM_JOB_NODELIST.*{why}"):
        expand_hostlist(text)


def test_the_view_of_a_real_srun_task():
    view = Slurm().view(facts(TASK))
    assert (view.platform, view.hosts, view.current_host, view.interface) == ("slurm", ("node1", "node2"),
                                                                              "node2", "eth0")
    assert view.hyperparameters == {} and view.channels == {}
    assert view.overrides.grace_s == 25.0
    assert view.overrides.one_stop is True  # Slurm signals every process: repeated SIGTERMs are one stop
    assert view.notes == ("slurm: job 1 step 0: host node2 of node1, node2; interface eth0",)
    # the job's identity stays for the script; what describes train's own task does not
    assert "SLURM_JOB_ID" not in view.unset and "SLURM_CLUSTER_NAME" not in view.unset
    assert {"SLURM_JOBID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURMD_NODENAME"} <= set(view.unset)
    assert set(view.unset) | {"SLURM_JOB_ID", "SLURM_CLUSTER_NAME", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST"} == set(TASK)


def test_hyperparameters_and_channels_as_on_kubernetes():
    env = {**TASK, "TRAINING_TOOLKIT_HYPERPARAMETERS": '{"sagemaker_program": "train.py", "epochs": 2}'}
    view = Slurm().view(facts(env))
    assert view.hyperparameters == {"sagemaker_program": "train.py", "epochs": "2"}


def test_detected_by_the_job_id_and_listed_before_pod():
    f = facts(TASK)
    assert platforms.choose("auto", f).name == "slurm"
    assert platforms.choose("auto", facts({})).name == "sagemaker"
    names = [e.name for e in platforms.PLATFORMS]
    assert names.index("slurm") == names.index("pod") - 1


def test_a_step_with_several_tasks_per_node_is_refused():
    env = {**TASK, "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1"}
    with pytest.raises(ConfigError, match="4 tasks on 2 node.*one task per node"):
        Slurm().view(facts(env))


def test_train_in_a_multi_node_batch_script_outside_srun_is_refused():
    env = {k: v for k, v in TASK.items() if "STEP" not in k}
    with pytest.raises(ConfigError, match="outside a step: start it with `srun --ntasks-per-node=1 train`"):
        Slurm().view(facts(env))


def test_a_one_node_batch_script_runs_alone():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "SLURMD_NODENAME": "node1"}
    view = Slurm().view(facts(env, hostname="node1"))
    assert (view.hosts, view.current_host) == (("node1",), "node1")


def test_a_node_outside_the_step_and_a_wrong_node_id_are_named():
    with pytest.raises(ConfigError, match="node 'node9' is not one of the step's nodes node1, node2"):
        Slurm().view(facts({**TASK, "SLURMD_NODENAME": "node9"}))
    with pytest.raises(ConfigError, match="node node2 is number 1 of node\\[1-2\\], but SLURM_NODEID is 0"):
        Slurm().view(facts({**TASK, "SLURM_NODEID": "0"}))
    with pytest.raises(ConfigError, match="SLURM_STEP_NUM_NODES: 3 node"):
        Slurm().view(facts({**TASK, "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_NUM_TASKS": "3"}))


def test_a_step_on_part_of_the_allocation_is_a_job_of_the_steps_nodes():
    env = {**TASK, "SLURM_JOB_NODELIST": "node[1-4]", "SLURM_STEP_NODELIST": "node[3-4]", "SLURMD_NODENAME": "node4",
           "SLURM_NODEID": "3"}
    view = Slurm().view(facts(env))
    assert (view.hosts, view.current_host) == (("node3", "node4"), "node4")


def test_gpus_on_node():
    assert gpus_on_node({}) is None
    assert gpus_on_node({"SLURM_GPUS_ON_NODE": "4"}) == 4
    assert gpus_on_node({"SLURM_GPUS_PER_NODE": "a100:8"}) == 8
    with pytest.raises(ConfigError, match="SLURM_GPUS_PER_NODE: expected \\[type:\\]N, got 'a100:x'"):
        gpus_on_node({"SLURM_GPUS_PER_NODE": "a100:x"})
    view = Slurm().view(facts({**TASK, "SLURM_GPUS_ON_NODE": "2"}))
    assert view.notes[0].endswith("; 2 GPU(s) on this node")
    assert view.overrides.num_gpus == 2 and Slurm().view(facts(TASK)).overrides.num_gpus is None


@pytest.mark.process
def test_the_plan_under_slurm_counts_the_allocated_gpus(tmp_path):
    """``training-toolkit plan`` in a Slurm task: the script's SM_NUM_GPUS is the allocation's, not the probe's."""
    import json
    import subprocess
    import sys

    env = {**TASK, "SLURMD_NODENAME": "node1", "SLURM_NODEID": "0", "SLURM_GPUS_ON_NODE": "3",
           "SAGEMAKER_BASE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin",
           "TRAINING_TOOLKIT_HYPERPARAMETERS": json.dumps({"sagemaker_program": "train.py"})}
    out = subprocess.run([sys.executable, "-m", "training_toolkit", "plan", "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["platform"], plan["hosts"], plan["current_host"]) == ("slurm", ["node1", "node2"], "node1")
    assert plan["environment"]["SM_NUM_GPUS"] == "3"
    env["TRAINING_TOOLKIT_NUM_GPUS"] = "1"  # the job's own setting wins over the platform's
    out = subprocess.run([sys.executable, "-m", "training_toolkit", "plan", "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert json.loads(out.stdout)["environment"]["SM_NUM_GPUS"] == "1"
    assert not any(tmp_path.iterdir())  # plan writes nothing


def test_the_interface_is_the_most_specific_route_to_the_launch_node():
    assert interface_towards(ROUTES, "192.0.2.11") == "eth0"
    assert interface_towards(ROUTES, "10.0.3.4") == "ib0"
    assert interface_towards(ROUTES, "8.8.8.8") == "eth0"  # the default route
    assert interface_towards(ROUTES, None) is None
    assert interface_towards(None, "10.0.3.4") is None
    assert interface_towards(ROUTES, "fe80::1") is None


@pytest.mark.process
def test_the_plan_of_an_mpi_job_under_slurm_launches_through_slurm(tmp_path):
    """``training-toolkit plan`` in a Slurm task: mpirun's daemons start with srun, never ssh; ssh can be asked for."""
    import json
    import subprocess
    import sys

    hps = {"sagemaker_program": "train.py", "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 3}
    env = {**TASK, "SLURMD_NODENAME": "node1", "SLURM_NODEID": "0", "SAGEMAKER_BASE_DIR": str(tmp_path),
           "PATH": "/usr/bin:/bin", "TRAINING_TOOLKIT_HYPERPARAMETERS": json.dumps(hps)}

    def plan(**extra):
        out = subprocess.run([sys.executable, "-m", "training_toolkit", "plan", "--json"], env={**env, **extra},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    detail = plan()
    assert detail["mpi_launcher"] == "slurm"
    assert "plm_slurm_args" in detail["mpirun"] and not any("ssh" in arg for arg in detail["mpirun"])
    assert detail["mpirun_slurm_environment"] == {
        "SLURM_JOB_ID": TASK["SLURM_JOB_ID"], "SLURM_JOBID": TASK["SLURM_JOB_ID"], "SLURM_NODELIST": "node1,node2",
        "SLURM_TASKS_PER_NODE": "3(x2)", **({"SLURM_CONF": TASK["SLURM_CONF"]} if TASK.get("SLURM_CONF") else {})}
    ssh = plan(TRAINING_TOOLKIT_MPI_LAUNCHER="ssh")
    assert ssh["mpi_launcher"] == "ssh" and "plm_rsh_agent" in ssh["mpirun"]
    assert "mpirun_slurm_environment" not in ssh
