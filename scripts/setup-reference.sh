#!/usr/bin/env bash
# Create a throw-away venv holding the reference implementation, the PyPI package
# `sagemaker-training` (console script `train`), for side-by-side tests
# (test/helpers/reference.py, pytest marker `reference`).
#
#   scripts/setup-reference.sh [VENV_DIR]      # default: <repo>/.venv-ref
#
# Idempotent: when VENV_DIR already holds the pinned version, its `train` imports and it was
# made from PYTHON, it does nothing (well under a second); a venv made from another python is
# made anew. Prints the time it took.
#
# Environment:
#   PYTHON               interpreter for the venv (default: Debian's /usr/bin/python3 when it
#                        exists, as on a fresh machine, else python3.11, else python3)
#   REFERENCE_VERSION    sagemaker-training version (default below: newest 5.1.x on PyPI)
#
# Notes:
# - 5.1.4 is the newest 5.1.x. PyPI has only an sdist, so pip builds it: that needs a C
#   compiler and Python headers (Debian: gcc and python3-dev, which scripts/setup.sh
#   installs), for its `gethostname` extension (an LD_PRELOAD shim `train` never loads
#   itself). It builds and imports cleanly on Python 3.11, with
#   today's dependencies (protobuf 7, numpy 2, scipy, gevent, boto3), so no dependency
#   pin is needed. A cold install takes about 15-25 s here.
# - Dependencies float. If a future release of one breaks the reference, pin it in
#   REFERENCE_PINS below and say why.
# - pip's global constraints file (/etc/xdg/pip) is honoured as is: it caps only torch.
set -euo pipefail

start=$(date +%s.%N)
elapsed() { awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${1:-"$repo/.venv-ref"}
version=${REFERENCE_VERSION:-5.1.4}
# Extra requirements installed next to the reference (e.g. "protobuf<8"); none needed today.
REFERENCE_PINS=()

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x /usr/bin/python3 ]]; then PYTHON=/usr/bin/python3
    elif command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11
    else PYTHON=python3; fi
fi
base_prefix() { "$1" -c 'import sys; print(sys.base_prefix)' 2>/dev/null; }
want=$(base_prefix "$PYTHON") || { echo "setup-reference: PYTHON=$PYTHON does not run" >&2; exit 1; }

installed_ok() {
    [[ -x "$venv/bin/train" && -x "$venv/bin/python" ]] || return 1
    [[ $(base_prefix "$venv/bin/python") == "$want" ]] || return 1
    "$venv/bin/python" - "$version" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("sagemaker-training") == sys.argv[1]
import sagemaker_training.cli.train  # noqa: F401  (fails if a dependency broke the import)
EOF
}

if installed_ok; then
    echo "sagemaker-training $version already in $venv ($(elapsed) s)"
    exit 0
fi

if [[ ! -x "$venv/bin/python" ]] || [[ $(base_prefix "$venv/bin/python") != "$want" ]]; then
    [[ ! -e "$venv" ]] || echo "setup-reference: making $venv anew from $PYTHON"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
fi

"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "sagemaker-training==$version" "${REFERENCE_PINS[@]}" 2>&1 \
    | sed "/^WARNING: Location 'file:[^']*' is ignored: it is neither a file nor a directory\.\$/d"
# (pip warns so, once per package, where its configuration names local index locations that do
# not exist; with pipefail a failed install stops here, with pip's own message)

if ! installed_ok; then
    echo "setup-reference: sagemaker-training $version is not usable in $venv" >&2
    exit 1
fi
echo "installed sagemaker-training $version in $venv ($(elapsed) s)"
