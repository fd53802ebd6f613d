"""`training-toolkit local --image`: real jobs in real containers, through the docker SDK and a real engine.

The engine is the one DOCKER_HOST names (CI: podman's service, scripts/containers-ci.sh); the image is
$TT_IMAGE, built from this checkout.  Every test checks that nothing labelled with its job is left.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from helpers.jobs import clean_env, toolkit_cmd
from helpers.multihost import hps, source_dir
from helpers.paths import IMAGE, REPO
from training_toolkit.supervise import procfs
from training_toolkit.local import engine
from training_toolkit.local.container_launcher import run_containers
from training_toolkit.local.containers import CODE_DIR, LABEL_JOB, host_names
from training_toolkit.local.job import LocalJob

pytestmark = [pytest.mark.containers]

QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TRAINING_TOOLKIT_JOIN_TIMEOUT": "60"}


@pytest.fixture(scope="module")
def client():
    c = engine.connect(engine.socket_url(os.environ))
    yield c
    c.close()


def labelled(client) -> set[str]:
    """Everything at the engine that carries the toolkit's job label."""
    return ({f"container {c['Name']}" for c in engine.containers(client, LABEL_JOB)}
            | {f"network {n['Name']}" for n in engine.networks(client, LABEL_JOB)})


@pytest.fixture
def nothing_left(client):
    before = labelled(client)
    yield
    assert labelled(client) - before == set(), "left at the engine"


def suffix() -> str:
    return secrets.token_hex(3)


def job(src: Path, program: str, hosts: int, **extra) -> LocalJob:
    values = hps(program, src, **extra)
    values["sagemaker_submit_directory"] = json.dumps(CODE_DIR)
    return LocalJob(hosts=host_names(hosts, suffix()), hyperparameters=values, env=QUIET)


def run(job_: LocalJob, tmp_path: Path, src: Path, client, **kw):
    out = io.BytesIO()
    started = time.monotonic()
    result = run_containers(job_, tmp_path / "work", environ=os.environ, image=IMAGE, source=src, out=out, client=client,
                            timeout_s=kw.pop("timeout_s", 240), **kw)
    text = out.getvalue().decode(errors="replace")
    assert result.leftovers == (), result.leftovers
    assert engine.leftovers(client, result.job_id) == []
    return result, text, time.monotonic() - started


def test_one_host_job_through_the_cli(tmp_path, nothing_left):
    work = tmp_path / "work"
    proc = subprocess.run(
        toolkit_cmd() + ["local", "--image", IMAGE, "--hosts", "1", "--host-suffix", suffix(),
                         "--source", str(REPO / "examples" / "single" / "code"), "--entry-point", "train.py",
                         "--channel", f"train={REPO / 'examples' / 'single' / 'data' / 'train'}",
                         "--hp", "epochs=20", "--workdir", str(work)],
        capture_output=True, text=True, timeout=120, env=clean_env(DOCKER_HOST=engine.socket_url(os.environ)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    host = next(p.name for p in work.iterdir() if p.name.startswith("algo-1-"))
    assert f"[{host}] " in proc.stdout
    assert f"{host}: exit 0: success" in proc.stderr
    assert (work / host / "opt" / "ml" / "output" / "success").exists()
    assert json.loads((work / host / "opt" / "ml" / "model" / "model.json").read_text())["host"] == host
    with tarfile.open(work / "model.tar.gz") as tar:
        assert "model.json" in tar.getnames()
    with tarfile.open(work / "output.tar.gz") as tar:
        assert "success" in tar.getnames()


RANKS = """\
import json, os, socket
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
total = float(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum).numpy()[0])
info = {"rank": hvd.rank(), "local_rank": hvd.local_rank(), "size": hvd.size(), "hostname": socket.gethostname(),
        "SM_CURRENT_HOST": os.environ["SM_CURRENT_HOST"], "sum": total}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{hvd.rank()}.json"), "w") as f:
    json.dump(info, f)
"""


def test_horovod_on_two_containers_of_two_processes(tmp_path, client, nothing_left):
    src = tmp_path / "src"
    src.mkdir()
    (src / "ranks.py").write_text(RANKS)
    run_, text, wall = run(job(src, "ranks.py", 2, sagemaker_mpi_enabled=True,
                               sagemaker_mpi_num_of_processes_per_host=2), tmp_path, src, client)
    assert [r.exit_code for r in run_.results] == [0, 0], text
    ranks = {}
    for r in run_.results:
        for f in r.model_dir.glob("rank-*.json"):
            info = json.loads(f.read_text())
            info["found_on"] = r.host
            ranks[info["rank"]] = info
    assert sorted(ranks) == [0, 1, 2, 3], text
    assert {i["size"] for i in ranks.values()} == {4}
    assert {i["sum"] for i in ranks.values()} == {4.0}
    for host in (r.host for r in run_.results):
        on = [i for i in ranks.values() if i["found_on"] == host]
        assert sorted(i["local_rank"] for i in on) == [0, 1]
        assert {i["hostname"] for i in on} == {host} and {i["SM_CURRENT_HOST"] for i in on} == {host}
    print(f"horovod 2x2 in containers: {wall:.1f} s")


def test_parameter_server_strategy_on_three_containers(tmp_path, client, nothing_left):
    src = source_dir(tmp_path, "ps_train.py")
    run_, text, wall = run(job(src, "ps_train.py", 3, sagemaker_parameter_server_enabled=True), tmp_path, src, client)
    assert [r.exit_code for r in run_.results] == [0, 0, 0], text + str([r.failure for r in run_.results])
    chief = json.loads((run_.results[0].model_dir / "chief.json").read_text())
    assert chief["last_loss"] < chief["first_loss"] / 10
    hosts = [r.host for r in run_.results]
    config = json.loads((run_.results[0].model_dir / "tf_config-chief-0.json").read_text())
    assert config["cluster"]["chief"] == [f"{hosts[0]}:2222"]
    assert config["cluster"]["worker"] == [f"{hosts[1]}:2222", f"{hosts[2]}:2222"]
    print(f"parameter server on 3 containers: {wall:.1f} s")


RAISES = """\
import os, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
if comm.Get_rank() == 3:
    raise RuntimeError("rank 3 gives up")
time.sleep(120)
"""


def test_a_rank_that_raises_ends_every_container_within_seconds(tmp_path, client, nothing_left):
    src = tmp_path / "src"
    src.mkdir()
    (src / "raises.py").write_text(RAISES)
    run_, text, wall = run(job(src, "raises.py", 2, sagemaker_mpi_enabled=True,
                               sagemaker_mpi_num_of_processes_per_host=2), tmp_path, src, client)
    codes = [r.exit_code for r in run_.results]
    assert all(c not in (0, None) for c in codes), (codes, text)
    ended = [r.ended_at for r in run_.results]
    assert max(ended) - min(ended) < 5, f"containers ended {max(ended) - min(ended):.1f} s apart"
    assert wall < 60, f"the job took {wall:.0f} s: the ranks' sleep was not cut short"
    second = run_.results[1].host
    for r in run_.results:
        assert r.failure and second in r.failure and "rank 3" in r.failure, (r.host, r.failure)
    # Open MPI's --tag-output may split a line of the traceback ("RuntimeError[1,3]<stderr>:: ..."): no exact line.
    assert "RuntimeError" in text and "rank 3 gives up" in text


SIGTERM = """\
import os, signal, sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
def on_term(signum, frame):
    with open(os.path.join(os.environ["SM_MODEL_DIR"], f"term-{rank}"), "w") as f:
        f.write("graceful")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(os.environ["SM_MODEL_DIR"], f"started-{rank}"), "w").close()
time.sleep(300)
"""


def test_sigterm_to_local_gives_every_rank_its_grace_and_removes_every_container(tmp_path, nothing_left):
    src = tmp_path / "src"
    src.mkdir()
    (src / "term.py").write_text(SIGTERM)
    work = tmp_path / "work"
    proc = subprocess.Popen(
        toolkit_cmd() + ["local", "--image", IMAGE, "--hosts", "2", "--host-suffix", suffix(), "--source", str(src),
                         "--entry-point", "term.py", "--distribution", "mpi", "--processes-per-host", "2",
                         "--stop-grace", "20", "--env", "TRAINING_TOOLKIT_JOIN_TIMEOUT=60", "--workdir", str(work)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=clean_env(DOCKER_HOST=engine.socket_url(os.environ)))
    deadline = time.monotonic() + 120
    while len(list(work.glob("*/opt/ml/model/started-*"))) < 4 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    assert len(list(work.glob("*/opt/ml/model/started-*"))) == 4
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, out
    graceful = sorted(p.name for p in work.glob("*/opt/ml/model/term-*"))
    assert graceful == ["term-0", "term-1", "term-2", "term-3"], out
    assert "interrupted: stopping the hosts" in out


def test_sagemaker_sdk_host_names_no_interface_name_and_abort_on_exit(tmp_path, client, nothing_left):
    """As SageMaker's local mode runs the image: hosts algo-N-xxxxx, a resourceconfig without an interface
    name, and every container stopped once the first has exited (docker-compose --abort-on-container-exit)."""
    src = source_dir(tmp_path, "mpi_allreduce.py")
    job_ = job(src, "mpi_allreduce.py", 2, sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=2)
    assert all(len(h.rsplit("-", 1)[1]) == 6 for h in job_.hosts)
    run_, text, _ = run(job_, tmp_path, src, client, interface=None, abort_on_exit=True)
    resource = json.loads((run_.results[0].opt_ml / "input" / "config" / "resourceconfig.json").read_text())
    assert "network_interface_name" not in resource
    first = min(run_.results, key=lambda r: r.ended_at or float("inf"))
    assert first.exit_code == 0 and first.success, text
    assert run_.results[0].success, text


def test_no_engine_is_one_line_naming_the_socket_and_how_to_start_one(tmp_path):
    sock = f"unix://{tmp_path}/no-engine.sock"
    proc = subprocess.run(toolkit_cmd() + ["local", "--image", IMAGE, "--source", str(REPO / "examples" / "single" / "code"),
                                           "--entry-point", "train.py", "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=60, env=clean_env(DOCKER_HOST=sock))
    assert proc.returncode == 69
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no container engine at {sock}" in lines[0] and "podman system service" in lines[0], lines


@pytest.mark.parametrize("image, expected", [
    ("localhost/no-such-image:nothing", "image localhost/no-such-image:nothing not found"),
    ("localhost/bookworm-minbase", "has no `train` on its PATH"),
])
def test_an_image_that_cannot_run_the_job_is_one_line_and_leaves_nothing(tmp_path, client, nothing_left, image, expected):
    try:
        client.images.get(image)
    except Exception:
        if "minbase" in image:
            pytest.skip(f"{image} is not at the engine (scripts/verify-image.sh base)")
    proc = subprocess.run(toolkit_cmd() + ["local", "--image", image, "--hosts", "2", "--host-suffix", suffix(),
                                           "--source", str(REPO / "examples" / "single" / "code"), "--entry-point",
                                           "train.py", "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=60, env=clean_env(DOCKER_HOST=engine.socket_url(os.environ)))
    assert proc.returncode == 69
    lines = [line for line in proc.stderr.strip().splitlines() if expected in line]
    assert len(lines) == 1, proc.stderr


def test_a_name_clash_is_one_line_and_the_existing_container_is_untouched(tmp_path, client, nothing_left):
    tail = suffix()
    existing = client.containers.create(IMAGE, name=f"algo-2-{tail}", entrypoint=["true"])
    try:
        proc = subprocess.run(toolkit_cmd() + ["local", "--image", IMAGE, "--hosts", "2", "--host-suffix", tail,
                                               "--source", str(REPO / "examples" / "single" / "code"), "--entry-point",
                                               "train.py", "--workdir", str(tmp_path / "w")],
                              capture_output=True, text=True, timeout=60, env=clean_env(DOCKER_HOST=engine.socket_url(os.environ)))
        assert proc.returncode == 69
        assert f"containers named algo-2-{tail} already exist" in proc.stderr
        existing.reload()
        assert existing.name == f"algo-2-{tail}"
        assert not any(c["Name"] == f"algo-1-{tail}" for c in engine.containers(client))
    finally:
        existing.remove(force=True)


def test_the_timeout_stops_every_container_with_its_grace(tmp_path, client, nothing_left):
    src = tmp_path / "src"
    src.mkdir()
    (src / "term.py").write_text(SIGTERM)
    run_, text, wall = run(job(src, "term.py", 2, sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=2),
                           tmp_path, src, client, timeout_s=25, stop_grace_s=20)
    assert all(r.exit_code not in (0, None) for r in run_.results), [r.exit_code for r in run_.results]
    started = sorted(p.name for r in run_.results for p in r.model_dir.glob("started-*"))
    graceful = sorted(p.name for r in run_.results for p in r.model_dir.glob("term-*"))
    assert started == ["started-0", "started-1", "started-2", "started-3"], text
    assert graceful == ["term-0", "term-1", "term-2", "term-3"], text
    assert wall < 25 + 20, f"{wall:.0f} s"


SPIN = "import time\nopen('/opt/ml/model/started', 'w').close()\nwhile True:\n    time.sleep(1)\n"


def start_spinning_job(tmp_path: Path, name: str) -> tuple[subprocess.Popen, str]:
    """A 2-host job whose hosts spin, once both have started; its host-name suffix."""
    src = tmp_path / f"{name}-src"
    src.mkdir()
    (src / "spin.py").write_text(SPIN)
    work, tail = tmp_path / name, suffix()
    proc = subprocess.Popen(
        toolkit_cmd() + ["local", "--image", IMAGE, "--hosts", "2", "--host-suffix", tail, "--source", str(src),
                         "--entry-point", "spin.py", "--workdir", str(work)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=clean_env(DOCKER_HOST=engine.socket_url(os.environ)))
    deadline = time.monotonic() + 120
    while len(list(work.glob("*/opt/ml/model/started"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.2)
    return proc, tail


def of_job(client, tail: str) -> set[str]:
    """The containers of the job whose hosts end in ``tail``, and their network (other jobs may run meanwhile)."""
    containers = [c for c in engine.containers(client, LABEL_JOB) if c["Name"].endswith(f"-{tail}")]
    jobs = {c["Labels"][LABEL_JOB] for c in containers}
    return ({f"container {c['Name']}" for c in containers}
            | {f"network {n['Name']}" for n in engine.networks(client, LABEL_JOB) if n["Labels"][LABEL_JOB] in jobs})


def reaper_of(local: subprocess.Popen) -> int:
    (pid,) = [p.pid for p in procfs.descendants(local.pid) if "training_toolkit.local.reaper" in (procfs.cmdline(p.pid) or "")]
    return pid


def test_a_killed_local_leaves_no_container_its_reaper_removes_them(tmp_path, client, nothing_left):
    local, tail = start_spinning_job(tmp_path, "killed")
    assert len(of_job(client, tail)) == 3  # two containers and their network
    reaper = reaper_of(local)
    os.killpg(local.pid, signal.SIGKILL)  # the reaper has a session of its own
    local.communicate(timeout=30)
    deadline = time.monotonic() + 60
    while of_job(client, tail):
        assert time.monotonic() < deadline, f"left after local was killed: {of_job(client, tail)}"
        time.sleep(0.2)
    while procfs.alive(reaper):  # it exits once it has said what it removed
        assert time.monotonic() < deadline, "the reaper outlived its work"
        time.sleep(0.05)


def test_what_a_killed_local_and_its_killed_reaper_left_the_next_local_removes(tmp_path, client, nothing_left):
    local, tail = start_spinning_job(tmp_path, "killed")
    os.kill(reaper_of(local), signal.SIGKILL)
    os.killpg(local.pid, signal.SIGKILL)
    local.communicate(timeout=30)
    assert len(of_job(client, tail)) == 3  # nobody removed them: the next launcher on this machine does
    proc = subprocess.run(
        toolkit_cmd() + ["local", "--image", IMAGE, "--hosts", "1", "--host-suffix", suffix(),
                         "--source", str(REPO / "examples" / "single" / "code"), "--entry-point", "train.py",
                         "--channel", f"train={REPO / 'examples' / 'single' / 'data' / 'train'}",
                         "--workdir", str(tmp_path / "next")],
        capture_output=True, text=True, timeout=240, env=clean_env(DOCKER_HOST=engine.socket_url(os.environ)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"left by a launcher that died (pid {local.pid})" in proc.stderr
    assert of_job(client, tail) == set()
