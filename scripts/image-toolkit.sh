#!/usr/bin/env bash
# The toolkit's layer of the images: a C compiler for the install only, `image-install.sh toolkit DIR`,
# the compiler removed, then a check that the native parts were built.
#
#   scripts/image-toolkit.sh DIR
#
# The toolkit builds its small native parts when it is installed (setup.py: the gethostname library
# preloaded into MPI ranks, the accept() shim, the rank's stop library, training-toolkit-rank,
# training-toolkit-deadman, training-toolkit-ssh and training-toolkit-term-blocked). The stack layer removed its build
# tools; this layer adds gcc for the install and removes what it added, so no compiler is left.
# A script of its own, so that the slow stack layer (which copies image-install.sh) stays cached.
set -euo pipefail
src=${1:?usage: $0 DIR}
here=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-/opt/venv}

log() { echo "image-toolkit: $*"; }
die() { echo "image-toolkit: error: $*" >&2; exit 1; }

added=()
for p in gcc libc6-dev; do dpkg -s "$p" >/dev/null 2>&1 || added+=("$p"); done
if [[ ${#added[@]} -gt 0 ]]; then
    log "apt: ${added[*]} (for the install only)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${added[@]}" >/dev/null
fi
bash "$here/image-install.sh" toolkit "$src"
if [[ ${#added[@]} -gt 0 && -z ${KEEP_BUILD_TOOLS:-} ]]; then
    log "removing ${added[*]}"
    apt-get purge -y -qq --auto-remove "${added[@]}" >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/*
fi
"$VENV/bin/python" -c '
from training_toolkit import native
for name in (native.HOSTNAME_LIBRARY, native.NETSHIM_LIBRARY, native.RANK_STOP_LIBRARY, native.RANK_PROGRAM,
             native.DEADMAN_PROGRAM, native.SSH_AGENT_PROGRAM, native.TERM_BLOCKED_PROGRAM):
    print("image-toolkit:", native.path_of(name))
' || die "the toolkit's native parts were not built"
