"""Nothing of the job's environment crosses the job's network in Open MPI's traffic (issue 17, item 1).

A listener on the local cluster's bridge (helpers/capture.py: every frame any host
sends, TCP reassembled, zlib streams inflated) records a whole 3-host MPI job whose
hosts carry a user secret in their environment (as SageMaker's ``environment=`` or a
Kubernetes secret gives it) and a secret hyperparameter (in ``SM_HPS``, ``SM_HP_*``,
``SM_TRAINING_ENV`` and the ranks' argv).  Every rank sees both; no packet holds either.
The control: an MCA parameter given in the custom options, which Open MPI does pass to
its daemons and ranks, is found in Open MPI's own traffic (not the toolkit's control
channel): the listener reads what Open MPI sends, compressed or not.
"""

from __future__ import annotations

import json
import os
import secrets

import pytest

from helpers.capture import Capture, findings, on_bridge
from helpers.multihost import hps, rank_files, run
from helpers.paths import OMPI5_BIN, TOOLKIT_PYTHON
from training_toolkit.core.names import CONTROL_PORT
from training_toolkit.local.launcher import LocalJob

pytestmark = [pytest.mark.root, pytest.mark.mpi, pytest.mark.sshd]

HOSTS = ("algo-1", "algo-2", "algo-3")

RANKS = f"""#!{TOOLKIT_PYTHON}
import json, os, sys
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{{rank}}.json"), "w") as f:
    json.dump({{"rank": rank, "token": os.environ.get("MY_API_TOKEN"), "hps": json.loads(os.environ["SM_HPS"]),
               "tag": os.environ["TRAINING_TOOLKIT_RANK_TAG"], "argv": sys.argv[1:]}}, f)
"""


@pytest.mark.parametrize("flavor", ["openmpi4", pytest.param("openmpi5", marks=pytest.mark.openmpi5)])
def test_a_listener_on_the_bridge_sees_no_value_of_the_jobs_environment(tmp_path, flavor):
    token, hp_secret, control = secrets.token_hex(16), secrets.token_hex(16), secrets.token_hex(16)
    src = tmp_path / "src"
    src.mkdir()
    (src / "ranks").write_text(RANKS)
    (src / "ranks").chmod(0o755)
    env = {"TRAINING_TOOLKIT_JOIN_TIMEOUT": "30", "MY_API_TOKEN": token}
    if flavor == "openmpi5":
        env["PATH"] = f"{OMPI5_BIN}:{os.environ.get('PATH', os.defpath)}"
    job = LocalJob(hosts=HOSTS, env=env,
                   hyperparameters=hps("ranks", src, sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=2,
                                       sagemaker_mpi_custom_mpi_options=f"-x CUSTOM_SECRET={hp_secret}x --mca tt_control {control}",
                                       api_secret=hp_secret))
    capture: list[Capture] = []

    def listen(cluster) -> None:
        capture.append(on_bridge(cluster).start())

    try:
        results = run(job, tmp_path, before_start=listen)
    finally:
        frames = capture[0].stop() if capture else []
    assert [r.exit_code for r in results] == [0, 0, 0], [r.failure for r in results]
    ranks = rank_files(results)
    assert sorted(ranks) == list(range(6))
    assert all(info["token"] == token and info["hps"] == {"api_secret": hp_secret} for info in ranks.values())
    assert all(info["argv"] == ["--api_secret", hp_secret] for info in ranks.values())

    seen = findings(frames, [token.encode(), hp_secret.encode(), control.encode()])
    assert len(frames) > 100, "the listener heard nothing"
    channel = f"{CONTROL_PORT}"
    assert [f for f in seen[control.encode()] if channel not in f.split()[-1].split("->")], \
        f"the control failed: Open MPI's MCA parameter was not found in Open MPI's traffic: {seen[control.encode()]}"
    assert seen[token.encode()] == [], f"the user's secret variable crossed the network: {seen[token.encode()]}"
    assert seen[hp_secret.encode()] == [], f"a hyperparameter crossed the network: {seen[hp_secret.encode()]}"
    print(json.dumps({"frames": len(frames), "control found in": seen[control.encode()]}))
