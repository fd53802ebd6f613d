#!/usr/bin/env bash
# What goes into a training image, written once for Dockerfile.cpu and Dockerfile.gpu.
# Runs inside the image build (as root, on a Debian or Ubuntu base), in two steps so that the slow
# one (TensorFlow, Horovod) stays cached while the toolkit's own code changes:
#
#   scripts/image-install.sh stack          system packages, /opt/venv, TensorFlow, mpi4py, Horovod;
#                                           then removes the build-only packages it added
#   scripts/image-install.sh toolkit DIR    pip install DIR[s3,stacks] (not editable) into /opt/venv, /opt/ml
#
# Settings (the Dockerfiles pass them as build args):
#   TENSORFLOW_REQUIREMENT   what pip installs for TensorFlow (default tensorflow-cpu==2.21.0)
#   HOROVOD_GPU_OPERATIONS   empty for CPU images; NCCL for GPU images (read by the Horovod build,
#                            with HOROVOD_BUILD_CUDA_CC_LIST if set)
#   HOROVOD_CUDA_HOME        GPU only: a CUDA toolkit with bin/nvcc (a CUDA devel base image has
#                            /usr/local/cuda, used when this is empty). Where there is none, the
#                            toolkit is assembled from PyPI wheels (CUDA_BUILD_WHEELS) for the
#                            Horovod build only and removed after it (see gpu_build_env below)
#   CUDA_BUILD_WHEELS        the wheels that make that toolkit (default: CUDA 13.0's nvcc, nvvm,
#                            crt, runtime and cccl; no CUDA 12 wheel on PyPI has nvcc itself)
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

# Where a GPU build finds CUDA (nvcc, headers, cudart) and NCCL, exported for build-horovod.sh.
# - A CUDA toolkit in the base image (HOROVOD_CUDA_HOME, or /usr/local/cuda of an nvidia/cuda devel
#   image): used as it is, with the base's NCCL (libnccl-dev), as Horovod does by default.
# - Otherwise (a plain Debian or Ubuntu base) from PyPI:
#   * NCCL is nvidia-nccl-cu12, which tensorflow[and-cuda] installs in the venv anyway (libnccl.so.2
#     and nccl.h); Horovod links it as a shared library, found at run time through an RPATH to that
#     directory (the same libnccl TensorFlow loads);
#   * the compiler: no nvidia-cuda-nvcc-cu12 wheel has nvcc itself (only ptxas, nvvm and the crt
#     headers; TensorFlow wants it for ptxas), so Horovod's few CUDA kernels are compiled with
#     CUDA 13.0's wheels (nvidia-cuda-nvcc, -nvvm, -crt, -runtime, -cccl: one tree, nvidia/cu13),
#     installed with pip --target outside the venv, and CUDA 13.0's cudart linked statically
#     (Horovod's default). Consequences: GPUs of compute capability 7.5 or newer (CUDA 13 has no
#     sm_70) and an NVIDIA driver for CUDA 13.0 (R580 or newer). TensorFlow keeps its CUDA 12.
#   CUDA_HOME is the wheels' tree, with a lib64 link as CMake's FindCUDAToolkit and nvcc.profile
#   expect, and an unversioned libnccl.so link for find_library; all removed after the build.
CUDA_BUILD_DIR=/tmp/cuda-build
CUDA_BUILD_WHEELS=${CUDA_BUILD_WHEELS:-nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85}
gpu_build_env() {
    if [[ -z ${HOROVOD_CUDA_HOME:-} && -x /usr/local/cuda/bin/nvcc ]]; then
        HOROVOD_CUDA_HOME=/usr/local/cuda
    fi
    if [[ -n ${HOROVOD_CUDA_HOME:-} ]]; then
        [[ -x $HOROVOD_CUDA_HOME/bin/nvcc ]] || die "HOROVOD_CUDA_HOME=$HOROVOD_CUDA_HOME has no bin/nvcc"
        log "CUDA from the base image: $HOROVOD_CUDA_HOME ($("$HOROVOD_CUDA_HOME/bin/nvcc" --version | tail -1))"
        export HOROVOD_CUDA_HOME
        # The base's nvcc stays (it is the base's); the image check must allow it.
        ALLOW_NVCC=1
        return
    fi
    local site nccl wheels home f
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    nccl=$site/nvidia/nccl
    if [[ ! -e $nccl/lib/libnccl.so.2 ]]; then
        log "pip: nvidia-nccl-cu12 (not brought by $TENSORFLOW_REQUIREMENT)"
        pip install -q nvidia-nccl-cu12
    fi
    [[ -e $nccl/lib/libnccl.so.2 && -e $nccl/include/nccl.h ]] || die "no libnccl.so.2 / nccl.h in $nccl"
    wheels=$CUDA_BUILD_DIR/wheels
    log "pip --target $wheels: $CUDA_BUILD_WHEELS"
    # shellcheck disable=SC2086
    pip install -q --target "$wheels" $CUDA_BUILD_WHEELS
    # The CUDA 13 wheels share one tree (bin, include, lib, nvvm); nvcc.profile and CMake want
    # lib64 beside bin. nvcc finds the rest from its own directory (bin/..), so the home is that
    # tree itself: a CUDA_HOME made of links elsewhere would have nvcc resolve bin/.. to the wheel
    # tree anyway.
    home=$wheels/nvidia/cu13
    [[ -x $home/bin/nvcc ]] || die "no nvcc in $home/bin"
    [[ -e $home/lib/libcudart_static.a ]] || die "no libcudart_static.a in $home/lib"
    ln -s lib "$home/lib64"
    # FindCUDAToolkit wants the unversioned libcudart.so as well (Horovod links cudart_static).
    ln -s "$(basename "$home"/lib/libcudart.so.[0-9]*)" "$home/lib/libcudart.so"
    # find_library(nccl) wants the unversioned name; the wheel has only libnccl.so.2. The link goes
    # beside it (removed after the build), not in a directory of its own: CMake puts the library's
    # directory in Horovod's RUNPATH, which must name no directory that is gone (or under /tmp).
    ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
    NCCL_DEV_LINK=$nccl/lib/libnccl.so
    export HOROVOD_CUDA_HOME=$home HOROVOD_NCCL_INCLUDE=$nccl/include \
        HOROVOD_NCCL_LIB=$nccl/lib HOROVOD_NCCL_LINK=SHARED \
        LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,-rpath,$nccl/lib"
    log "CUDA from wheels: $("$home/bin/nvcc" --version | tail -1); NCCL $nccl (shared, RPATH)"
}

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
    if [[ -n ${HOROVOD_GPU_OPERATIONS:-} ]]; then
        gpu_build_env
    fi
    # build-horovod.sh takes HOROVOD_GPU_OPERATIONS (and the other HOROVOD_* build settings)
    # from the environment: empty for CPU, NCCL for GPU.
    log "horovod (HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-none})"
    TMPDIR=/tmp bash "$here/build-horovod.sh" "$VENV/bin/python"

    if [[ -z ${KEEP_BUILD_TOOLS:-} && ${#added_build[@]} -gt 0 ]]; then
        log "removing build-only packages: ${added_build[*]}"
        apt-get purge -y -qq --auto-remove "${added_build[@]}" >/dev/null
    fi

    # The CUDA toolkit assembled from wheels (GPU, no devel base) was for the build only.
    rm -rf "$CUDA_BUILD_DIR" ${NCCL_DEV_LINK:+"$NCCL_DEV_LINK"}

    # What must still work without the build tools.
    TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" -c 'import tensorflow, horovod.tensorflow, mpi4py.MPI' \
        || die "tensorflow / horovod.tensorflow / mpi4py do not import after removing the build tools"
    if [[ -n ${HOROVOD_GPU_OPERATIONS:-} ]]; then
        "$VENV/bin/horovodrun" --check-build | sed -n '/Available Tensor Operations/,$p' | grep -q '\[X\] NCCL' \
            || die "horovod was not built with NCCL"
        ! command -v nvcc >/dev/null || [[ -n ${ALLOW_NVCC:-} ]] || die "nvcc left on PATH"
    fi
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
    pip install -q "$src[s3,stacks]"
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
