#!/bin/bash
# Slurm Epilog: stop this job's stager node daemon on this node (see prolog.sh for slurm.conf).
#
# SIGTERM makes the daemon stop taking requests, let the block requests in flight land in the
# cache (at most its drain timeout) and exit, leaving a consistent cache for the user's next job.
# After STAGER_STOP_TIMEOUT seconds it gets SIGKILL, which is safe too (a restart resumes partial
# blobs without fetching a verified block twice). Then the job's run directory (socket, pid file,
# peer secret, log) is removed; the cache stays (unless STAGER_PURGE_CACHE=1). Always exits 0 once
# the daemon is gone: an epilog that fails drains the node.

set -euo pipefail
STAGER_SCRIPT=epilog
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/stager-node.sh"

gone() {
    ! kill -0 "$1" 2>/dev/null
}

pid=""
if [[ -f $JOB_PID_FILE ]]; then
    pid=$(cat "$JOB_PID_FILE")
fi
if [[ -n $pid ]] && stager_is_daemon "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + STAGER_STOP_TIMEOUT))
    until gone "$pid" || ((SECONDS >= deadline)); do
        sleep 0.2
    done
    if ! gone "$pid"; then
        say "daemon pid $pid still runs ${STAGER_STOP_TIMEOUT}s after SIGTERM: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            gone "$pid" && break
            sleep 0.1
        done
    fi
    say "daemon pid $pid stopped"
elif [[ -n $pid ]]; then
    say "pid file names $pid, which is not this job's daemon (it had already exited)"
fi

if [[ -f $JOB_LOG && -n ${STAGER_KEEP_LOGS:-} ]]; then
    install -d -m 0755 "$STAGER_KEEP_LOGS"
    cp "$JOB_LOG" "$STAGER_KEEP_LOGS/stager-$SLURM_JOB_ID-$(hostname -s).log" || true
fi
rm -rf -- "$JOB_RUN_DIR"

# Nodes shared by several users: each user's cache takes room on the same disk. With
# STAGER_PURGE_CACHE=1 the job's cache goes with the job (the next job starts cold).
if [[ ${STAGER_PURGE_CACHE:-0} == 1 && -n $JOB_USER && $JOB_CACHE == "$STAGER_CACHE_ROOT/$JOB_USER" ]]; then
    rm -rf -- "$JOB_CACHE"
    say "removed the cache $JOB_CACHE"
fi
