#!/usr/bin/env bash
# Builds the CPU image from local files only (no registry) and runs real jobs in it.
# What docs/images.md reports was measured with `scripts/verify-image.sh all` on Debian 12 (root).
#
#   scripts/verify-image.sh all            setup + base + build + single + mpi + horovod
#   scripts/verify-image.sh setup          podman, runc, netavark, aardvark-dns, iptables, debootstrap; containers.conf
#   scripts/verify-image.sh base           debootstrap a minbase bookworm, import it as $BASE_IMAGE
#   scripts/verify-image.sh build          podman build -f Dockerfile.cpu -t $IMAGE (base: $BASE_IMAGE)
#   scripts/verify-image.sh single [IMAGE] one host, examples/single: exit 0, output/success, model.json;
#                                          then a job whose program is missing: exit 66, output/failure
#   scripts/verify-image.sh mpi [IMAGE]    two containers (algo-1, algo-2) on a network, examples/mpi
#                                          with 2 processes per host over the toolkit's sshd
#   scripts/verify-image.sh horovod [IMAGE] the same 2 containers, a horovod.tensorflow allreduce and
#                                          a DistributedGradientTape step
#   scripts/verify-image.sh clean          remove what `single`/`mpi` may have left (containers, network, trees)
#   scripts/verify-image.sh gpu-build      podman build -f Dockerfile.gpu -t $GPU_IMAGE (base: $BASE_IMAGE)
#   scripts/verify-image.sh gpu [IMAGE]    the GPU image without a GPU: TensorFlow built with CUDA, Horovod
#                                          with NCCL (and its libnccl found), no compiler or private key
#                                          anywhere in it, then `single` (one host, on the CPU)
#   scripts/verify-image.sh gpu-all        gpu-build + gpu
#
# ENGINE=docker runs `single`, `mpi` and `horovod` with docker instead (buildspec.yml does).
# ALLOW_BUILD_TOOLS=1: `single` and `gpu` accept g++/cmake/nvcc in the image (a CUDA devel base
# has its own). HOROVOD_BUILD_CUDA_CC_LIST, if set, is passed to the GPU build (default: the
# Dockerfile's list).
# Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=${ENGINE:-podman}
IMAGE=${IMAGE:-localhost/training-toolkit:cpu}
GPU_IMAGE=${GPU_IMAGE:-localhost/training-toolkit:gpu}
BASE_IMAGE=${BASE_IMAGE:-localhost/bookworm-minbase}
NETWORK=${NETWORK:-tt-verify}
WORK=${WORK:-/tmp/tt-verify}
STD_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { echo "verify-image: $*"; }
die() { echo "verify-image: FAIL: $*" >&2; exit 1; }

setup() {
    local missing=() p
    # iptables: netavark needs it for bridge networks (only a Suggests of podman; without it every
    # run with a network fails with "netavark: No such file or directory").
    for p in podman runc netavark aardvark-dns iptables debootstrap; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    # This sandbox cannot raise limits, crun fails on its cgroup layout, and there is no journald.
    local conf=/etc/containers/containers.conf
    if [[ ! -e $conf ]]; then
        log "writing $conf"
        cat > "$conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    fi
    podman --version
}

# The Debian mirror apt uses on this machine (deb822 sources first, then sources.list).
debian_mirror() {
    local m
    m=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n' | grep -m1 '/debian/\?$' || true)
    [[ -n $m ]] || m=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
    echo "${m:-http://deb.debian.org/debian}"
}

base() {
    local dir mirror start=$SECONDS
    mirror=$(debian_mirror)
    dir=$(mktemp -d /var/tmp/tt-rootfs.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$dir'" EXIT
    log "debootstrap --variant=minbase bookworm $dir $mirror"
    debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$WORK.debootstrap.log" 2>&1 \
        || { tail -20 "$WORK.debootstrap.log"; die "debootstrap failed"; }
    # Like debian:bookworm-slim: the same suites as this machine's apt, no caches or lists.
    local sources
    sources=$(grep -l "^URIs:.*$mirror" /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 || true)
    if [[ -n $sources ]]; then
        rm -f "$dir/etc/apt/sources.list"
        cp "$sources" "$dir/etc/apt/sources.list.d/debian.sources"
    fi
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb
    log "rootfs: $(du -sh "$dir" | cut -f1), import as $BASE_IMAGE"
    tar --numeric-owner -C "$dir" -c . \
        | podman import --change "ENV PATH=$STD_PATH" --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$dir"
    trap - EXIT
    log "base done in $((SECONDS - start)) s"
}

# build [DOCKERFILE IMAGE [BUILD-ARG...]]
build() {
    local dockerfile=${1:-Dockerfile.cpu} image=${2:-$IMAGE} start=$SECONDS ca extra=()
    shift 2 || true
    extra=("$@")
    # Where pip on this machine must trust a TLS-intercepting proxy's CA, the build must too: the
    # bundle is mounted for the build (BUILD_CA_BUNDLE), never copied into the image. Under /dev,
    # a tmpfs during RUN steps, so that not even an empty mount point stays in a layer.
    ca=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
    if [[ -n $ca && -r $ca ]]; then
        extra+=(-v "$ca:/dev/build-ca.pem:ro" --build-arg BUILD_CA_BUNDLE=/dev/build-ca.pem)
    fi
    log "podman build ${extra[*]} --build-arg BASE_IMAGE=$BASE_IMAGE -f $dockerfile -t $image ."
    podman build "${extra[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" -f "$dockerfile" -t "$image" . 2>&1 \
        | tee "$WORK.build-${dockerfile#Dockerfile.}.log"
    log "build done in $((SECONDS - start)) s"
    podman image ls "$image"
    podman image inspect --format '{{.Size}}' "$image" | awk '{printf "verify-image: image size %.0f MB\n", $1 / 1e6}'
    # Layer by layer (the stack step is the big one).
    podman history --format '{{.Size}}\t{{.CreatedBy}}' "$image" | cut -c1-110 | head -8
}

gpu_build() {
    local args=()
    [[ -z ${HOROVOD_BUILD_CUDA_CC_LIST:-} ]] || args=(--build-arg "HOROVOD_BUILD_CUDA_CC_LIST=$HOROVOD_BUILD_CUDA_CC_LIST")
    build Dockerfile.gpu "$GPU_IMAGE" "${args[@]}"
}

# The GPU image on a machine without a GPU: what can be checked without one.
gpu() {
    local image=${1:-$GPU_IMAGE}
    log "== GPU image $image, without a GPU"
    "$ENGINE" run --rm -e TF_CPP_MIN_LOG_LEVEL=2 -e ALLOW_BUILD_TOOLS="${ALLOW_BUILD_TOOLS:-}" --entrypoint sh "$image" -c '
        set -e
        fail() { echo "$*" >&2; exit 1; }
        python -c "
import tensorflow as tf
info = tf.sysconfig.get_build_info()
assert tf.test.is_built_with_cuda(), \"TensorFlow not built with CUDA\"
print(\"tensorflow\", tf.__version__, \"is_built_with_cuda True, CUDA\", info.get(\"cuda_version\"), \"cuDNN\", info.get(\"cudnn_version\"), \"GPUs here:\", tf.config.list_physical_devices(\"GPU\"))
"
        horovodrun --check-build | tee /tmp/check-build
        sed -n "/Available Tensor Operations/,\$p" /tmp/check-build | grep -q "\[X\] NCCL" || fail "horovod not built with NCCL"
        python -c "import horovod.tensorflow as hvd; assert hvd.nccl_built(), \"nccl_built() is false\"; print(\"horovod.tensorflow imports, nccl_built() True\")"
        # libtensorflow_*.so.2 are found at run time (TensorFlow loads them before Horovod).
        lib=$(find /opt/venv -path "*horovod/tensorflow/mpi_lib*.so" | head -1)
        ldd "$lib" | grep -E "nccl|cudart|not found" || true
        ldd "$lib" | grep -v libtensorflow | grep -q "not found" && fail "$lib: a library is not found"
        ldd "$lib" | grep -q "libnccl.so.2 => /opt/venv/" || fail "$lib: libnccl.so.2 not from the venv"
        if [ -z "$ALLOW_BUILD_TOOLS" ]; then
            found=$(find / -xdev \( -type f -o -type l \) \( -name nvcc -o -name cicc -o -name cc1plus -o -name "*g++*" -o -name cmake -o -name "cudafe++" \) 2>/dev/null || true)
            [ -z "$found" ] || fail "build tools left: $found"
            echo "no nvcc, cicc, cudafe++, cc1plus, g++ or cmake anywhere"
        fi
        du -sh /opt/venv /opt/venv/lib/python3*/site-packages/nvidia 2>/dev/null' \
        || die "GPU image checks"
    log "GPU image: OK (TensorFlow built with CUDA, Horovod with NCCL, libnccl resolved, no build tools)"
    single "$image"
}

# job_tree DIR HOST HOSTS_JSON HYPERPARAMETERS_JSON: one host's /opt/ml, as a platform lays it out.
job_tree() {
    local dir=$1 host=$2 hosts=$3 hps=$4
    rm -rf "$dir"
    mkdir -p "$dir/input/config" "$dir/input/data" "$dir/model" "$dir/output/data" "$dir/code"
    echo "$hps" > "$dir/input/config/hyperparameters.json"
    echo "{\"current_host\": \"$host\", \"hosts\": $hosts, \"network_interface_name\": \"eth0\"}" \
        > "$dir/input/config/resourceconfig.json"
    echo '{}' > "$dir/input/config/inputdataconfig.json"
}

# The code dir is mounted read-only at /opt/code and named by sagemaker_submit_directory, so the
# toolkit fetches it into /opt/ml/code as it would a platform's upload.
single() {
    local image=${1:-$IMAGE} tree=$WORK/single/opt/ml rc start
    log "== one host in $image"
    job_tree "$tree" algo-1 '["algo-1"]' \
        '{"epochs": "200", "learning-rate": "0.05", "sagemaker_program": "\"train.py\"",
          "sagemaker_submit_directory": "\"/opt/code\"", "sagemaker_job_name": "\"image-single\""}'
    cp -r examples/single/data/train "$tree/input/data/train"
    echo '{"train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}}' \
        > "$tree/input/config/inputdataconfig.json"
    start=$SECONDS
    rc=0
    "$ENGINE" run --rm --name tt-verify-single --hostname algo-1 \
        -v "$tree:/opt/ml" -v "$PWD/examples/single/code:/opt/code:ro" "$image" train || rc=$?
    log "exit $rc in $((SECONDS - start)) s; output: $(ls "$tree/output" | tr '\n' ' ')"
    [[ $rc == 0 ]] || die "one host: exit $rc (expected 0): $(cat "$tree/output/failure" 2>/dev/null)"
    [[ -f $tree/output/success ]] || die "one host: no output/success"
    [[ ! -e $tree/output/failure ]] || die "one host: output/failure exists"
    grep -q '"host": "algo-1"' "$tree/model/model.json" || die "one host: model/model.json missing or wrong"
    log "one host: OK, model $(cat "$tree/model/model.json")"

    log "== one host, missing program (expect exit 66 and output/failure)"
    job_tree "$tree" algo-1 '["algo-1"]' \
        '{"sagemaker_program": "\"no_such.py\"", "sagemaker_submit_directory": "\"/opt/code\"", "sagemaker_job_name": "\"image-fail\""}'
    rc=0
    "$ENGINE" run --rm --name tt-verify-single --hostname algo-1 \
        -v "$tree:/opt/ml" -v "$PWD/examples/single/code:/opt/code:ro" "$image" train || rc=$?
    [[ $rc == 66 ]] || die "missing program: exit $rc (expected 66)"
    [[ -s $tree/output/failure ]] || die "missing program: no output/failure"
    log "missing program: OK, exit 66, failure: $(head -c 200 "$tree/output/failure")"

    log "== image hygiene"
    "$ENGINE" run --rm -e TF_CPP_MIN_LOG_LEVEL=2 -e ALLOW_BUILD_TOOLS="${ALLOW_BUILD_TOOLS:-}" --entrypoint sh "$image" -c '
        set -e
        fail() { echo "$*" >&2; exit 1; }
        ls /etc/ssh/ssh_host_* 2>/dev/null && fail "host keys baked in"
        ls /root/.ssh/id_* 2>/dev/null && fail "client keys baked in"
        ls /run/build-ca.pem /dev/build-ca.pem 2>/dev/null && fail "build CA mount point left"
        test -d /opt/ml || fail "no /opt/ml"
        pip show -f training-toolkit | grep -q "Editable project location" && fail "editable install"
        if [ -z "$ALLOW_BUILD_TOOLS" ]; then
            command -v g++ && fail "g++ left"
            command -v cmake && fail "cmake left"
            command -v nvcc && fail "nvcc left"
        fi
        # No private key anywhere in the image (text files; /proc, /sys, /dev are not the image).
        keys=$(grep -rlIsE --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e "^-----BEGIN ([A-Z0-9]+ )*PRIVATE KEY-----\s*$" / || true)
        [ -z "$keys" ] || fail "private keys in the image: $keys"
        echo "PATH=$PATH PYTHONUNBUFFERED=$PYTHONUNBUFFERED"
        horovodrun --check-build | sed -n "/Available Frameworks/,/Available Tensor/p"
        python -c "import tensorflow as tf, horovod, mpi4py; print(\"tensorflow\", tf.__version__, \"horovod\", horovod.__version__, \"mpi4py\", mpi4py.__version__)"
        mpirun --version | head -1; ssh -V' \
        || die "image hygiene"
    log "image hygiene: OK (no host keys, no client keys, no private key anywhere, /opt/ml, non-editable install, no g++/cmake/nvcc)"
}

# mpi_job LABEL CODE_DIR PROGRAM: algo-1 and algo-2 on a network, 2 processes per host, the code
# mounted read-only at /opt/code; each host's log goes to $WORK/LABEL/HOST.log. Fails unless both
# hosts exit 0 with output/success.
mpi_job() {
    local label=$1 code=$2 program=$3 image=$IMAGE secret hps h rc1 rc2 start
    clean_containers
    "$ENGINE" network create "$NETWORK" >/dev/null
    secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
    hps=$(printf '{"sagemaker_program": "\\"%s\\"", "sagemaker_submit_directory": "\\"/opt/code\\"",
        "sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "2",
        "sagemaker_job_name": "\\"image-%s\\""}' "$program" "$label")
    start=$SECONDS
    for h in algo-1 algo-2; do
        job_tree "$WORK/$label/$h/opt/ml" "$h" '["algo-1", "algo-2"]' "$hps"
        # Named after its host: the network's DNS resolves container names, not --hostname.
        "$ENGINE" run -d --name "$h" --hostname "$h" --network "$NETWORK" \
            -e TRAINING_TOOLKIT_JOB_SECRET="$secret" -e TF_CPP_MIN_LOG_LEVEL=2 \
            -v "$WORK/$label/$h/opt/ml:/opt/ml" -v "$code:/opt/code:ro" "$image" train >/dev/null
    done
    rc1=$("$ENGINE" wait algo-1)
    rc2=$("$ENGINE" wait algo-2)
    log "exit codes: algo-1 $rc1, algo-2 $rc2 in $((SECONDS - start)) s"
    for h in algo-1 algo-2; do
        "$ENGINE" logs "$h" > "$WORK/$label/$h.log" 2>&1 || true
        grep -v -E '^(\[[0-9,]+\]<std...>:)?(I0000|WARNING: All log messages|To enable the following)' "$WORK/$label/$h.log" \
            | sed "s/^/[$h] /" || true
    done
    clean_containers
    [[ $rc1 == 0 && $rc2 == 0 ]] || die "$label: exit codes $rc1, $rc2 (expected 0, 0)"
    for h in algo-1 algo-2; do
        [[ -f $WORK/$label/$h/opt/ml/output/success ]] || die "$label: $h has no output/success"
    done
}

# expect_ranks LABEL TEXT TEXT_ON_ALGO2: the 4 ranks' lines, printed by algo-1 (mpirun's host), 2 of
# them from algo-2. Counted as occurrences, not lines: with PYTHONUNBUFFERED=1 a print() is two
# writes (text, newline), and Open MPI's --tag-output sometimes puts the next rank's tagged text
# before the newline, so two ranks' lines can share one line of the log.
expect_ranks() {
    local log=$WORK/$1/algo-1.log n
    n=$(grep -oF -- "$2" "$log" | wc -l)
    [[ $n == 4 ]] || die "$1: expected 4 ranks printing '$2', got $n"
    n=$(grep -oF -- "$3" "$log" | wc -l)
    [[ $n == 2 ]] || die "$1: expected 2 ranks printing '$3', got $n"
}

mpi() {
    IMAGE=${1:-$IMAGE}
    log "== MPI: algo-1, algo-2 on network $NETWORK, examples/mpi (mpi4py), 2 processes per host"
    mpi_job mpi "$PWD/examples/mpi" allreduce.py
    # Ranks on algo-2 see their own host's /opt/ml (SM_CURRENT_HOST).
    expect_ranks mpi 'sum of ranks = 6' 'on algo-2 (SM_CURRENT_HOST=algo-2): sum of ranks = 6'
    log "MPI: OK (4 ranks over 2 containers, both hosts exit 0 with output/success)"
}

# Horovod (TensorFlow, MPI controller) across the same 2 containers: an allreduce and one step of
# DistributedGradientTape, which must leave the same weights on every rank.
horovod() {
    IMAGE=${1:-$IMAGE}
    log "== Horovod: algo-1, algo-2, horovod.tensorflow allreduce + DistributedGradientTape, 2 processes per host"
    mkdir -p "$WORK/horovod-code"
    cat > "$WORK/horovod-code/hvd_check.py" <<'PY'
import socket

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
total = float(hvd.allreduce(tf.constant([float(hvd.rank())]), op=hvd.Sum).numpy()[0])
assert total == hvd.size() * (hvd.size() - 1) / 2, total
w = tf.Variable([1.0])
hvd.broadcast_variables([w], root_rank=0)
with tf.GradientTape() as tape:
    loss = (w * float(hvd.rank() + 1)) ** 2
tape = hvd.DistributedGradientTape(tape)
w.assign_sub(0.01 * tape.gradient(loss, [w])[0])
weights = hvd.allgather(w).numpy()
assert (weights == weights[0]).all(), weights
print(f"horovod rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()}: sum {total:.0f}, w {w.numpy()[0]:.4f} on every rank")
PY
    mpi_job horovod "$WORK/horovod-code" hvd_check.py
    expect_ranks horovod 'sum 6, w 0.8500 on every rank' 'on algo-2: sum 6, w 0.8500 on every rank'
    log "Horovod: OK (4 ranks over 2 containers agree on the allreduce and the averaged gradient step)"
}

clean_containers() {
    local c
    for c in algo-1 algo-2 tt-verify-single; do "$ENGINE" rm -f "$c" >/dev/null 2>&1 || true; done
    "$ENGINE" network rm "$NETWORK" >/dev/null 2>&1 || true
}

clean() { clean_containers; rm -rf "$WORK" "$WORK".*.log; }

[[ $(id -u) == 0 ]] || die "needs root"
mkdir -p "$WORK"
case ${1:-all} in
    setup) setup ;;
    base) base ;;
    build) build ;;
    gpu-build) gpu_build ;;
    gpu) gpu "${2:-}" ;;
    gpu-all) gpu_build; gpu ;;
    single) single "${2:-}" ;;
    mpi) mpi "${2:-}" ;;
    horovod) horovod "${2:-}" ;;
    clean) clean ;;
    all) setup; base; build; single; mpi; horovod ;;
    *) die "usage: $0 [all|setup|base|build|single [IMAGE]|mpi [IMAGE]|horovod [IMAGE]|gpu-build|gpu [IMAGE]|gpu-all|clean]" ;;
esac
