"""Fetching and installing the user's code: directories, tarballs (hostile ones too), S3, packages."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from helpers.jobs import clean_env, toolkit_cmd, train_cmd, write_job


def run_train(base: Path, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd() + ["--base-dir", str(base)], capture_output=True, text=True,
                          timeout=timeout, env=env or clean_env())


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def file_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def link_member(name: str, target: str, hard: bool = False) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info, None


def job_with_submit(job_dir: Path, submit: str, entry: str = "train.py") -> Path:
    return write_job(job_dir, hyperparameters={"sagemaker_program": json.dumps(entry),
                                               "sagemaker_submit_directory": json.dumps(submit)})


def test_local_tarball_is_unpacked_and_run(job_dir, tmp_path):
    tar = make_tar(tmp_path / "src.tar.gz", [file_member("train.py", b"print('from tar')\n"),
                                              file_member("lib/util.py", b"X = 1\n")])
    job_with_submit(job_dir, str(tar))
    result = run_train(job_dir)
    assert result.returncode == 0, result.stderr
    assert "from tar" in result.stdout
    assert (job_dir / "code" / "lib" / "util.py").exists()


@pytest.mark.parametrize("member, problem", [
    (file_member("/etc/evil.py", b"x"), "absolute path"),
    (file_member("../evil.py", b"x"), "'..'"),
    (file_member("a/../../evil.py", b"x"), "'..'"),
    (link_member("escape", "/etc/passwd"), "leaves the code dir"),
    (link_member("sub/escape", "../../outside"), "leaves the code dir"),
    (link_member("hard", "../outside", hard=True), "leaves the code dir"),
])
def test_malicious_tarballs_are_refused(job_dir, tmp_path, member, problem):
    tar = make_tar(tmp_path / "evil.tar.gz", [file_member("train.py", b"print(1)\n"), member])
    job_with_submit(job_dir, str(tar))
    t0 = time.monotonic()
    result = run_train(job_dir)
    assert result.returncode == 66
    failure = (job_dir / "output" / "failure").read_text()
    assert "refusing tar member" in failure and (problem in failure)
    assert "Traceback" not in result.stderr
    assert time.monotonic() - t0 < 10
    assert not (tmp_path / "outside").exists() and not (tmp_path / "evil.py").exists()


def test_corrupt_tarball(job_dir, tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    job_with_submit(job_dir, str(bad))
    result = run_train(job_dir)
    assert result.returncode == 66
    assert "not a readable tar.gz archive" in (job_dir / "output" / "failure").read_text()


def test_missing_submit_directory_and_entry_point(job_dir, tmp_path):
    job_with_submit(job_dir, str(tmp_path / "nowhere"))
    assert run_train(job_dir).returncode == 66
    assert "no such directory, tarball or s3:// object" in (job_dir / "output" / "failure").read_text()
    src = tmp_path / "src"
    src.mkdir()
    (src / "other.py").write_text("")
    other = tmp_path / "job2"
    job_with_submit(other, str(src), entry="train.py")
    assert run_train(other).returncode == 66
    assert "entry point 'train.py' not found" in (other / "output" / "failure").read_text()


def test_command_entry_point_runs_as_executable(job_dir, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "run.sh").write_text("#!/bin/sh\necho \"shell got: $@\"\n")  # not executable on purpose
    write_job(job_dir, hyperparameters={"sagemaker_program": '"run.sh"', "sagemaker_submit_directory": json.dumps(str(src)),
                                        "x": '"a b"'})
    result = run_train(job_dir)
    assert result.returncode == 0, result.stderr
    assert "shell got: -x a b" in result.stdout


def test_setup_py_package_is_installed_and_run_as_module(job_dir, tmp_path):
    src = tmp_path / "pkgsrc"
    (src / "mytrainer").mkdir(parents=True)
    (src / "mytrainer" / "__init__.py").write_text("")
    (src / "train.py").write_text("import sys\nprint('module run', __name__, sys.argv[1:])\n")
    (src / "setup.py").write_text("from setuptools import setup\nsetup(name='mytrainer-tt-test', version='0.1', packages=['mytrainer'], py_modules=['train'])\n")
    write_job(job_dir, hyperparameters={"sagemaker_program": '"train.py"', "sagemaker_submit_directory": json.dumps(str(src)),
                                        "e": "1"})
    try:
        result = run_train(job_dir, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "module run __main__ ['-e', '1']" in result.stdout
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", "mytrainer-tt-test"], capture_output=True)


def test_failing_requirements_install_is_a_code_error(job_dir, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('never')\n")
    (src / "requirements.txt").write_text("./does-not-exist-dir\n")
    job_with_submit(job_dir, str(src))
    result = run_train(job_dir)
    assert result.returncode == 66
    assert "pip install -r requirements.txt" in (job_dir / "output" / "failure").read_text()
    assert "never" not in result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    """A real S3-compatible server (moto in server mode) on loopback."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "moto server did not start"
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


def s3_env(url: str) -> dict[str, str]:
    return clean_env(S3_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                     AWS_DEFAULT_REGION="us-east-1")


@pytest.mark.moto
def test_s3_tarball_is_downloaded_and_run(job_dir, tmp_path, s3_server):
    import boto3

    tar = make_tar(tmp_path / "sourcedir.tar.gz", [file_member("train.py", b"print('from s3')\n")])
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="code-bucket")
    client.upload_file(str(tar), "code-bucket", "job/source/sourcedir.tar.gz")
    job_with_submit(job_dir, "s3://code-bucket/job/source/sourcedir.tar.gz")
    result = run_train(job_dir, env=s3_env(s3_server))
    assert result.returncode == 0, result.stderr
    assert "from s3" in result.stdout
    missing = tmp_path / "job2"
    job_with_submit(missing, "s3://code-bucket/job/source/missing.tar.gz")
    result = run_train(missing, env=s3_env(s3_server))
    assert result.returncode == 66
    assert "download failed" in (missing / "output" / "failure").read_text()


@pytest.mark.parametrize("files, match", [
    ({"hyperparameters.json": "{not json"}, "hyperparameters.json: malformed JSON"),
    ({"resourceconfig.json": '{"current_host": "algo-9", "hosts": ["algo-1"]}'}, "current_host: 'algo-9' is not one of hosts"),
    ({"resourceconfig.json": '{"current_host": "a", "hosts": ["a", "a"]}'}, "duplicate host name"),
    ({"resourceconfig.json": None}, "resourceconfig.json: file is missing"),
    ({"hyperparameters.json": '{"sagemaker_mpi_enabled": "\\"sometimes\\""}'}, "sagemaker_mpi_enabled: expected true or false"),
])
def test_bad_config_gives_one_line_error_failure_file_and_exit_78(job_dir, files, match):
    write_job(job_dir, script="print(1)\n")
    for name, text in files.items():
        path = job_dir / "input" / "config" / name
        if text is None:
            path.unlink()
        else:
            path.write_text(text)
    t0 = time.monotonic()
    result = run_train(job_dir)
    assert result.returncode == 78
    assert time.monotonic() - t0 < 10
    assert "Traceback" not in result.stderr
    assert match in result.stderr
    assert match in (job_dir / "output" / "failure").read_text().splitlines()[0]
    plan = subprocess.run(toolkit_cmd() + ["plan", "--base-dir", str(job_dir)], capture_output=True, text=True,
                          env=clean_env(), timeout=30)
    assert plan.returncode == 78 and match in plan.stderr and "Traceback" not in plan.stderr


def test_plan_prints_runner_command_and_redacts_secrets(job_dir):
    write_job(job_dir, hyperparameters={"lr": "0.1", "db_password": '"pw-in-hps"', "hf_token": '"hf-tok"'},
              script="print(1)\n")
    env = clean_env(AWS_SECRET_ACCESS_KEY="hunter2", MY_API_TOKEN="tok123", AWS_ACCESS_KEY_ID="AKIA123")
    out = subprocess.run(toolkit_cmd() + ["plan", "--base-dir", str(job_dir), "--json"], capture_output=True,
                         text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["runner"] == "single"
    assert doc["command"][1:] == ["train.py", "--db_password", "<redacted>", "--hf_token", "<redacted>", "--lr", "0.1"]
    assert doc["environment"]["SM_HP_LR"] == "0.1"
    assert json.loads(doc["environment"]["SM_HPS"]) == {"db_password": "<redacted>", "hf_token": "<redacted>", "lr": 0.1}
    assert "hunter2" not in out.stdout and "tok123" not in out.stdout and "AKIA123" not in out.stdout
    assert "pw-in-hps" not in out.stdout and "hf-tok" not in out.stdout  # in no variable, argument or the training env
    assert not (job_dir / "code").exists() or not any((job_dir / "code").iterdir()), "plan must not fetch code"


def test_command_without_shebang_runs_through_sh_and_binary_garbage_is_a_code_error(job_dir, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "run").write_text("echo \"plain: $1 $2\"\n")
    write_job(job_dir, hyperparameters={"sagemaker_program": '"run"', "sagemaker_submit_directory": json.dumps(str(src)),
                                        "k": '"v w"'})
    result = run_train(job_dir)
    assert result.returncode == 0, result.stderr
    assert "plain: -k v w" in result.stdout
    bad_src = tmp_path / "bad"
    bad_src.mkdir()
    (bad_src / "tool").write_bytes(b"#!/nonexistent/interpreter\n")
    other = tmp_path / "job2"
    write_job(other, hyperparameters={"sagemaker_program": '"tool"', "sagemaker_submit_directory": json.dumps(str(bad_src))})
    result = run_train(other)
    assert result.returncode == 66
    assert "cannot run" in (other / "output" / "failure").read_text()


@pytest.mark.parametrize("hps, key, expected", [
    ({"sagemaker_parameter_server_enabled": "true"}, "TF_CONFIG",
     {"cluster": {"chief": ["algo-1:2222"], "worker": ["algo-2:2222"], "ps": ["algo-1:2223", "algo-2:2223"]},
      "task": {"type": "chief", "index": 0}}),
    ({"sagemaker_multi_worker_mirrored_strategy_enabled": "true"}, "TF_CONFIG",
     {"cluster": {"worker": ["algo-1:8890", "algo-2:8890"]}, "task": {"type": "worker", "index": 0}}),
    ({"sagemaker_torch_distributed_enabled": "true"}, "processes",
     [{"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "NODE_RANK": "0",
       "MASTER_ADDR": "algo-1", "MASTER_PORT": "29500"}]),
])
def test_plan_shows_each_runners_launch_details(job_dir, hps, key, expected):
    write_job(job_dir, hyperparameters=hps, script="print(1)\n",
              resourceconfig={"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]})
    out = subprocess.run(toolkit_cmd() + ["plan", "--base-dir", str(job_dir), "--json"], capture_output=True,
                         text=True, env=clean_env(), timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[key] == expected


def test_plan_shows_the_mpirun_line_without_the_secret(job_dir):
    write_job(job_dir, hyperparameters={"sagemaker_mpi_enabled": "true", "msg": '"a b"'}, script="print(1)\n",
              resourceconfig={"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]})
    env = clean_env(TRAINING_TOOLKIT_JOB_SECRET="x" * 32)
    out = subprocess.run(toolkit_cmd() + ["plan", "--base-dir", str(job_dir), "--json"], capture_output=True,
                         text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    mpirun = doc["mpirun"]
    assert mpirun[:5] == ["mpirun", "--host", "algo-1:1,algo-2:1", "-np", "2"]
    # every rank runs the rank program, which reads the file its own host names (TRAINING_TOOLKIT_RANK_FILE) once
    # that file is the attempt's
    assert Path(mpirun[-3]).name == "training-toolkit-rank" and mpirun[-2:] == ["--attempt", "0"]
    assert doc["rank_environment_added"]["TRAINING_TOOLKIT_RANK_ATTEMPT"] == "0"  # the file's, for the rank program
    assert doc["rank_file"].startswith("TRAINING_TOOLKIT_RANK_FILE=/") and "/training-toolkit-ranks-JOBID-RANDOM/rank.env" in doc["rank_file"]
    assert "a b" not in mpirun  # nothing of the job on mpirun's line: each host's ranks read it from their own file
    assert doc["rank_command"][-3:] == ["train.py", "--msg", "a b"]
    assert doc["rank_environment_added"]["NCCL_DEBUG"] == "INFO"
    # the accept() shim, with the job's addresses as each host resolves them at run time (plan resolves nothing), and
    # the rank's stop library (native/rank_stop.c), after the user's preloads
    preloads = [Path(p).name for p in doc["rank_environment_added"]["LD_PRELOAD"].split(":")]
    assert preloads[-2:] == ["libtrainingtoolkit_netshim.so", "libtrainingtoolkit_rankstop.so"]
    assert (doc["rank_environment_added"]["TRAINING_TOOLKIT_NETSHIM_ALLOW"],
            doc["rank_environment_added"]["TRAINING_TOOLKIT_NETSHIM_PORTS"]) == ("ADDRESSES", "31000-31999")
    assert "x" * 32 not in out.stdout


@pytest.mark.parametrize("name, raw, expected", [
    ("TRAINING_TOOLKIT_MPI_FLAVOR", "openmpi3", "expected openmpi4 or openmpi5"),
    ("TRAINING_TOOLKIT_NUM_GPUS", "two", "expected a whole number, 0 or more"),
    ("TRAINING_TOOLKIT_GRACE_PERIOD", "soon", "expected a number of seconds, 0 or more"),
])
def test_a_bad_setting_ends_the_run_with_78_before_anything_starts(job_dir, tmp_path, name, raw, expected):
    ran = tmp_path / "ran"
    write_job(job_dir, hyperparameters={"sagemaker_mpi_enabled": "true"}, script=f"open({str(ran)!r}, 'w')\n")
    line = f"environment variable {name}: {expected}, got {raw!r}"
    result = run_train(job_dir, env=clean_env(**{name: raw}))
    assert result.returncode == 78, result.stderr
    assert result.stderr.strip().splitlines() == [f"training-toolkit: failed: {line}"]
    assert (job_dir / "output" / "failure").read_text().splitlines()[0] == line
    assert not ran.exists() and not (job_dir / "code").exists()
    plan = subprocess.run(toolkit_cmd() + ["plan", "--base-dir", str(job_dir)], capture_output=True, text=True,
                          env=clean_env(**{name: raw}), timeout=30)
    assert (plan.returncode, plan.stderr) == (78, f"training-toolkit: {line}\n")


def test_an_unknown_setting_is_warned_about(job_dir):
    write_job(job_dir, script="print('ran')\n")
    result = run_train(job_dir, env=clean_env(TRAINING_TOOLKIT_MPI_FLAVOUR="openmpi5"))
    assert result.returncode == 0 and "ran" in result.stdout
    assert ("warning: TRAINING_TOOLKIT_MPI_FLAVOUR is no setting of the toolkit; ignored "
            "(did you mean TRAINING_TOOLKIT_MPI_FLAVOR?)") in result.stderr


def test_plan_runs_no_mpirun_and_shows_the_flavour(job_dir, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = tmp_path / "mpirun-ran"
    (fake / "mpirun").write_text(f"#!/bin/sh\ntouch {marker}\necho 'mpirun (Open MPI) 5.0.0'\n")
    (fake / "mpirun").chmod(0o755)
    write_job(job_dir, hyperparameters={"sagemaker_mpi_enabled": "true"}, script="print(1)\n",
              resourceconfig={"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]})

    def plan(**env):
        out = subprocess.run(toolkit_cmd() + ["plan", "--base-dir", str(job_dir), "--json"], capture_output=True,
                             text=True, env=clean_env(PATH=f"{fake}:{clean_env()['PATH']}", **env), timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    doc = plan()
    assert doc["mpi_flavor"] == "detected at run time (mpirun --version); the mpirun line shown is openmpi4's"
    assert "--tag-output" in doc["mpirun"]
    doc = plan(TRAINING_TOOLKIT_MPI_FLAVOR="openmpi5")
    assert doc["mpi_flavor"] == "openmpi5"
    assert doc["mpirun"][doc["mpirun"].index("--output") + 1] == "tag"
    assert not marker.exists(), "plan ran mpirun"
