#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh), brings up the container tier's engine and image
# (scripts/containers-ci.sh: podman's Docker-compatible service, the CPU image built from this checkout),
# runs every test, and stops the engine again. Extra arguments go to pytest.
#
# The tiers (test/helpers/tiers.py, docs/development.md) run side by side on TT_TEST_WORKERS pytest-xdist
# workers (default 4): the tiers that share something of the machine each on one worker, one test after
# another, the others spread over all. TT_TEST_WORKERS=0 runs every test in this process, one after another.
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
workers=${TT_TEST_WORKERS:-4}
parallel=()
[[ $workers != 0 ]] && parallel=(-n "$workers" --dist loadgroup)
.venv/bin/python -m pytest -p no:cacheprovider -q "${parallel[@]}" --durations=25 "$@" || rc=$?
exit $rc
