#!/usr/bin/env bash
# Sets up a minimal install and runs the example jobs: one host, then (as root) MPI on 2 local hosts.
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP_MINIMAL=1 scripts/setup.sh
work=$(mktemp -d /tmp/training-toolkit-example.XXXXXX)
base=$work/opt/ml
mkdir -p "$base/input/config" "$base/input/data"
cp -r examples/single/data/train "$base/input/data/train"
cat > "$base/input/config/hyperparameters.json" <<JSON
{"epochs": "200", "learning-rate": "0.05", "sagemaker_program": "\"train.py\"",
 "sagemaker_submit_directory": "\"$PWD/examples/single/code\"", "sagemaker_job_name": "\"example-single\""}
JSON
echo '{"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}' > "$base/input/config/resourceconfig.json"
echo '{"train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}}' \
    > "$base/input/config/inputdataconfig.json"

echo "== one host: .venv/bin/train --base-dir $base"
.venv/bin/train --base-dir "$base"
echo "verdict: $(ls "$base/output")   model: $(cat "$base/model/model.json")"

if [[ $(id -u) == 0 ]]; then
    echo "== MPI on 2 local hosts x 2 processes: training-toolkit local"
    .venv/bin/training-toolkit local --hosts 2 --source examples/mpi --entry-point allreduce.py \
        --distribution mpi --processes-per-host 2 --workdir "$work/cluster"
else
    echo "(skipping the 2-host example: local clusters need root)"
fi
