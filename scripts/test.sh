#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh), brings up the container tier's engine and image
# (scripts/containers-ci.sh: podman's Docker-compatible service, the CPU image built from this checkout),
# runs every test, and stops the engine again. Extra arguments go to pytest.
#
#   SKIP_CONTAINERS=1 scripts/test.sh    no engine, no image: the `containers` tests are skipped
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [[ -z ${SKIP_CONTAINERS:-} && $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    trap 'scripts/containers-ci.sh down' EXIT
    scripts/containers-ci.sh up
    while IFS= read -r line; do export "${line?}"; done < <(scripts/containers-ci.sh env)
fi
rc=0
.venv/bin/python -m pytest -p no:cacheprovider -q "$@" || rc=$?
exit $rc
