#!/usr/bin/env bash
# The container tier's engine and image, for CI (scripts/test.sh) and by hand (root, Debian 12).
#
#   scripts/containers-ci.sh up     podman (scripts/verify-image.sh setup), its Docker-compatible service on
#                                   $SOCKET in the background, the debootstrap base (once per machine) and the
#                                   CPU image built from this checkout (the slow layer is cached: once per run)
#   scripts/containers-ci.sh down   stops the service and removes what any job left (containers, networks
#                                   labelled io.training-toolkit.job); the images stay
#   scripts/containers-ci.sh env    prints the variables the tests read (DOCKER_HOST, TT_IMAGE)
#
# The engine CI uses is podman 4.3 (Debian 12), through `podman system service`; the tests reach it with
# the docker SDK via DOCKER_HOST, as `training-toolkit local --image` does.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_DIR=${RUN_DIR:-/run/training-toolkit-ci}
SOCKET=${SOCKET:-unix://$RUN_DIR/podman.sock}
export IMAGE=${IMAGE:-localhost/training-toolkit:cpu}
export BASE_IMAGE=${BASE_IMAGE:-localhost/bookworm-minbase}
export WORK=${WORK:-/tmp/tt-containers-ci}
PIDFILE=$RUN_DIR/podman-service.pid
LABEL=io.training-toolkit.job

log() { echo "containers-ci: $*"; }

up() {
    local start=$SECONDS path=${SOCKET#unix://}
    scripts/verify-image.sh setup
    mkdir -p "$RUN_DIR"
    if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        log "podman service already running (pid $(cat "$PIDFILE"))"
    else
        rm -f "$path"
        # Its own session, so a Ctrl-C to the tests does not reach it; `down` stops it by its pid.
        setsid podman system service --time=0 "$SOCKET" >"$RUN_DIR/podman-service.log" 2>&1 < /dev/null &
        echo $! > "$PIDFILE"
        for _ in $(seq 100); do [[ -S $path ]] && break; sleep 0.1; done
        [[ -S $path ]] || { cat "$RUN_DIR/podman-service.log"; log "podman service did not start"; exit 1; }
        log "podman service on $SOCKET (pid $(cat "$PIDFILE"))"
    fi
    podman image exists "$BASE_IMAGE" || scripts/verify-image.sh base
    scripts/verify-image.sh build >"$WORK.build-output.log" 2>&1 \
        || { tail -40 "$WORK.build-output.log"; log "image build failed"; exit 1; }
    grep -E "build done|image size" "$WORK.build-output.log" || true
    log "up in $((SECONDS - start)) s: DOCKER_HOST=$SOCKET TT_IMAGE=$IMAGE"
}

down() {
    local ids nets pid
    ids=$(podman ps -aq --filter "label=$LABEL" 2>/dev/null || true)
    [[ -z $ids ]] || { log "removing containers left by jobs: $ids"; podman rm -f $ids >/dev/null || true; }
    nets=$(podman network ls -q --filter "label=$LABEL" 2>/dev/null || true)
    [[ -z $nets ]] || { log "removing networks left by jobs: $nets"; podman network rm $nets >/dev/null || true; }
    if [[ -f $PIDFILE ]]; then
        pid=$(cat "$PIDFILE")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
            log "podman service (pid $pid) stopped"
        fi
        rm -f "$PIDFILE" "${SOCKET#unix://}"
    fi
}

env_vars() { echo "DOCKER_HOST=$SOCKET"; echo "TT_IMAGE=$IMAGE"; }

[[ $(id -u) == 0 ]] || { log "needs root"; exit 1; }
case ${1:-} in
    up) up ;;
    down) down ;;
    env) env_vars ;;
    *) echo "usage: $0 up|down|env" >&2; exit 64 ;;
esac
