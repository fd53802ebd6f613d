#!/usr/bin/env bash
# Runs buildspec.yml for real on this machine: its phases in order, each command as CodeBuild would
# (one bash shell for all of them, so variables carry over), against a local registry (Debian's
# docker-registry on 127.0.0.1) instead of ECR. Only the ECR login is replaced; the registry comes
# in through the REGISTRY variable buildspec.yml honours, and AWS_ACCOUNT_ID is set so that no
# `aws` command runs. Then it pulls the pushed images back into an empty image store and runs them.
#
#   scripts/run-buildspec.sh             (root; podman set up by scripts/verify-image.sh setup/base)
#
# Settings (environment):
#   ENGINE          podman (default) or docker
#   REGISTRY_PORT   the local registry's port on 127.0.0.1 (default 5000; must be free)
#   ECR_REPOSITORY  the repository name in it (default training-toolkit)
#   BUILD_GPU       as in buildspec.yml (its default: 1)
#   BASE_IMAGE_CPU, BASE_IMAGE_GPU   default localhost/bookworm-minbase (no registry to pull from here)
#   TIMEOUT         seconds for the phases (default 5400); the pull-back has its own 1800
#   KEEP_IMAGES=1   keep the images that the phases tagged REGISTRY/REPO:* (default: untagged at
#                   the end; their layers stay in the engine's storage, shared with the
#                   localhost/training-toolkit:* images)
#
# CodeBuild's rules, as far as they matter here: buildspec variables are defaults (the environment
# wins); a failing command ends its phase; the build phase is not run after a failed pre_build, and
# post_build not after a failed build with on-failure: ABORT (which buildspec.yml sets). A command
# that calls `exit` ends the whole run here (the remaining phases do not run).
#
# Cleans up what it started, also on failure or timeout: the registry process (by its pid), its
# storage, the insecure-registry drop-in for podman, the pulled-back image store, the containers and
# networks of verify-image.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=${ENGINE:-podman}
REGISTRY_PORT=${REGISTRY_PORT:-5000}
export ECR_REPOSITORY=${ECR_REPOSITORY:-training-toolkit}
TIMEOUT=${TIMEOUT:-5400}
BUILDSPEC=${BUILDSPEC:-buildspec.yml}

log() { echo "run-buildspec: $*"; }
die() { echo "run-buildspec: FAIL: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "needs root"
command -v "$ENGINE" >/dev/null || die "$ENGINE not found"
python3 -c 'import yaml' 2>/dev/null || die "python3 with PyYAML needed (apt-get install python3-yaml)"
if ! command -v docker-registry >/dev/null; then
    log "installing docker-registry (Debian)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
fi
if (exec 3<>"/dev/tcp/127.0.0.1/$REGISTRY_PORT") 2>/dev/null; then
    die "127.0.0.1:$REGISTRY_PORT is in use; set REGISTRY_PORT"
fi

WORKDIR=$(mktemp -d /var/tmp/tt-buildspec.XXXXXX)
REGISTRY=127.0.0.1:$REGISTRY_PORT
DROPIN=/etc/containers/registries.conf.d/90-tt-run-buildspec.conf
PULLED=$WORKDIR/pulled      # the empty image store the images are pulled back into
registry_pid=

cleanup() {
    local rc=$?
    set +e
    log "cleaning up"
    ENGINE=$ENGINE scripts/verify-image.sh clean >/dev/null 2>&1
    if [[ -d $PULLED ]]; then
        "$PULLED/engine" rm -a -f >/dev/null 2>&1
        "$PULLED/engine" rmi -a -f >/dev/null 2>&1
    fi
    if [[ -n $registry_pid ]]; then
        kill "$registry_pid" 2>/dev/null && wait "$registry_pid" 2>/dev/null
        log "registry (pid $registry_pid) stopped"
    fi
    rm -f "$DROPIN"
    if [[ -z ${KEEP_IMAGES:-} && -s $WORKDIR/state ]]; then
        # shellcheck disable=SC1091
        source "$WORKDIR/state"
        for t in "$REPO:$VERSION-cpu" "$REPO:$VERSION-$COMMIT-cpu" "$REPO:$VERSION-gpu" "$REPO:$VERSION-$COMMIT-gpu"; do
            "$ENGINE" rmi "$t" >/dev/null 2>&1
        done
    fi
    rm -rf "$WORKDIR"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The registry: no auth, storage in WORKDIR, loopback only.
mkdir -p "$WORKDIR/registry"
cat > "$WORKDIR/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $WORKDIR/registry
  delete:
    enabled: true
http:
  addr: $REGISTRY
EOF
docker-registry serve "$WORKDIR/registry.yml" > "$WORKDIR/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$REGISTRY_PORT") 2>/dev/null && break
    kill -0 "$registry_pid" 2>/dev/null || { cat "$WORKDIR/registry.log"; die "docker-registry exited"; }
    sleep 0.2
done
log "registry $REGISTRY up (pid $registry_pid, storage $WORKDIR/registry)"
# Plain HTTP on loopback: docker allows it for 127.0.0.0/8 by itself; podman needs to be told.
if [[ $ENGINE == podman ]]; then
    printf '[[registry]]\nlocation = "%s"\ninsecure = true\n' "$REGISTRY" > "$DROPIN"
fi

# Behind a TLS-intercepting proxy the builds need the CA bundle pip uses here (as verify-image.sh build).
ca=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
build_flags=
if [[ -n $ca && -r $ca ]]; then
    build_flags="-v $ca:/dev/build-ca.pem:ro --build-arg BUILD_CA_BUNDLE=/dev/build-ca.pem"
fi

# buildspec.yml -> one bash script: its variables as defaults, then each phase's commands, each
# sourced from its own file in the same shell; the ECR login command replaced.
python3 - "$BUILDSPEC" "$WORKDIR" <<'PY'
import pathlib, shlex, sys, yaml

spec = yaml.safe_load(open(sys.argv[1]))
work = pathlib.Path(sys.argv[2])
assert str(spec.get("version")) == "0.2", "buildspec version 0.2 expected"
assert spec.get("env", {}).get("shell", "bash") == "bash"
out = ["set -o pipefail", "export CODEBUILD_BUILD_SUCCEEDING=1"]
for k, v in spec.get("env", {}).get("variables", {}).items():
    out.append(f'[[ -v {k} ]] || export {k}={shlex.quote(str(v))}')
replaced = 0
n = 0
for phase in ("install", "pre_build", "build", "post_build"):
    p = (spec.get("phases") or {}).get(phase)
    if not p:
        continue
    if phase == "build":
        out.append('if [[ $failed_phase == install || $failed_phase == pre_build ]]; then echo "run-buildspec: build skipped"; exit 1; fi')
    if phase == "post_build":
        out.append('if [[ $failed_phase == build && $build_abort == 1 ]]; then echo "run-buildspec: post_build skipped (on-failure: ABORT)"; exit 1; fi')
    if phase == "build":
        out.append(f'build_abort={1 if p.get("on-failure") == "ABORT" else 0}')
    out.append(f'echo "run-buildspec: ===== phase {phase}"')
    out.append("phase_ok=1")
    for cmd in p.get("commands", []):
        n += 1
        if "aws ecr get-login-password" in cmd:
            cmd = 'echo "(ECR login replaced: $REGISTRY is a local registry without login)"'
            replaced += 1
        f = work / f"cmd{n:02d}.sh"
        f.write_text(cmd + "\n")
        first = cmd.strip().splitlines()[0][:100]
        out.append(f'if [[ $phase_ok == 1 ]]; then echo "run-buildspec: [{phase} {n}] " {shlex.quote(first)}; '
                   f'source {f}; rc=$?; if [[ $rc != 0 ]]; then echo "run-buildspec: [{phase} {n}] exit $rc"; '
                   f'phase_ok=0; failed_phase={phase}; CODEBUILD_BUILD_SUCCEEDING=0; fi; fi')
    out.append(f'echo "run-buildspec: ===== phase {phase}: $([[ $phase_ok == 1 ]] && echo ok || echo FAILED)"')
    out.append('declare -p REPO VERSION COMMIT > ' + shlex.quote(str(work / "state")) + ' 2>/dev/null')
out.append('[[ -z ${failed_phase:-} ]]')
assert replaced == 1, f"expected one ECR login command, found {replaced}"
(work / "buildspec.sh").write_text("failed_phase=\n" + "\n".join(out) + "\n")
PY

log "phases of $BUILDSPEC with ENGINE=$ENGINE REGISTRY=$REGISTRY ECR_REPOSITORY=$ECR_REPOSITORY (at most $TIMEOUT s)"
start=$SECONDS
rc=0
ENGINE=$ENGINE REGISTRY=$REGISTRY AWS_ACCOUNT_ID=000000000000 AWS_DEFAULT_REGION=local \
    BUILD_FLAGS=${BUILD_FLAGS-$build_flags} \
    BASE_IMAGE_CPU=${BASE_IMAGE_CPU-localhost/bookworm-minbase} BASE_IMAGE_GPU=${BASE_IMAGE_GPU-localhost/bookworm-minbase} \
    timeout -k 30 "$TIMEOUT" bash "$WORKDIR/buildspec.sh" || rc=$?
log "phases: exit $rc in $((SECONDS - start)) s"
[[ $rc != 124 ]] || die "buildspec.yml phases timed out after $TIMEOUT s"
[[ $rc == 0 ]] || die "buildspec.yml phases failed (exit $rc)"

# Pull back into an empty image store (so every layer really comes from the registry) and run.
# shellcheck disable=SC1091
source "$WORKDIR/state"
mkdir -p "$PULLED"
if [[ $ENGINE == podman ]]; then
    printf '#!/bin/sh\nexec podman --root %s/root --runroot %s/runroot "$@"\n' "$PULLED" "$PULLED" > "$PULLED/engine"
else
    # docker has one store: remove the tags, so the pull fetches at least the manifests again.
    printf '#!/bin/sh\nexec docker "$@"\n' > "$PULLED/engine"
    "$ENGINE" rmi "$REPO:$VERSION-$COMMIT-cpu" "$REPO:$VERSION-$COMMIT-gpu" >/dev/null 2>&1 || true
fi
chmod +x "$PULLED/engine"
kinds=(cpu)
[[ ${BUILD_GPU:-1} == 1 ]] && kinds+=(gpu)
for kind in "${kinds[@]}"; do
    image=$REPO:$VERSION-$COMMIT-$kind
    start=$SECONDS
    timeout 1800 "$PULLED/engine" pull -q "$image" >/dev/null || die "pull $image"
    log "pulled back $image in $((SECONDS - start)) s: $("$PULLED/engine" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}')"
    # The one-host job (and for the GPU image its checks) with the pulled image.
    if [[ $kind == cpu ]]; then
        ENGINE=$PULLED/engine timeout 1800 scripts/verify-image.sh single "$image" || die "$image (pulled) does not run"
    else
        ENGINE=$PULLED/engine ALLOW_BUILD_TOOLS=${ALLOW_BUILD_TOOLS_GPU:-} timeout 1800 scripts/verify-image.sh gpu "$image" \
            || die "$image (pulled) does not pass verify-image.sh gpu"
    fi
    "$PULLED/engine" rmi -f "$image" >/dev/null 2>&1 || true
done
log "OK: phases passed, pushed to $REGISTRY, pulled back and ran: ${kinds[*]}"
