"""Run the reference ``sagemaker-training`` (5.1.4, console script ``train``) on a fake
``/opt/ml`` tree and capture what the user script saw: its environment, argv and cwd.

Set-up: ``scripts/setup-reference.sh`` installs it into ``<repo>/.venv-ref`` (or the venv
named by ``$REFERENCE_VENV``). Without it :func:`reference_train` returns None; skip then.

What the reference does (read from its source, confirmed by captures; paths are under
the base dir ``B`` = ``$SAGEMAKER_BASE_DIR``, default ``/opt/ml``):

Resolution
- Hyperparameter values are ``json.loads``-ed when they parse, else kept raw, so
  ``"1.50"`` -> ``1.5``, ``"1e3"`` -> ``1000.0``, ``"null"`` -> None, ``"True"`` stays a
  string. Reserved keys ``sagemaker_{program, submit_directory, enable_cloudwatch_metrics,
  region, container_log_level, job_name, s3_output}``, ``default_user_module_name`` and
  ``_tuning_objective_metric`` are dropped; every other ``sagemaker_*`` key goes to
  ``SM_FRAMEWORK_PARAMS``; the rest are the user's hps (argv, ``SM_HPS``, ``SM_HP_*``).
  ``sagemaker_enable_cloudwatch_metrics`` has no effect at all.
- ``sagemaker_program`` and ``sagemaker_submit_directory`` are written JSON-encoded by the
  SDK (``"\\"train.py\\""``); a raw string works too (falls back to the raw value).
  ``SAGEMAKER_PROGRAM`` in the environment overrides the hp. ``SAGEMAKER_SUBMIT_DIRECTORY``
  in the environment is read and then ignored. No program -> ClientError "entry point
  name is empty", and ``SM_MODULE_NAME`` would be the string ``"None"``.
- Entry point names must match ``^[A-Za-z0-9._][A-Za-z0-9._+-]*(/[A-Za-z0-9._+-]+)*$``
  with no ``.``/``..`` segments (ClientError otherwise).
- resourceconfig: ``current_host`` and ``hosts`` required; ``network_interface_name``
  default ``eth0``; the group is read from ``current_group_name`` (NOT
  ``current_instance_group``), default ``homogeneousCluster``; ``current_instance_type``
  default ``local``. ``SM_CURRENT_INSTANCE_GROUP_HOSTS``/``SM_INSTANCE_GROUPS`` are ``[]``
  and ``SM_INSTANCE_GROUPS_DICT`` ``{}`` without ``instance_groups``; ``SM_IS_HETERO`` is
  ``len(instance_groups) > 1``. ``SM_DISTRIBUTION_INSTANCE_GROUPS`` is
  ``[current group]`` only when a distribution key is truthy, else ``[]`` (or the hp
  ``sagemaker_distribution_instance_groups`` when given).
- Missing resourceconfig/inputdataconfig/hyperparameters file -> "Framework Error"
  FileNotFoundError and exit code 2 (the exception's errno).

Code dir
- Importing ``sagemaker_training.environment`` creates ``B/code`` (and, when neither
  ``/opt/ml`` nor ``$SAGEMAKER_BASE_DIR`` exists, a whole tree under
  ``~/sagemaker_local/jobs/<time>/opt/ml``: always set ``SAGEMAKER_BASE_DIR``).
- Before the script runs, and only if ``B/code`` is EMPTY, the submit dir is fetched into
  it: ``s3://`` tarball (boto3), local dir (``copytree``), local ``.tar.gz``, else
  ``copy2`` of a single file. A non-empty ``B/code`` is used as is, whatever the submit
  dir says (stale code wins). ``SM_MODULE_DIR`` is the submit dir string as given
  (default ``B/code``), never the code dir it was copied to.
- The script always runs from ``B/code`` (its cwd), with ``B/code`` first on PYTHONPATH.
- pip: a ``setup.py`` in ``B/code`` -> ``python -m pip install .`` (+ ``-r
  requirements.txt``) into the reference's own interpreter, then ``python -m MODULE``; a
  ``.py`` program with ``requirements.txt`` -> ``pip install -r requirements.txt``.
  ``*.sh`` or no ``.py`` suffix -> chmod 0777 and ``/bin/sh -c "./entry 'arg' ..."``
  (shlex-quoted, so no injection in 5.1.4).
- Python command: ``[sys.executable, "--", entry, *args]`` (the ``--`` shows in
  ``sys.orig_argv``, not in ``sys.argv``); ``sys.executable`` is the venv's python.
  ``sys.argv[0]`` is the entry as named (``dump_env.py``; ``./run.sh`` for commands).

Arguments: ``mapping.to_cmd_args``: keys sorted; ``--key``, or ``-k`` for one-character
keys; value ``str(v)``: ``True``/``False``, ``0.1``, ``[1, 'x']``, dicts as
``k=v,k2=v2`` sorted by key (nested values ``str()``-ed), None -> ``""``. Strings verbatim.

Environment given to the script: the train process's WHOLE environment is inherited
(``Popen(env=os.environ)``), plus:
- ``SM_*`` from ``mapping.to_env_vars``: ``SM_`` + key upper-cased (dashes and other
  characters kept); strings raw, None -> ``""``, everything else compact JSON with sorted
  keys (``SM_HP_B=true`` while argv has ``True``). The full set (real capture) is listed in
  :data:`REFERENCE_SM_VARS`, plus ``SM_CHANNEL_<NAME>`` per inputdataconfig channel
  (dirs are not checked) and ``SM_HP_<KEY>`` per user hp.
- ``SM_TRAINING_ENV`` is ``dict(Environment())``: every property, incl. ``is_master``,
  ``master_hostname``, ``distribution_hosts``, ``job_name`` (``$TRAINING_JOB_NAME`` or
  null), ``is_modelparallel_enabled`` (null unless ``$SM_HP_MP_PARAMETERS``),
  ``is_smddprun_installed``/``is_smddpmprun_installed`` (``which``), ``topology`` ([]).
- ``CURRENT_HOST`` (= current_host), ``SAGEMAKER_JOB_NAME`` (hp ``sagemaker_job_name``
  or ``""``), ``SAGEMAKER_REGION`` (hp ``sagemaker_region``, else boto3's default region
  from ``$AWS_DEFAULT_REGION``/``~/.aws/config``, else ``""``). ``TRAINING_JOB_NAME`` is
  only read, never set.
- ``PYTHONPATH`` = ``":".join(sys.path)`` of the train process, REPLACING any inherited
  value (whose entries do survive, since they were on sys.path): ``B/code``, the venv's
  ``bin`` dir (the console script's own dir), then the interpreter's stdlib and
  site-packages. Interpreter-specific: compare only its first entry.
- ``LC_CTYPE=C.UTF-8`` appears when the caller had no LANG/LC_* (Python's locale
  coercion in the train process), so pass LANG.
- ``SAGEMAKER_TRAINING_MODULE`` in the environment switches to "import framework and
  call it" instead of running the script: keep it unset.

Run-to-run / machine-dependent values to normalise: ``SM_NUM_CPUS``
(``multiprocessing.cpu_count()``, not cgroup-aware), ``SM_NUM_GPUS`` (``nvidia-smi
--list-gpus``), ``SM_NUM_NEURONS`` (``neuron-ls -j``; 64 for ``trn2.48xlarge``) also
inside ``SM_TRAINING_ENV``; ``is_smddp*run_installed``; ``SAGEMAKER_REGION``; the
``PYTHONPATH`` tail; the harness's own ``DUMP_TO``/``SM_STUDIO_LOCAL_MODE``; paths
under the temp base dir. Nothing else varies (no PIDs, timestamps or ports on this path).

Host names: after fetching the code and before the script, every host in ``hosts`` is
``socket.gethostbyname``-ed with exponential retries for up to 15 minutes (the
``Environment`` is built again for it). ``SM_STUDIO_LOCAL_MODE=true`` (case-insensitive)
skips this; it then also reaches the script's environment. :func:`run_reference` sets
it unless told otherwise (``extra_env={"SM_STUDIO_LOCAL_MODE": None}``).

Output and exit: success -> empty ``B/output/success``, exit 0 (``B/output`` must exist,
else the open fails). Script exit N != 0 -> ``B/output/failure`` =
``ExecuteUserScriptError:\\nExitCode N\\nErrorMessage ""\\nCommand "<cmd joined by
spaces>"`` (not written if the script wrote one), exit 1 whatever N; other ClientErrors
also exit 1; other exceptions write "Framework Error: <traceback>" and exit with the
exception's errno, else 1. The script's stdout/stderr are inherited unchanged (no
re-chunking on this non-MPI path); the reference logs to stderr: ``Environment()`` is
built 3 times per run, 4 with the host-name wait (each runs ``nvidia-smi``,
``neuron-ls``, ``which smddprun``/``smddpmprun`` and reads boto3's region), and one INFO
block prints the training env, every SM_ var and the command.
``B/output/intermediate`` is only created (and synced to S3) when hp
``sagemaker_s3_output`` is given and the dir does not exist yet. SIGTERM is not
forwarded (run the reference in its own session and kill the group).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from helpers.paths import REPO

DEFAULT_REFERENCE_VENV = REPO / ".venv-ref"
DUMP_ENV_VAR = "DUMP_TO"
DEFAULT_ENTRY_POINT = "dump_env.py"

#: Every variable the reference adds for a job with channels and hyperparameters
#: (from a real capture of 5.1.4), besides SM_CHANNEL_<NAME> and SM_HP_<KEY>.
REFERENCE_SM_VARS = frozenset(
    {
        "SM_HOSTS", "SM_NETWORK_INTERFACE_NAME", "SM_HPS", "SM_USER_ENTRY_POINT",
        "SM_FRAMEWORK_PARAMS", "SM_RESOURCE_CONFIG", "SM_INPUT_DATA_CONFIG",
        "SM_OUTPUT_DATA_DIR", "SM_CHANNELS", "SM_CURRENT_HOST", "SM_CURRENT_INSTANCE_TYPE",
        "SM_CURRENT_INSTANCE_GROUP", "SM_CURRENT_INSTANCE_GROUP_HOSTS", "SM_INSTANCE_GROUPS",
        "SM_INSTANCE_GROUPS_DICT", "SM_DISTRIBUTION_INSTANCE_GROUPS", "SM_IS_HETERO",
        "SM_MODULE_NAME", "SM_LOG_LEVEL", "SM_FRAMEWORK_MODULE", "SM_INPUT_DIR",
        "SM_INPUT_CONFIG_DIR", "SM_OUTPUT_DIR", "SM_NUM_CPUS", "SM_NUM_GPUS",
        "SM_NUM_NEURONS", "SM_MODEL_DIR", "SM_MODULE_DIR", "SM_TRAINING_ENV",
        "SM_USER_ARGS", "SM_OUTPUT_INTERMEDIATE_DIR",
    }
)
#: Non-SM variables the reference sets in its own environment, inherited by the script.
REFERENCE_OTHER_VARS = frozenset({"CURRENT_HOST", "SAGEMAKER_JOB_NAME", "SAGEMAKER_REGION", "PYTHONPATH"})
#: Variables whose values depend on the machine, not on the job.
MACHINE_DEPENDENT_VARS = frozenset({"SM_NUM_CPUS", "SM_NUM_GPUS", "SM_NUM_NEURONS", "SAGEMAKER_REGION"})
#: Variables run_reference itself puts in the environment.
HARNESS_VARS = frozenset({DUMP_ENV_VAR, "DUMP_EXIT_CODE", "SM_STUDIO_LOCAL_MODE", "SAGEMAKER_BASE_DIR"})

_DUMP_SCRIPT = f"""\
#!/usr/bin/env python3
import json, os, sys

with open(os.environ[{DUMP_ENV_VAR!r}], "w") as f:
    json.dump(
        {{"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(),
          "orig_argv": getattr(sys, "orig_argv", []), "executable": sys.executable}},
        f,
    )
sys.exit(int(os.environ.get("DUMP_EXIT_CODE", "0")))
"""


@dataclass(frozen=True)
class Capture:
    """What the user script saw, and how ``train`` ended.

    ``env``/``argv``/``cwd`` are empty when the script never ran (see :attr:`ran`).
    ``orig_argv`` is the script's ``sys.orig_argv`` (interpreter command line);
    ``output_files`` maps paths relative to ``B/output`` to their text.
    """

    env: dict[str, str]
    argv: list[str]
    cwd: str
    returncode: int
    stdout: str
    stderr: str
    orig_argv: list[str] = field(default_factory=list)
    executable: str = ""
    output_files: dict[str, str] = field(default_factory=dict)

    @property
    def ran(self) -> bool:
        return bool(self.argv)

    @property
    def user_args(self) -> list[str]:
        return self.argv[1:]

    def json_env(self, name: str):
        """``json.loads`` of one environment variable."""
        return json.loads(self.env[name])


def reference_venv() -> Path:
    return Path(os.environ.get("REFERENCE_VENV") or DEFAULT_REFERENCE_VENV)


def reference_train() -> Path | None:
    """``<venv>/bin/train`` of the reference, or None when it is not installed."""
    train = reference_venv() / "bin" / "train"
    return train if os.access(train, os.X_OK) else None


def reference_python() -> Path | None:
    python = reference_venv() / "bin" / "python"
    return python if reference_train() and os.access(python, os.X_OK) else None


SKIP_REASON = (
    "reference sagemaker-training not installed; run scripts/setup-reference.sh "
    f"(looked for {DEFAULT_REFERENCE_VENV}/bin/train or $REFERENCE_VENV/bin/train)"
)


def write_dump_script(path: Path) -> None:
    """Write the entry script that dumps env/argv/cwd as JSON to ``$DUMP_TO`` and exits
    with ``$DUMP_EXIT_CODE`` (default 0). It is Python with a ``python3`` shebang, so it
    also works under a non-``.py`` name (run as a command)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_DUMP_SCRIPT)
    path.chmod(0o755)


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2))


def make_tree(
    base_dir: Path,
    *,
    hyperparameters: Mapping[str, str],
    resourceconfig: dict | None,
    inputdataconfig: dict | None,
    channels: Iterable[str] = (),
    entry_point: str = DEFAULT_ENTRY_POINT,
    submit: str = "dir",
) -> None:
    """Lay out a SageMaker tree under ``base_dir`` with the dump script as entry point.

    ``hyperparameters`` are written as given (string values, as SageMaker does).
    ``sagemaker_program`` (JSON-encoded ``entry_point``) and ``sagemaker_submit_directory``
    (JSON-encoded path) are added unless present. ``submit`` says where the code is:

    - ``"dir"``: in ``base_dir/submit/``, named by the hp; ``code/`` is left empty and
      the toolkit must copy the code there (the usual SageMaker flow, minus S3).
    - ``"tar"``: ``base_dir/submit/sourcedir.tar.gz``, named by the hp; ``code/`` empty.
    - ``"code"``: directly in ``base_dir/code/``, and the hp names ``base_dir/code``.
    - ``"none"``: directly in ``base_dir/code/``, no ``sagemaker_submit_directory`` hp.

    ``resourceconfig=None`` writes a single host ``algo-1``; ``inputdataconfig=None`` one
    File-mode channel per name in ``channels``. ``input/data/<name>`` is created for
    ``channels`` and every inputdataconfig channel; also ``model/``, ``output/data/``.
    """
    base = Path(base_dir)
    channels = list(channels)
    if resourceconfig is None:
        resourceconfig = {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}
    if inputdataconfig is None:
        inputdataconfig = {
            ch: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}
            for ch in channels
        }

    hps = dict(hyperparameters)
    code_dir = base / "code"
    code_dir.mkdir(parents=True, exist_ok=True)
    if submit in ("code", "none"):
        write_dump_script(code_dir / entry_point)
        submit_uri = str(code_dir) if submit == "code" else None
    elif submit == "dir":
        src = base / "submit"
        write_dump_script(src / entry_point)
        submit_uri = str(src)
    elif submit == "tar":
        src = base / "submit"
        src.mkdir(parents=True, exist_ok=True)
        submit_uri = str(src / "sourcedir.tar.gz")
        with tempfile.TemporaryDirectory() as stage:
            write_dump_script(Path(stage) / entry_point)
            with tarfile.open(submit_uri, "w:gz") as tar:
                tar.add(Path(stage) / entry_point, arcname=entry_point)
    else:
        raise ValueError(f"submit must be dir, tar, code or none, not {submit!r}")
    hps.setdefault("sagemaker_program", json.dumps(entry_point))
    if submit_uri is not None:
        hps.setdefault("sagemaker_submit_directory", json.dumps(submit_uri))

    config = base / "input" / "config"
    _write_json(config / "hyperparameters.json", hps)
    _write_json(config / "resourceconfig.json", resourceconfig)
    _write_json(config / "inputdataconfig.json", inputdataconfig)
    for ch in dict.fromkeys([*channels, *inputdataconfig]):
        (base / "input" / "data" / ch).mkdir(parents=True, exist_ok=True)
    (base / "model").mkdir(parents=True, exist_ok=True)
    (base / "output" / "data").mkdir(parents=True, exist_ok=True)


def _base_env() -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8")}
    if "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    return env


def _read_outputs(output_dir: Path) -> dict[str, str]:
    files = {}
    if output_dir.is_dir():
        for p in sorted(output_dir.rglob("*")):
            if p.is_file():
                files[str(p.relative_to(output_dir))] = p.read_text(errors="replace")
    return files


def run_reference(
    base_dir: Path,
    *,
    timeout: float = 60,
    extra_env: Mapping[str, str | None] | None = None,
) -> Capture:
    """Run the reference ``train`` with ``SAGEMAKER_BASE_DIR=base_dir`` and capture what the
    entry script saw (lay the tree out with :func:`make_tree` first).

    The process environment is a small fixed one (PATH, HOME, LANG), plus
    ``SAGEMAKER_BASE_DIR``, ``DUMP_TO`` and ``SM_STUDIO_LOCAL_MODE=true`` (skips the
    host-name wait), then ``extra_env`` (a None value removes a key). On timeout the
    whole process group is killed and ``subprocess.TimeoutExpired`` raised.
    """
    train = reference_train()
    if train is None:
        raise FileNotFoundError(SKIP_REASON)
    base = Path(base_dir).resolve()
    with tempfile.TemporaryDirectory(prefix="reference-dump-") as tmp:
        dump = Path(tmp) / "dump.json"
        env = _base_env()
        env.update({"SAGEMAKER_BASE_DIR": str(base), DUMP_ENV_VAR: str(dump), "SM_STUDIO_LOCAL_MODE": "true"})
        for key, value in (extra_env or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        proc = subprocess.Popen(
            [str(train)],
            cwd=str(base),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc)  # the reference orphans children; reap any left over
        data = json.loads(dump.read_text()) if dump.exists() and dump.stat().st_size else {}
    return Capture(
        env=data.get("env", {}),
        argv=data.get("argv", []),
        cwd=data.get("cwd", ""),
        returncode=proc.returncode,
        stdout=stdout,
        stderr=stderr,
        orig_argv=data.get("orig_argv", []),
        executable=data.get("executable", ""),
        output_files=_read_outputs(base / "output"),
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.returncode is None:
        proc.communicate()


def comparable_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` minus what may legitimately differ between two toolkits on one job: the
    harness's own variables, machine-dependent counts, and the PYTHONPATH tail (only its
    first entry, the code dir, is kept). ``SM_TRAINING_ENV`` is kept as is."""
    out = {k: v for k, v in env.items() if k not in HARNESS_VARS | MACHINE_DEPENDENT_VARS}
    if "PYTHONPATH" in out:
        out["PYTHONPATH"] = out["PYTHONPATH"].split(":", 1)[0]
    return out
