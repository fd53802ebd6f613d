#!/usr/bin/env bash
# A real Slurm cluster on local namespace hosts for one command, then torn down (docs/slurm.md):
# munged per host (a random key for this cluster), slurmctld on node1, a slurmd per host named as
# the host; the command runs in node1 with SLURM_CONF set.  Needs root and scripts/setup.sh's packages.
#
#   scripts/slurm-local.sh [--nodes N] [--workdir DIR] [--kill-wait S] [--accounting] -- COMMAND...
#   scripts/slurm-local.sh --nodes 2 -- srun -N2 hostname
#   scripts/slurm-local.sh --nodes 2 --workdir /tmp/job -- sbatch --wait /tmp/job/train.sbatch
#
# Exits with the command's exit code (70 if anything of the cluster was left behind).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m training_toolkit.local.slurm "$@"
