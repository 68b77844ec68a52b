#!/bin/bash
# Slurm TaskProlog: tell every task of the job where its node daemon is. Slurm reads the task
# prolog's output: each `export NAME=value` line sets a variable in the task's environment, so
# TokenDataset, TokenIterator, `stager mount` and `stager stage` in the job find the daemon the
# prolog started (its socket) and share its cache, with no change to the job's script.

set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/stager-node.sh"

if [[ -S $JOB_SOCKET ]]; then
    echo "export STAGER_SOCKET=$JOB_SOCKET"
    echo "export STAGER_CACHE=$JOB_CACHE"
fi
