#!/bin/bash
# ovl-prolog.sh: a Slurm Prolog that starts the job user's own ovld,
# ovld@UID.service, before the job's tasks run. Pair: ovl-epilog.sh.
#
# Why: on GPU nodes under CUDA MPS, which serves one uid at a time, each
# user needs an ovld of their own uid (deploy/ovld@.service says more).
#
# Install on every GPU node, with ovld@.service (cmake --install puts both
# scripts in share/doc/ovl/examples/slurm/), and in slurm.conf:
#     Prolog=/etc/slurm/ovl-prolog.sh
#     Epilog=/etc/slurm/ovl-epilog.sh
#     PrologFlags=Alloc      (optional: start ovld when the node is
#                             allocated, not at the first step)
# If the node already has a Prolog, call this one from it.
#
# What it does, as root (slurmd runs it with SLURM_JOB_ID, SLURM_JOB_UID and
# SLURM_JOB_USER set):
#   1. under a lock per uid (flock), records the job in
#      $OVL_SLURM_STATE/UID/JOBID (default /run/ovl-slurm), so that the epilog
#      knows whether the user still has a job on this node: Slurm's
#      documentation asks prologs and epilogs not to call Slurm commands
#      (squeue, scontrol), so the count is kept here;
#   2. systemctl start ovld@UID.service, which returns once ovld's socket
#      accepts (Type=notify), so the tasks find /run/ovl/UID/ovld.sock;
#      a running ovld makes this a no-op.
# The instance is the numeric uid, never the user name (see ovld@.service).
#
# MPS still runs one uid at a time per GPU: on a node shared by two users at
# once, the second user's ovld cannot start until the first user's clients,
# their ovld included, have ended (the epilog stops it after their last
# job), and `systemctl start` gives up after its timeout. Give users whole
# nodes (ExclusiveUser=YES on the partition, or sbatch --exclusive=user).
#
# Failures: logged to syslog (facility daemon, tag ovl-prolog) and stderr.
# A prolog that exits non-zero makes Slurm drain the node and requeue the
# job, so by default this script always exits 0: if ovld cannot be started
# the job still runs, and its libovl calls fail with a message naming the
# socket they tried. An ovld that is already running never fails the
# prolog. OVL_SLURM_STRICT=1 makes a failure to start ovld fail the prolog.
#
# Settings (environment, for sites and tests):
#   OVL_SLURM_STATE          where jobs are recorded (default /run/ovl-slurm)
#   OVL_SLURM_STRICT         1: exit 1 when ovld cannot be started (default 0)
#   OVL_SLURM_START_TIMEOUT  seconds for `systemctl start` (default 120, above
#                            systemd's default TimeoutStartSec of 90 s)
#   OVL_SLURM_LOCK_TIMEOUT   seconds to wait for the lock (default 180)
set -Eeu

PATH=${PATH:+$PATH:}/usr/sbin:/usr/bin:/sbin:/bin
umask 077 # the records and locks are root's alone
tag=ovl-prolog
state=${OVL_SLURM_STATE:-/run/ovl-slurm}
strict=${OVL_SLURM_STRICT:-0}
start_timeout=${OVL_SLURM_START_TIMEOUT:-120}
lock_timeout=${OVL_SLURM_LOCK_TIMEOUT:-180}

# log PRIORITY MESSAGE: to syslog and to stderr.
log() {
    logger -t "$tag" -p "daemon.$1" -- "$2" 2>/dev/null || true
    printf '%s: %s\n' "$tag" "$2" >&2
}

# fail MESSAGE: logged as an error; exit 0, or 1 with OVL_SLURM_STRICT=1.
fail() {
    log err "$1"
    if [ "$strict" = 1 ]; then
        exit 1
    fi
    exit 0
}

# Any command that fails unexpectedly ends here, not in a drained node.
trap 'fail "unexpected failure (rc $?) at line $LINENO; ovld not started"' ERR

job=${SLURM_JOB_ID:-}
uid=${SLURM_JOB_UID:-}
user=${SLURM_JOB_USER:-}
case $job in
'' | *[!0-9]*) fail "SLURM_JOB_ID '$job' is not a job id" ;;
esac
if [ -z "$uid" ] && [ -n "$user" ]; then
    uid=$(id -u -- "$user" 2>/dev/null) || fail "job $job: no uid for user '$user'"
fi
case $uid in
'' | *[!0-9]* | 0?*) fail "job $job: SLURM_JOB_UID '$uid' is not a uid" ;;
esac
unit=ovld@$uid.service

mkdir -p -- "$state"
{ exec 9>>"$state/$uid.lock"; } 2>/dev/null || fail "job $job: cannot open $state/$uid.lock"
flock -w "$lock_timeout" 9 || fail "job $job: $state/$uid.lock still held after $lock_timeout s"

mkdir -p -- "$state/$uid"
: >"$state/$uid/$job"

if timeout "$start_timeout" systemctl start "$unit"; then
    log info "job $job of ${user:-uid $uid}: $unit is running"
    exit 0
else
    rc=$?
fi
if timeout 30 systemctl is-active --quiet "$unit"; then
    log warning "job $job: systemctl start $unit failed (rc $rc) but it is active; going on"
    exit 0
fi
fail "job $job of ${user:-uid $uid}: cannot start $unit (rc $rc); see journalctl -u $unit"
