"""The simulated kubelet's restart rules (test/helpers/kubelet.py), as exact tables."""

from __future__ import annotations

import pytest

from helpers.kubelet import Kubelet, back_off, job_condition, restarts_again, retryable, within_backoff_limit


def test_the_crash_loop_back_off_is_none_then_10_s_doubling_to_300_s():
    assert [back_off(n) for n in range(8)] == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]


def test_restart_policies():
    table = {("Never", 1): False, ("Never", 0): False, ("OnFailure", 1): True, ("OnFailure", -9): True,
             ("OnFailure", 0): False, ("Always", 0): True}
    assert {key: restarts_again(*key) for key in table} == table
    with pytest.raises(ValueError, match="no restartPolicy 'ExitCode'"):
        restarts_again("ExitCode", 1)  # the operator's own policy recreates pods: not the kubelet's


def test_the_operators_backoff_limit_counts_every_containers_restarts():
    table = {(None, 99): True, (0, 0): False, (1, 0): False, (2, 0): True, (2, 1): False, (3, 1): True}
    assert {key: within_backoff_limit(*key) for key in table} == table


def test_the_kubelet_restarts_each_pod_with_its_own_back_off_within_the_jobs_limit():
    kubelet = Kubelet("OnFailure", backoff_limit=4, gone={"w-2"})
    assert [kubelet("w-0", 137), kubelet("w-0", 1), kubelet("w-1", 1), kubelet("w-2", 1), kubelet("w-0", 0),
            kubelet("w-1", 1)] == [1.0, 11.0, 1.0, None, None, None]  # the 4th restart would fail the job
    assert kubelet.restarts == {"w-0": 2, "w-1": 1}


def test_the_operators_exit_code_policy_retries_128_and_above_and_a_dead_nodes_pod():
    table = {-9: True, 0: False, 1: False, 69: False, 127: False, 128: True, 143: True, 203: True, 255: True}
    assert {code: retryable(code) for code in table} == table


def test_a_pytorchjobs_condition_is_decided_by_its_first_decisive_end():
    m, w = "ptj-master-0", "ptj-worker-0"
    assert job_condition([], m) == "Running"
    assert job_condition([(m, -9), (w, 203)], m) == "Running"  # both made again
    assert job_condition([(m, 203), (w, 0), (m, 0)], m) == "Succeeded"  # a worker's 0 decides nothing
    assert job_condition([(w, 69), (m, 0)], m) == "Failed"  # below 128 fails it, for good
    assert job_condition([(m, 0), (w, 69)], m) == "Succeeded"  # a Succeeded job never changes
