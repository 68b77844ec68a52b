#!/bin/bash
# Slurm Prolog: start this job's stager node daemon on this node, with the job's other nodes as peers.
#
# slurm.conf (every node; PrologFlags=Alloc runs it when the job is allocated, before any step,
# so the daemon is ready when the first step starts):
#
#   Prolog=/etc/slurm/stager/prolog.sh
#   Epilog=/etc/slurm/stager/epilog.sh
#   TaskProlog=/etc/slurm/stager/task-prolog.sh    # gives the job STAGER_SOCKET and STAGER_CACHE
#   PrologFlags=Alloc
#
# (copy prolog.sh, epilog.sh, task-prolog.sh and stager-node.sh into one directory). The daemon runs
# as the job's user (so that its socket, mode 0600, is the user's alone), with its cache on the
# node's local disk (STAGER_CACHE_ROOT/USER, kept after the job for the user's next job) and
# `--peers slurm`: the daemons of the job's nodes find each other in SLURM_JOB_NODELIST and each
# shard crosses the origin link once per job, not once per node. The peer secret is derived from
# the site's secret and the job id, so daemons of other jobs (other users) cannot ask this job's
# daemons for anything. Settings: see stager-node.sh.
#
# A daemon that does not come up is logged and the job still runs: its consumers find no daemon
# and run an engine of their own (slower, never wrong). STAGER_PROLOG_STRICT=1 fails the prolog
# instead (Slurm then requeues the job and drains the node).
#
# By hand (the test in tests/deploy does this on loopback):
#   SLURM_JOB_ID=42 SLURM_JOB_NODELIST=node[1-2] deploy/slurm/prolog.sh

set -euo pipefail
STAGER_SCRIPT=prolog
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/stager-node.sh"

give_up() {
    say "$*"
    if [[ -f $JOB_LOG ]]; then
        tail -n 20 "$JOB_LOG" >&2 || true
    fi
    if [[ ${STAGER_PROLOG_STRICT:-0} == 1 ]]; then
        exit 1
    fi
    say "the job runs without a node daemon (its consumers use engines of their own)"
    exit 0
}

# Become a command, as the job's user when we are root (Slurm runs the prolog as root), else as we
# are. Called in a background subshell, which it replaces: $! is then the daemon's own pid.
exec_as_job_user() {
    if [[ $(id -u) == 0 && -n ${SLURM_JOB_UID:-} && ${SLURM_JOB_UID} != 0 ]]; then
        HOME=$(getent passwd "$SLURM_JOB_UID" | cut -d: -f6) || HOME=$JOB_CACHE
        export HOME USER=$JOB_USER LOGNAME=$JOB_USER
        exec setpriv --reuid="$SLURM_JOB_UID" --regid="${SLURM_JOB_GID:-$SLURM_JOB_UID}" --init-groups -- "$@"
    fi
    exec "$@"
}

owner=$(id -u)
group=$(id -g)
if [[ $owner == 0 && -n ${SLURM_JOB_UID:-} ]]; then
    owner=$SLURM_JOB_UID
    group=${SLURM_JOB_GID:-$SLURM_JOB_UID}
fi

if [[ -f $JOB_PID_FILE ]] && stager_is_daemon "$(cat "$JOB_PID_FILE")"; then
    say "a daemon already runs for this job (pid $(cat "$JOB_PID_FILE"))"
    exit 0
fi

install -d -m 0755 "$STAGER_RUN_ROOT" "$JOB_RUN_DIR"
install -d -m 0700 -o "$owner" -g "$group" "$JOB_SOCKET_DIR"
install -d -m 0755 "$STAGER_CACHE_ROOT"
install -d -m 0700 -o "$owner" -g "$group" "$JOB_CACHE"

# The job's peer secret: the same on every node of the job, different for every job.
if [[ ! -r $STAGER_SITE_SECRET_FILE ]]; then
    give_up "no site peer secret at $STAGER_SITE_SECRET_FILE (make one with: openssl rand -hex 32 > $STAGER_SITE_SECRET_FILE; chmod 0600 it; the same file on every node)"
fi
(
    umask 077
    { cat "$STAGER_SITE_SECRET_FILE"; printf '\nstager job %s\n' "$SLURM_JOB_ID"; } | sha256sum | cut -d' ' -f1 >"$JOB_SECRET_FILE"
)
chown "$owner:$group" "$JOB_SECRET_FILE"

# Its own session (setsid), so that it outlives the prolog; stdin closed, output to the job's log.
# The daemon reads its other settings from the environment itself: STAGER_CAPACITY,
# STAGER_METRICS_ADDRESS, STAGER_PEER_BANDWIDTH, STAGER_PEER_TLS_CERT/_KEY/_CA, STAGER_CONFIG...
# (set them in /etc/stager/slurm.env; `stager serve --help` names every variable).
install -m 0600 -o "$owner" -g "$group" /dev/null "$JOB_LOG"
exec_as_job_user setsid "$STAGER" serve \
    --cache "$JOB_CACHE" \
    --socket "$JOB_SOCKET" \
    --peer-listen "$STAGER_PEER_LISTEN" \
    --peers "$STAGER_PEERS" \
    --peer-secret-file "$JOB_SECRET_FILE" \
    </dev/null >>"$JOB_LOG" 2>&1 &
pid=$!
echo "$pid" >"$JOB_PID_FILE"

# Ready when the control socket and the peer API both answer /healthz; bounded in time.
peer_url=$(stager_peer_health_url)
deadline=$((SECONDS + STAGER_START_TIMEOUT))
while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid" || status=$?
        rm -f "$JOB_PID_FILE"
        give_up "the daemon exited (status ${status:-0}) before it answered; its log, $JOB_LOG, ends:"
    fi
    if [[ -S $JOB_SOCKET ]] \
        && curl -fsS --max-time 2 --unix-socket "$JOB_SOCKET" -o /dev/null http://stager/healthz 2>/dev/null \
        && curl -fsSk --max-time 2 -o /dev/null "$peer_url" 2>/dev/null; then
        break
    fi
    if ((SECONDS >= deadline)); then
        kill -TERM "$pid" 2>/dev/null || true
        rm -f "$JOB_PID_FILE"
        give_up "the daemon (pid $pid) did not answer within ${STAGER_START_TIMEOUT}s; stopped it; its log, $JOB_LOG, ends:"
    fi
    sleep 0.2
done
say "daemon pid $pid serves $JOB_CACHE at $JOB_SOCKET; peers: $STAGER_PEERS on port ${STAGER_PEER_LISTEN##*:}"
