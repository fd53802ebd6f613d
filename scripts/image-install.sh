#!/usr/bin/env bash
# What goes into a training image, written once for Dockerfile.cpu and Dockerfile.gpu.
# Runs inside the image build (as root, on a Debian or Ubuntu base), in two steps so that the slow
# one (TensorFlow, Horovod) stays cached while the toolkit's own code changes:
#
#   scripts/image-install.sh stack          system packages, /opt/venv, TensorFlow, mpi4py, Horovod;
#                                           then removes the build-only packages it added
#   scripts/image-install.sh toolkit DIR    pip install DIR[s3] (not editable) into /opt/venv, /opt/ml
#
# Settings (the Dockerfiles pass them as build args):
#   TENSORFLOW_REQUIREMENT   what pip installs for TensorFlow (default tensorflow-cpu==2.21.0)
#   HOROVOD_GPU_OPERATIONS   empty for CPU images; NCCL for GPU images (read by the Horovod build,
#                            with HOROVOD_CUDA_HOME, HOROVOD_BUILD_CUDA_CC_LIST if set)
#   KEEP_BUILD_TOOLS=1       keep cmake, g++ and make after the Horovod build (default: remove
#                            the ones this script installed; the base image's own are never touched)
#   VENV                     the venv (default /opt/venv)
#   BUILD_CA_BUNDLE          a CA bundle (path inside the build) that pip must trust, for builds
#                            behind a TLS-intercepting proxy; mount it (podman build -v) under /dev,
#                            never COPY it: nothing of it stays in the image
set -euo pipefail

VENV=${VENV:-/opt/venv}
TENSORFLOW_REQUIREMENT=${TENSORFLOW_REQUIREMENT:-tensorflow-cpu==2.21.0}
here=$(cd "$(dirname "$0")" && pwd)
if [[ -n ${BUILD_CA_BUNDLE:-} ]]; then
    [[ -r $BUILD_CA_BUNDLE ]] || { echo "image-install: error: BUILD_CA_BUNDLE $BUILD_CA_BUNDLE is not readable" >&2; exit 1; }
    export PIP_CERT=$BUILD_CA_BUNDLE
fi

# Runtime: what `train` needs on every host (python, Open MPI, sshd for MPI jobs, `ip` for the
# interface). libopenmpi-dev and python3-dev stay: user code that builds an MPI or C extension at
# job start (requirements.txt) needs them.
RUNTIME_PACKAGES=(python3 python3-venv python3-dev openmpi-bin libopenmpi-dev openssh-server
                  iproute2 procps ca-certificates)
# Build only: Horovod's native build.
BUILD_PACKAGES=(cmake g++ make)

log() { echo "image-install: $*"; }
die() { echo "image-install: error: $*" >&2; exit 1; }
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check --no-cache-dir "$@"; }

stack() {
    local start=$SECONDS
    export DEBIAN_FRONTEND=noninteractive
    # No man pages or docs from the packages below (license files stay), as the slim images do.
    cat > /etc/dpkg/dpkg.cfg.d/90-training-toolkit-nodoc <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
EOF
    # Build packages the base image does not have yet: only these are removed afterwards.
    local added_build=() p
    for p in "${BUILD_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || added_build+=("$p"); done

    log "apt: ${RUNTIME_PACKAGES[*]} ${added_build[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${RUNTIME_PACKAGES[@]}" "${added_build[@]}" >/dev/null
    # The package generates host keys at install time; an image must not carry any (every
    # container of every job would share them). The toolkit derives per-job keys.
    rm -f /etc/ssh/ssh_host_*

    python3 -m venv "$VENV"
    log "pip: $TENSORFLOW_REQUIREMENT mpi4py"
    pip install -q "$TENSORFLOW_REQUIREMENT" mpi4py
    # build-horovod.sh takes HOROVOD_GPU_OPERATIONS (and the other HOROVOD_* build settings)
    # from the environment: empty for CPU, NCCL for GPU.
    log "horovod (HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-none})"
    TMPDIR=/tmp bash "$here/build-horovod.sh" "$VENV/bin/python"

    if [[ -z ${KEEP_BUILD_TOOLS:-} && ${#added_build[@]} -gt 0 ]]; then
        log "removing build-only packages: ${added_build[*]}"
        apt-get purge -y -qq --auto-remove "${added_build[@]}" >/dev/null
    fi

    # What must still work without the build tools.
    TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" -c 'import tensorflow, horovod.tensorflow, mpi4py.MPI' \
        || die "tensorflow / horovod.tensorflow / mpi4py do not import after removing the build tools"
    command -v mpirun >/dev/null && [[ -x /usr/sbin/sshd ]] && command -v ip >/dev/null \
        || die "mpirun, /usr/sbin/sshd or ip missing"
    ! compgen -G '/etc/ssh/ssh_host_*' >/dev/null || die "host keys left in /etc/ssh"

    apt-get clean
    rm -rf /var/lib/apt/lists/* /root/.cache /tmp/* /tmp/.[!.]*
    log "stack done in $((SECONDS - start)) s"
}

toolkit() {
    local src=$1
    [[ -f $src/setup.cfg ]] || die "not the toolkit's source tree: $src"
    # Not editable: the image runs the installed package, not the copied tree.
    pip install -q "$src[s3]"
    rm -rf "$src/build" "$src"/src/*.egg-info /root/.cache
    mkdir -p /opt/ml
    "$VENV/bin/train" --help >/dev/null || die "train does not run"
    "$VENV/bin/python" -c 'import boto3, training_toolkit' || die "the toolkit or boto3 does not import"
    log "toolkit $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("training-toolkit"))') installed"
}

case ${1:-} in
    stack) stack ;;
    toolkit) [[ $# -eq 2 ]] || die "usage: $0 toolkit DIR"; toolkit "$2" ;;
    *) die "usage: $0 stack | toolkit DIR" ;;
esac
