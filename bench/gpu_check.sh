#!/usr/bin/env bash
# The GPU check in one call on a machine with an NVIDIA GPU (docs/gpu.md): installs the toolkit from this
# checkout into a private target dir (what the machine's python lacks, e.g. cryptography, from wheels in .whl
# if that folder exists: machines without an index), then runs bench/gpu_check.py through the installed `train`.
#
#   bash bench/gpu_check.sh OUTDIR [ARGS]  # writes OUTDIR/gpu_check.json, gpu_check.log, install.log, nvidia-smi.txt
#
# ARGS go to gpu_check.py (--cpu: a dry run without a GPU; --only CHECK...).  WHEELS: the wheels folder (.whl).
#
# The python is the one holding torch with CUDA (PYTHON, default python3).  Exit status 0: every check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_check.sh OUTDIR}
py=${PYTHON:-python3}
site=$(mktemp -d /tmp/gpu-check-site.XXXXXX)
mkdir -p "$out"
t0=$SECONDS
{
    # one pip call: with --target, a second call would replace the first one's bin/ as a whole
    wheels=()
    if compgen -G "${WHEELS:-.whl}/*.whl" >/dev/null; then wheels=("${WHEELS:-.whl}"/*.whl); fi
    # no index: the toolkit's native parts are compiled here with the machine's setuptools and wheel
    "$py" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
        --target "$site" "${wheels[@]}" .
} >"$out/install.log" 2>&1 || { echo "install failed:"; tail -20 "$out/install.log"; exit 2; }
[[ -x $site/bin/train ]] || { echo "install made no $site/bin/train:"; tail -20 "$out/install.log"; exit 2; }
echo "installed in $((SECONDS - t0)) s"
export PYTHONPATH=$site PATH=$site/bin:$PATH
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
"$py" bench/gpu_check.py --out "$out" --train "$site/bin/train" --toolkit "$site/bin/training-toolkit" "${@:2}"
rc=$?
rm -rf "$site"
exit $rc
