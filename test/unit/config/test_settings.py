"""Settings: every variable parsed once, exactly; bad values named; README's table is the code's table."""

import re
from pathlib import Path

import pytest

from training_toolkit.config import settings

from training_toolkit.config import settings_help
from training_toolkit.core.errors import EXIT_CONFIG, ConfigError
from training_toolkit.config.settings import VARIABLES, Settings, parse

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src" / "training_toolkit"

DEFAULTS = Settings(
    base_dir="/opt/ml", grace_s=120.0, job_secret=None, control_port=8950, join_timeout_s=180.0, heartbeat_s=1.0,
    peer_timeout_s=10.0, ssh_port=22, ssh_keys=None, sshd=None, mpi_flavor=None, python=None, num_gpus=None,
)


def test_defaults():
    assert parse({}) == DEFAULTS


def test_every_variable_read():
    env = {
        "SAGEMAKER_BASE_DIR": "/jobs/1",
        "TRAINING_TOOLKIT_GRACE_PERIOD": "0",
        "TRAINING_TOOLKIT_JOB_SECRET": "s" * 32,
        "TRAINING_TOOLKIT_CONTROL_PORT": "9000",
        "TRAINING_TOOLKIT_JOIN_TIMEOUT": "2.5",
        "TRAINING_TOOLKIT_HEARTBEAT": "0.2",
        "TRAINING_TOOLKIT_PEER_TIMEOUT": "3",
        "TRAINING_TOOLKIT_SSH_PORT": "2200",
        "TRAINING_TOOLKIT_SSH_KEYS": "/keys",
        "TRAINING_TOOLKIT_SSHD": "/usr/sbin/sshd",
        "TRAINING_TOOLKIT_MPI_FLAVOR": "openmpi5",
        "TRAINING_TOOLKIT_PYTHON": "/venv/bin/python",
        "TRAINING_TOOLKIT_NUM_GPUS": "0",
        "UNRELATED": "x",
    }
    assert parse(env)._replace(given=frozenset()) == Settings(
        base_dir="/jobs/1", grace_s=0.0, job_secret=b"s" * 32, control_port=9000, join_timeout_s=2.5, heartbeat_s=0.2,
        peer_timeout_s=3.0, ssh_port=2200, ssh_keys=settings.KeyFiles("/keys"), sshd="/usr/sbin/sshd",
        mpi_flavor="openmpi5", python="/venv/bin/python", num_gpus=0,
    )
    assert parse(env).given == {var.field for var in VARIABLES if var.name in env}
    assert parse({"TRAINING_TOOLKIT_MPI_FLAVOR": "openmpi4", "TRAINING_TOOLKIT_NUM_GPUS": "8"})[10:13] == \
        ("openmpi4", None, 8)
    kubernetes = {"TRAINING_TOOLKIT_PLATFORM": "jobset", "TRAINING_TOOLKIT_HYPERPARAMETERS": "{}",
                  "TRAINING_TOOLKIT_HYPERPARAMETERS_FILE": "/hp.json", "TRAINING_TOOLKIT_DNS_TIMEOUT": "5",
                  "TRAINING_TOOLKIT_TERMINATION_LOG": "/tl", "TRAINING_TOOLKIT_JOBSET_SHAPE": "w:1:2"}
    assert parse(kubernetes)[13:19] == ("jobset", "{}", "/hp.json", 5.0, "/tl", "w:1:2")
    assert parse({"TRAINING_TOOLKIT_COMPLETIONS": "4"}).completions == 4
    resilience = parse({"TRAINING_TOOLKIT_STALL_TIMEOUT": "10", "TRAINING_TOOLKIT_STALL_STARTUP": "30",
                        "TRAINING_TOOLKIT_PY_SPY": "none", "TRAINING_TOOLKIT_MAX_RESTARTS": "2"})
    assert (resilience.stall_timeout_s, resilience.stall_startup_s, resilience.py_spy, resilience.max_restarts) == \
        (10.0, 30.0, "none", 2)
    assert parse({"TRAINING_TOOLKIT_STALL_TIMEOUT": "0"}).stall_timeout_s is None  # 0: never
    spares = parse({"TRAINING_TOOLKIT_MAX_HOSTS": "3", "TRAINING_TOOLKIT_MIN_HOSTS": "2"})
    assert (spares.max_hosts, spares.min_hosts) == (3, 2)
    assert (parse({}).max_hosts, parse({}).min_hosts) == (None, None)  # every host, and the minimum the max
    assert (parse({}).netshim, parse({"TRAINING_TOOLKIT_NETSHIM": "OFF"}).netshim,
            parse({"TRAINING_TOOLKIT_NETSHIM": "on"}).netshim) == (True, False, True)


def test_an_empty_variable_is_unset():
    assert parse({var.name: "" for var in VARIABLES}) == DEFAULTS


def test_flags_win_over_variables_even_bad_ones():
    env = {"SAGEMAKER_BASE_DIR": "/env", "TRAINING_TOOLKIT_GRACE_PERIOD": "later"}
    assert parse(env, base_dir="/flag", grace_s=5.0)[:2] == ("/flag", 5.0)
    assert parse(env, base_dir=None, grace_s=0.0)[:2] == ("/env", 0.0)
    with pytest.raises(TypeError, match="no such setting: grace_period"):
        parse({}, grace_period=1.0)


@pytest.mark.parametrize("name, raw, expected", [
    ("TRAINING_TOOLKIT_GRACE_PERIOD", "soon", "expected a number of seconds, 0 or more"),
    ("TRAINING_TOOLKIT_GRACE_PERIOD", "-1", "expected a number of seconds, 0 or more"),
    ("TRAINING_TOOLKIT_GRACE_PERIOD", "nan", "expected a number of seconds, 0 or more"),
    ("TRAINING_TOOLKIT_GRACE_PERIOD", "inf", "expected a number of seconds, 0 or more"),
    ("TRAINING_TOOLKIT_CONTROL_PORT", "x", "expected a port number (1-65535)"),
    ("TRAINING_TOOLKIT_CONTROL_PORT", "0", "expected a port number (1-65535)"),
    ("TRAINING_TOOLKIT_CONTROL_PORT", "70000", "expected a port number (1-65535)"),
    ("TRAINING_TOOLKIT_CONTROL_PORT", "8950.0", "expected a port number (1-65535)"),
    ("TRAINING_TOOLKIT_CONTROL_PORT", "\u0663", "expected a port number (1-65535)"),  # a digit, not an ASCII one
    ("TRAINING_TOOLKIT_JOIN_TIMEOUT", "-1", "expected a positive number of seconds"),
    ("TRAINING_TOOLKIT_JOIN_TIMEOUT", "0", "expected a positive number of seconds"),
    ("TRAINING_TOOLKIT_HEARTBEAT", "fast", "expected a positive number of seconds"),
    ("TRAINING_TOOLKIT_PEER_TIMEOUT", "1e999", "expected a positive number of seconds"),
    ("TRAINING_TOOLKIT_SSH_PORT", "ssh", "expected a port number (1-65535)"),
    ("TRAINING_TOOLKIT_SSH_PORT", "65536", "expected a port number (1-65535)"),
    ("TRAINING_TOOLKIT_MPI_FLAVOR", "openmpi3", "expected openmpi4 or openmpi5"),
    ("TRAINING_TOOLKIT_MPI_FLAVOR", "OpenMPI5", "expected openmpi4 or openmpi5"),
    ("TRAINING_TOOLKIT_MPI_FLAVOR", "mpich", "expected openmpi4 or openmpi5"),
    ("TRAINING_TOOLKIT_NUM_GPUS", "two", "expected a whole number, 0 or more"),
    ("TRAINING_TOOLKIT_NUM_GPUS", "-1", "expected a whole number, 0 or more"),
    ("TRAINING_TOOLKIT_NUM_GPUS", "1.5", "expected a whole number, 0 or more"),
    ("TRAINING_TOOLKIT_PLATFORM", "k8s!", "expected a platform's name (auto, sagemaker, tfjob, pytorchjob, mpijob, "
                                          "jobset, job, pod)"),
    ("TRAINING_TOOLKIT_JOB_SECRET", "short", "the job secret must be at least 16 bytes"),
    ("TRAINING_TOOLKIT_COMPLETIONS", "0", "expected a whole number of pods, 1 or more"),
    ("TRAINING_TOOLKIT_DNS_TIMEOUT", "0", "expected a positive number of seconds"),
    ("TRAINING_TOOLKIT_STALL_TIMEOUT", "-5", "expected a number of seconds (0: never)"),
    ("TRAINING_TOOLKIT_STALL_TIMEOUT", "ten", "expected a number of seconds (0: never)"),
    ("TRAINING_TOOLKIT_STALL_STARTUP", "0", "expected a positive number of seconds"),
    ("TRAINING_TOOLKIT_MAX_RESTARTS", "-1", "expected a whole number, 0 or more"),
    ("TRAINING_TOOLKIT_MAX_RESTARTS", "two", "expected a whole number, 0 or more"),
    ("TRAINING_TOOLKIT_NETSHIM", "no", "expected on or off"),
    ("TRAINING_TOOLKIT_MAX_HOSTS", "0", "expected a whole number of hosts, 1 or more"),
    ("TRAINING_TOOLKIT_MIN_HOSTS", "two", "expected a whole number of hosts, 1 or more"),
])
def test_a_bad_value_is_one_line_naming_the_variable_and_what_was_expected(name, raw, expected):
    with pytest.raises(ConfigError) as caught:
        parse({name: raw})
    assert str(caught.value) == f"environment variable {name}: {expected}, got {raw!r}"
    assert caught.value.exit_code == EXIT_CONFIG == 78


def test_a_control_character_stays_on_one_line():
    with pytest.raises(ConfigError) as caught:
        parse({"TRAINING_TOOLKIT_SSH_PORT": "22\n"})
    assert str(caught.value) == "environment variable TRAINING_TOOLKIT_SSH_PORT: expected a port number (1-65535), got '22\\n'"


def test_value_of_reads_one_setting_by_the_same_rule():
    assert settings.value_of("base_dir", {}) == "/opt/ml"
    assert settings.value_of("base_dir", {"SAGEMAKER_BASE_DIR": "/env", "TRAINING_TOOLKIT_NUM_GPUS": "x"}) == "/env"
    assert settings.value_of("base_dir", {"SAGEMAKER_BASE_DIR": "/env"}, "/flag") == "/flag"
    assert settings.value_of("base_dir", {"SAGEMAKER_BASE_DIR": "/env"}, "") == "/env"


def test_platform_overrides_stand_in_only_for_what_the_job_did_not_set():
    overrides = settings.Overrides(grace_s=25.0, ssh_keys=settings.KeyFiles("/root/.ssh", "id_rsa", "id_rsa.pub",
                                                                             None, None), job_secret=b"d" * 64)
    assert settings.override(parse({}), overrides)[1:3] == (25.0, b"d" * 64)
    given = parse({"TRAINING_TOOLKIT_GRACE_PERIOD": "50", "TRAINING_TOOLKIT_JOB_SECRET": "e" * 32})
    assert settings.override(given, overrides)[1:3] == (50.0, b"e" * 32)
    assert settings.override(parse({}, grace_s=0.0), overrides).grace_s == 0.0  # a flag is given too
    assert settings.override(parse({}), settings.NO_OVERRIDES) == parse({})


def test_the_secret_file_is_read_once_by_parse(tmp_path):
    files = {"/jobs/1/input/config/job_secret": b"f" * 40 + b"\n"}
    assert parse({"SAGEMAKER_BASE_DIR": "/jobs/1"}, read=files.get).job_secret == b"f" * 40
    assert parse({"SAGEMAKER_BASE_DIR": "/jobs/1", "TRAINING_TOOLKIT_JOB_SECRET": "e" * 32},
                 read=files.get).job_secret == b"e" * 32
    assert parse({"SAGEMAKER_BASE_DIR": "/jobs/1"}).job_secret is None  # no reader, no file
    with pytest.raises(ConfigError, match="/jobs/1/input/config/job_secret: the job secret must be at least 16 bytes"):
        parse({"SAGEMAKER_BASE_DIR": "/jobs/1"}, read={"/jobs/1/input/config/job_secret": b"short"}.get)


def test_the_secret_is_never_shown():
    shown = repr(parse({"TRAINING_TOOLKIT_JOB_SECRET": "hunter2-hunter2-hunter2"}))
    assert "hunter2" not in shown and "job_secret='<redacted>'" in shown
    assert repr(DEFAULTS).startswith("Settings(base_dir='/opt/ml', grace_s=120.0, job_secret=None,")


def test_an_unknown_name_close_to_a_setting_is_taken_for_a_typo_of_it():
    assert settings.meant("TRAINING_TOOLKIT_MAX_RESTART") == "TRAINING_TOOLKIT_MAX_RESTARTS"
    assert settings.meant("TRAINING_TOOLKIT_MPI_FLAVOUR") == "TRAINING_TOOLKIT_MPI_FLAVOR"
    assert settings.meant("TRAINING_TOOLKIT_GRACE_PERIOD_S") == "TRAINING_TOOLKIT_GRACE_PERIOD"
    assert settings.meant("TRAINING_TOOLKIT_FOO") is None  # nothing close: no guess


def test_unknown_variables_are_listed_internal_ones_are_not():
    env = {"TRAINING_TOOLKIT_MPI_FLAVOUR": "openmpi5", "TRAINING_TOOLKIT_SUPERVISOR": "t",
           "TRAINING_TOOLKIT_RANK_TAG": "r", "TRAINING_TOOLKIT_SSH_PORT": "22", "SM_HOSTS": "[]"}
    assert settings.unknown_variables(env) == ["TRAINING_TOOLKIT_MPI_FLAVOUR"]


def test_one_field_per_variable_in_order():
    assert Settings._fields == (*(var.field for var in VARIABLES), "given")
    assert len({var.name for var in VARIABLES}) == len(VARIABLES)
    assert all(var.name.startswith("TRAINING_TOOLKIT_") or var.name == "SAGEMAKER_BASE_DIR" for var in VARIABLES)
    for var in VARIABLES:  # the shown default is the default
        if var.default is not None and var.name != "SAGEMAKER_BASE_DIR":
            assert var.parse(var.shown_default) == var.default, var.name


def test_internal_variables_are_the_ones_the_toolkit_sets():
    from training_toolkit.supervise.process import TOKEN_VAR
    from training_toolkit.runners.mpi_launch import RANK_TAG_VAR

    from training_toolkit.config.settings import RESTART_COUNT_VAR
    from training_toolkit.stalls.stacks import script_env

    from training_toolkit.runners.netshim import Shim

    from training_toolkit.supervise.reported import parent_environment

    given_to_ranks = set(script_env(Path("/w"), {})) - {"PYTHONPATH"}
    assert given_to_ranks == {settings.HEARTBEAT_DIR_VAR, settings.STACKS_DIR_VAR}
    given_to_rank_parents = set(parent_environment(Path("/w")))  # where to report a rank, its host's flags
    assert given_to_rank_parents == {settings.RANKS_DIR_VAR, settings.RANK_STOP_FLAG_VAR, settings.RANK_RESTART_FLAG_VAR}
    given_to_the_shim = set(Shim("/s.so", ("192.0.2.1",)).environment(range(1, 3)))
    assert given_to_the_shim == {settings.NETSHIM_ALLOW_VAR, settings.NETSHIM_PORTS_VAR}
    # a rank's stop (native/rank_exec.c, native/rank_stop.c), given to the ranks and their parents
    given_to_the_stop = {settings.RANK_STOP_WAIT_VAR, settings.RANK_PID_VAR, settings.RANK_PARENT_VAR}
    from training_toolkit.runners.rank_env import ATTEMPT_VAR, RANK_FILE_VAR

    from training_toolkit.runners.mpi_ssh import SSH_CONFIG_VAR  # Open MPI's rsh agent's (native/ssh_agent.c)

    assert set(settings.INTERNAL_VARIABLES) == {TOKEN_VAR, RANK_TAG_VAR, RESTART_COUNT_VAR, *given_to_ranks,
                                                *given_to_rank_parents, *given_to_the_shim, *given_to_the_stop, RANK_FILE_VAR,
                                                SSH_CONFIG_VAR, ATTEMPT_VAR}


def test_readme_settings_table_is_the_table_in_code():
    readme = (REPO / "README.md").read_text().splitlines()
    start = readme.index("| variable | default | meaning |")
    end = next(i for i in range(start, len(readme)) if not readme[i].startswith("|"))
    assert "\n".join(readme[start:end]) == settings_help.markdown_table()
    assert [line.split("`")[1] for line in readme[start + 2:end]] == [var.name for var in VARIABLES]


def test_help_texts_come_from_the_table():
    assert settings_help.help_text("grace_s") == ("seconds between forwarding SIGTERM to the script and killing it "
                                             "(default: $TRAINING_TOOLKIT_GRACE_PERIOD, else 120)")
    text = settings_help.environment_help()
    assert all(f"  {var.name} (default: " in text for var in VARIABLES)


def test_every_variable_named_anywhere_is_a_setting_or_internal():
    known = {var.name for var in VARIABLES} | set(settings.INTERNAL_VARIABLES)
    files = [*SRC.rglob("*.py"), REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "scripts").glob("*.sh")]
    named = {(name, f.name) for f in files for name in re.findall(r"TRAINING_TOOLKIT_[A-Z0-9_]*[A-Z0-9]", f.read_text())}
    assert {(name, where) for name, where in named if name not in known} == set()


def test_nothing_but_settings_reads_the_variables():
    reads = re.compile(r"""(?:\.get\(|\[)\s*["'](?:TRAINING_TOOLKIT_|SAGEMAKER_BASE_DIR)""")
    readers = sorted(str(f.relative_to(SRC)) for f in SRC.rglob("*.py") if reads.search(f.read_text()))
    # the faulthandler hook runs in the user's interpreter, importing nothing of ours: it reads its one variable
    assert readers == ["stalls/stackhook/sitecustomize.py"]
    hook = (SRC / "stalls" / "stackhook" / "sitecustomize.py").read_text()
    assert set(re.findall(r"TRAINING_TOOLKIT_\w+", hook)) == {settings.STACKS_DIR_VAR}


def test_defaults_used_outside_settings_are_its_own():
    """Code that falls back on a default without Settings reads the table's, never a copy of it."""
    from training_toolkit.supervise import process
    from training_toolkit.cluster import timing
    from training_toolkit.job.mpi_options import CustomMpiOptions
    from training_toolkit.runners import rank_env

    assert (timing.HEARTBEAT_S, timing.TIMEOUT_S) == (DEFAULTS.heartbeat_s, DEFAULTS.peer_timeout_s)
    assert not hasattr(process, "DEFAULT_GRACE_S")  # a stop's grace is always the caller's (Settings.grace_s)
    assert process.TOKEN_VAR in settings.INTERNAL_VARIABLES
    secret_env = {name: "x" for name in settings.SECRET_VARIABLES}
    assert rank_env.mpirun_environment(secret_env) == {}
    assert rank_env.rank_environment(secret_env, interface="eth0", custom=CustomMpiOptions(), extra={}, preload=()).keys() \
        .isdisjoint(settings.SECRET_VARIABLES)
