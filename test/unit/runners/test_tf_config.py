import pytest

from training_toolkit.core.errors import ClusterError
from training_toolkit.runners.torch_distributed import PER_HOST_INTRO, Layout, host_counts, process_env, rank_layout
from training_toolkit.runners.tf_config import PsLayout, mwms_config

H3 = ("algo-1", "algo-2", "algo-3")


def test_parameter_server_tf2_naming_on_three_hosts():
    layout = PsLayout(H3)
    cluster = {"chief": ["algo-1:2222"], "worker": ["algo-2:2222", "algo-3:2222"],
               "ps": ["algo-1:2223", "algo-2:2223", "algo-3:2223"]}
    assert layout.script_config("algo-1") == {"cluster": cluster, "task": {"type": "chief", "index": 0}}
    assert layout.script_config("algo-3") == {"cluster": cluster, "task": {"type": "worker", "index": 1}}
    assert layout.ps_config("algo-2") == {"cluster": cluster, "task": {"type": "ps", "index": 1}}


def test_parameter_server_legacy_master_naming_as_the_reference():
    layout = PsLayout(("algo-1", "algo-2"), naming="master")
    cluster = {"master": ["algo-1:2222"], "worker": ["algo-2:2222"], "ps": ["algo-1:2223", "algo-2:2223"]}
    assert layout.script_config("algo-1") == {"cluster": cluster, "environment": "cloud", "task": {"type": "master", "index": 0}}
    assert layout.script_config("algo-2") == {"cluster": cluster, "environment": "cloud", "task": {"type": "worker", "index": 0}}


def test_parameter_server_count_and_ports():
    layout = PsLayout(H3, num_ps=1, worker_port=3000, ps_port=3001)
    assert layout.cluster() == {"chief": ["algo-1:3000"], "worker": ["algo-2:3000", "algo-3:3000"], "ps": ["algo-1:3001"]}
    assert layout.ps_config("algo-2") is None
    assert layout.ps_config("algo-1")["task"] == {"type": "ps", "index": 0}


def test_parameter_server_on_one_and_many_hosts():
    assert PsLayout(("a",)).cluster() == {"chief": ["a:2222"], "worker": [], "ps": ["a:2223"]}
    many = tuple(f"algo-{i}" for i in range(1, 33))
    layout = PsLayout(many)
    assert len(layout.cluster()["worker"]) == 31 and len(layout.cluster()["ps"]) == 32
    assert layout.script_config("algo-32")["task"] == {"type": "worker", "index": 30}


def test_mwms():
    assert mwms_config(H3, "algo-2") == {"cluster": {"worker": ["algo-1:8890", "algo-2:8890", "algo-3:8890"]},
                                         "task": {"type": "worker", "index": 1}}
    assert mwms_config(("solo",), "solo", port=9000) == {"cluster": {"worker": ["solo:9000"]}, "task": {"type": "worker", "index": 0}}


def test_torch_process_env():
    assert process_env(H3, "algo-2", rank_layout(H3, "algo-2", dict.fromkeys(H3, 4)), 3, 29500) == {
        "RANK": "7", "LOCAL_RANK": "3", "WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
        "NODE_RANK": "1", "MASTER_ADDR": "algo-1", "MASTER_PORT": "29500"}
    assert process_env(("solo",), "solo", rank_layout(("solo",), "solo", {"solo": 1}), 0, 1234)["WORLD_SIZE"] == "1"


def test_hosts_with_different_counts_get_the_ranks_torchrun_gives_them():
    """torchrun's agents: a host's ranks follow every process of the hosts before it; the world is them all."""
    counts = {"algo-1": 1, "algo-2": 4, "algo-3": 2}
    assert [rank_layout(H3, host, counts) for host in H3] == [Layout(0, 7, 1), Layout(1, 7, 4), Layout(5, 7, 2)]
    env = process_env(H3, "algo-3", rank_layout(H3, "algo-3", counts), 1, 29500)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == \
        ("6", "1", "7", "2", "2")
    # the attempt's order is the layout's: algo-3 first after a failover
    assert rank_layout(("algo-3", "algo-1"), "algo-1", counts) == Layout(2, 3, 1)


def test_each_hosts_count_is_its_own_or_as_it_introduced_it():
    intros = {"algo-1": {PER_HOST_INTRO: "8"}, "algo-3": {PER_HOST_INTRO: "2", "other": "x"}}
    assert host_counts(H3, "algo-2", 4, intros) == {"algo-1": 8, "algo-2": 4, "algo-3": 2}
    assert host_counts(("algo-2",), "algo-2", 4, {}) == {"algo-2": 4}
    for said in ({}, {PER_HOST_INTRO: ""}, {PER_HOST_INTRO: "0"}, {PER_HOST_INTRO: "-1"}, {PER_HOST_INTRO: "2.5"},
                 {PER_HOST_INTRO: "\u0663"}, {PER_HOST_INTRO: "4097"}):
        with pytest.raises(ClusterError, match="^algo-3 told no count of torch.distributed processes"):
            host_counts(H3, "algo-2", 4, {**intros, "algo-3": said})


def test_torch_binds_gloo_and_nccl_to_the_job_interface_unless_the_script_says_otherwise():
    from training_toolkit.runners.torch_distributed import interface_env

    assert interface_env({}, "eth0", True) == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert interface_env({"NCCL_SOCKET_IFNAME": "ib0"}, "eth0", True) == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert interface_env({}, "eth9", False) == {}  # not on this host: torch's own choice
    assert interface_env({}, None, True) == {}
