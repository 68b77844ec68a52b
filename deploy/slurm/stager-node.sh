# shellcheck shell=bash
# shellcheck disable=SC2034  # the settings are used by the scripts that source this file
# Where one job's node daemon keeps its things on one node, and how to find it: sourced by
# prolog.sh, epilog.sh and task-prolog.sh, so that the three agree. Every setting below can be
# overridden from the environment the scripts run in (slurmd's, or /etc/stager/slurm.env).
#
#   STAGER            the stager command (default: stager on PATH, else /usr/local/bin/stager)
#   STAGER_RUN_ROOT   per-job run directories: pid file, log, peer secret, socket/ (default /run/stager-jobs)
#   STAGER_CACHE_ROOT node-local disk for the caches, one per user (default /local/stager); the
#                     cache outlives the job, so the next job of the same user on this node starts warm
#   STAGER_PEER_PORT  the peer API's port, the same on every node of the job
#                     (default 7000 + job id mod 1000, so two jobs sharing a node do not collide)
#   STAGER_PEER_LISTEN the address the peer API listens on (default 0.0.0.0:STAGER_PEER_PORT;
#                     the node finds its own entry of SLURM_JOB_NODELIST by its host name)
#   STAGER_PEERS      the peer list (default: slurm, i.e. the hosts of SLURM_JOB_NODELIST)
#   STAGER_SITE_SECRET_FILE the site's peer secret, root-only (default /etc/stager/peer-secret);
#                     each job's daemons get a secret derived from it and the job id
#   STAGER_START_TIMEOUT seconds the prolog waits for the daemon to answer (default 60)
#   STAGER_STOP_TIMEOUT seconds the epilog waits after SIGTERM before SIGKILL (default 40: the
#                     daemon's drain timeout, 10 s, and its own watchdog's 20 s, with a margin)
#   STAGER_PURGE_CACHE 1: the epilog removes the job's cache too (nodes shared by many users)

if [[ -r /etc/stager/slurm.env ]]; then
    # shellcheck disable=SC1091  # the site's own settings, if any
    source /etc/stager/slurm.env
fi

: "${SLURM_JOB_ID:?SLURM_JOB_ID is not set: these scripts run as the Prolog, Epilog and TaskProlog of Slurm}"
if [[ ! $SLURM_JOB_ID =~ ^[0-9]+$ ]]; then
    echo "stager: SLURM_JOB_ID=$SLURM_JOB_ID is not a job id" >&2
    exit 1
fi

STAGER=${STAGER:-$(command -v stager || echo /usr/local/bin/stager)}
STAGER_RUN_ROOT=${STAGER_RUN_ROOT:-/run/stager-jobs}
STAGER_CACHE_ROOT=${STAGER_CACHE_ROOT:-/local/stager}
STAGER_PEER_PORT=${STAGER_PEER_PORT:-$((7000 + SLURM_JOB_ID % 1000))}
STAGER_PEER_LISTEN=${STAGER_PEER_LISTEN:-0.0.0.0:$STAGER_PEER_PORT}
STAGER_PEERS=${STAGER_PEERS:-slurm}
STAGER_SITE_SECRET_FILE=${STAGER_SITE_SECRET_FILE:-/etc/stager/peer-secret}
STAGER_START_TIMEOUT=${STAGER_START_TIMEOUT:-60}
STAGER_STOP_TIMEOUT=${STAGER_STOP_TIMEOUT:-40}

JOB_USER=${SLURM_JOB_USER:-$(id -un)}
# The run directory is root's when root runs the prolog: the job's user may read the files root
# writes there (pid file, log, its peer secret) but cannot swap them for links. Only socket/ is
# the user's: the daemon, running as the user, makes its socket there.
JOB_RUN_DIR=$STAGER_RUN_ROOT/$SLURM_JOB_ID
JOB_SOCKET_DIR=$JOB_RUN_DIR/socket
JOB_SOCKET=$JOB_SOCKET_DIR/stager.sock
JOB_PID_FILE=$JOB_RUN_DIR/stager.pid
JOB_SECRET_FILE=$JOB_RUN_DIR/peer-secret
JOB_LOG=$JOB_RUN_DIR/stager.log
JOB_CACHE=${STAGER_JOB_CACHE:-$STAGER_CACHE_ROOT/$JOB_USER}

# One line to stderr (slurmd's log) and to syslog, tagged stager-prolog or stager-epilog.
say() {
    echo "stager-${STAGER_SCRIPT:-node} (job $SLURM_JOB_ID): $*" >&2
    logger -t "stager-${STAGER_SCRIPT:-node}" -- "job $SLURM_JOB_ID: $*" 2>/dev/null || true
}

# The address to ask the peer API's /healthz at: the listen address, or loopback for a wildcard.
stager_peer_health_url() {
    local host=${STAGER_PEER_LISTEN%:*} port=${STAGER_PEER_LISTEN##*:} scheme=http
    case $host in "" | 0.0.0.0 | "[::]") host=127.0.0.1 ;; esac
    [[ -n ${STAGER_PEER_TLS_CERT:-} ]] && scheme=https
    echo "$scheme://$host:$port/healthz"
}

# Whether PID is this job's daemon (and not a process that got its number since).
stager_is_daemon() {
    local pid=$1 cmdline
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmdline == *" serve "* && $cmdline == *"$JOB_SOCKET"* ]]
}
