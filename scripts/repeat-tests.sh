#!/usr/bin/env bash
# repeat-tests.sh N LOGDIR PYTEST-ARGS...: the same tests N times in a row (not in CI), each run's output kept.
# Prints one line per run (its number, pass/fail, seconds) and the count at the end; a failed run's whole
# output stays in LOGDIR/run-<i>.log for its message and stack; lines a test prints starting "stop: " (with -s)
# are shown under each passing run.  Example (docs/slurm.md):
#   scripts/repeat-tests.sh 20 /tmp/torch20 test/integration/platforms/test_slurm.py -k torch_distributed
set -uo pipefail
n=$1; logdir=$2; shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$logdir"
passed=0
for i in $(seq 1 "$n"); do
  t0=$(date +%s.%N)
  "$here/.venv/bin/python" -m pytest -p no:cacheprovider --timeout 300 -q "$@" >"$logdir/run-$i.log" 2>&1
  rc=$?
  took=$(echo "$(date +%s.%N) - $t0" | bc)
  if [[ $rc == 0 ]]; then passed=$((passed + 1)); echo "run $i: pass ${took}s"; grep -ho "stop: .*" "$logdir/run-$i.log" | sed 's/^/  /'; rm -f "$logdir/run-$i.log"
  else echo "run $i: FAIL rc=$rc ${took}s (log: $logdir/run-$i.log)"; fi
done
echo "$passed/$n passed"
