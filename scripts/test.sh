#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and runs every test. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -p no:cacheprovider -q "$@"
