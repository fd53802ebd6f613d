#!/usr/bin/env bash
# Runs the README's commands as a newcomer would, on a fresh Debian 12 machine: a new privileged
# podman container (`podman run --rm --privileged`) from a cached image that holds a minbase
# bookworm plus only `python3 python3-venv python3-pip git ca-certificates iproute2 procps`
# (installed without recommends, so no python3-dev, no compiler), and a clean copy of the checkout
# in /root/training-toolkit. Nothing of this machine's python, venvs or pip configuration gets in;
# only its CA bundle, mounted read-only, with PIP_CERT and SSL_CERT_FILE pointing at it (pip
# behind a TLS-intercepting proxy). Each run starts from the image: the set-up runs in full.
#
#   scripts/fresh-machine.sh example                  bash scripts/example.sh
#   scripts/fresh-machine.sh test [-- PYTEST_ARGS]    bash scripts/test.sh PYTEST_ARGS (full set-up, then pytest)
#   scripts/fresh-machine.sh run -- COMMAND...        any command in the checkout, e.g. bash -c '...'
#   scripts/fresh-machine.sh image                    build the image if it is missing
#   scripts/fresh-machine.sh clean                    remove the image (the base image stays)
#
# Settings (environment):
#   REV          the commit to copy (default HEAD: `git archive HEAD`, committed work only)
#   WORKTREE=1   copy the working tree's tracked files instead, uncommitted changes included;
#                untracked files are never copied
#   IMAGE        the image (default localhost/training-toolkit-fresh:bookworm); built when missing
#   REBUILD=1    build the image even when it exists (after a point release, say)
#   BASE_IMAGE   the debootstrap minbase it starts from (default localhost/bookworm-minbase, made by
#                `scripts/verify-image.sh base` when missing)
#   TIMEOUT      seconds the command may run (default 3600); the container is removed after
#   SKIP_CONTAINERS  passed into the container (default 1): scripts/test.sh there skips the container
#                tier (podman inside the privileged container is not verified); SKIP_CONTAINERS= to try it
#   CA_BUNDLE    the CA bundle to mount (default $PIP_CERT, else $SSL_CERT_FILE, else
#                /etc/ssl/certs/ca-certificates.crt)
#
# Needs root. Installs podman first (`scripts/verify-image.sh setup`). Leaves no container behind.
# See docs/development.md.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/training-toolkit-fresh:bookworm}
BASE_IMAGE=${BASE_IMAGE:-localhost/bookworm-minbase}
TIMEOUT=${TIMEOUT:-3600}
FRESH_PACKAGES=(python3 python3-venv python3-pip git ca-certificates iproute2 procps)
NAME=tt-fresh-$$

log() { echo "fresh-machine: $*"; }
die() { echo "fresh-machine: error: $*" >&2; exit 1; }
usage() { { echo usage:; sed -n 's/^#   scripts/  scripts/p' "$0"; } >&2; exit 2; }

cleanup() { podman rm -f -t 5 "$NAME" "$NAME-build" >/dev/null 2>&1 || true; }

engine() {
    local work
    work=$(mktemp -d /var/tmp/tt-fresh.XXXXXX)
    # verify-image.sh keeps its logs under WORK
    WORK=$work/verify BASE_IMAGE=$BASE_IMAGE scripts/verify-image.sh "$1" | sed 's/^/  /'
    rm -rf "$work"
}

image() {
    if [[ -z ${REBUILD:-} ]] && podman image exists "$IMAGE"; then
        return 0
    fi
    local start=$SECONDS
    if ! podman image exists "$BASE_IMAGE"; then
        log "no $BASE_IMAGE: debootstrap (scripts/verify-image.sh base)"
        engine base
    fi
    log "building $IMAGE: $BASE_IMAGE + ${FRESH_PACKAGES[*]} (no recommends)"
    podman rm -f "$NAME-build" >/dev/null 2>&1 || true
    timeout 900 podman run --name "$NAME-build" "$BASE_IMAGE" bash -c '
        set -e
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "$@" >/dev/null
        apt-get clean
        rm -rf /var/lib/apt/lists/*' bash "${FRESH_PACKAGES[@]}"
    podman commit -q --change 'CMD ["bash"]' --change 'WORKDIR /root' "$NAME-build" "$IMAGE" >/dev/null
    podman rm "$NAME-build" >/dev/null
    log "image $IMAGE built in $((SECONDS - start)) s ($(podman image inspect --format '{{.Size}}' "$IMAGE" \
        | awk '{printf "%.0f MB", $1 / 1e6}'))"
}

# The commit to copy: REV (default HEAD), or (WORKTREE=1) a commit of the working tree that no
# branch records (`git stash create`; HEAD when nothing changed).
tree() {
    local rev=${REV:-HEAD}
    if [[ -n ${WORKTREE:-} ]]; then
        rev=$(git stash create)
        rev=${rev:-HEAD}
    fi
    git rev-parse --verify --quiet "$rev^{commit}" || die "not a commit: $rev"
}

# run_in_container COMMAND...: a new container, the checkout in /root/training-toolkit, COMMAND
# run there by bash; exits with COMMAND's exit code.
run_in_container() {
    local rev ca rc=0 start
    rev=$(tree)
    ca=${CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
    [[ -r $ca ]] || die "CA bundle $ca is not readable (set CA_BUNDLE)"
    log "checkout: $(git rev-parse --short "$rev")$([[ -z ${WORKTREE:-} ]] || echo ' (working tree)')," \
        "image $IMAGE, timeout ${TIMEOUT} s"
    log "running in a new container: $*"
    start=$SECONDS
    # The archive comes in on stdin; after tar the command gets /dev/null, as under CI.
    git archive --format=tar --prefix=training-toolkit/ "$rev" \
        | timeout --foreground "$TIMEOUT" podman run --rm -i --privileged --name "$NAME" \
            --shm-size=1g -e SKIP_CONTAINERS="${SKIP_CONTAINERS-1}" \
            -v "$ca:/etc/ssl/host-ca.pem:ro" -e PIP_CERT=/etc/ssl/host-ca.pem -e SSL_CERT_FILE=/etc/ssl/host-ca.pem \
            "$IMAGE" bash -c '
                set -e
                tar -x -C /root
                cd /root/training-toolkit
                exec "$@" </dev/null' bash "$@" \
        || rc=$?
    log "exit $rc after $((SECONDS - start)) s: $*"
    return "$rc"
}

[[ $(id -u) == 0 ]] || die "needs root"
cmd=${1:-}
[[ -n $cmd ]] || usage
shift
if [[ ${1:-} == -- ]]; then shift; fi
trap cleanup EXIT
trap 'exit 130' INT TERM

case $cmd in
    example)
        [[ $# -eq 0 ]] || usage
        engine setup; image; run_in_container bash scripts/example.sh ;;
    test)
        engine setup; image; run_in_container bash scripts/test.sh "$@" ;;
    run)
        [[ $# -gt 0 ]] || usage
        engine setup; image; run_in_container "$@" ;;
    image)
        engine setup; image; podman image ls "$IMAGE" ;;
    clean)
        podman image rm "$IMAGE" 2>/dev/null || true ;;
    *) usage ;;
esac
