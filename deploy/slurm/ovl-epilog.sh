#!/bin/bash
# ovl-epilog.sh: a Slurm Epilog that stops the job user's ovld,
# ovld@UID.service, once the user has no other job on this node. Pair:
# ovl-prolog.sh, which says how to install both.
#
# Under the same lock per uid as the prolog, it removes the job's record
# $OVL_SLURM_STATE/UID/JOBID (default /run/ovl-slurm). If records of other
# jobs of that uid remain, ovld stays. Otherwise
#     systemctl stop ovld@UID.socket ovld@UID.service
# (the socket too, in case the site uses socket activation; stopping a unit
# that is not running does nothing). ovld finishes the ops in flight for up
# to 30 s; systemd kills it after TimeoutStopSec=60s.
#
# An epilog that exits non-zero makes Slurm drain the node, so this one
# always exits 0; failures are logged to syslog (facility daemon, tag
# ovl-epilog) and stderr. A job whose epilog never ran (slurmd killed) leaves
# its record, and the user's ovld then runs until the next reboot empties
# /run or the record is removed by hand: `rm /run/ovl-slurm/UID/JOBID`, then
# `systemctl stop ovld@UID.service`.
#
# Settings (environment, for sites and tests):
#   OVL_SLURM_STATE         where jobs are recorded (default /run/ovl-slurm)
#   OVL_SLURM_STOP_TIMEOUT  seconds for `systemctl stop` (default 90, above
#                           ovld@.service's TimeoutStopSec=60s)
#   OVL_SLURM_LOCK_TIMEOUT  seconds to wait for the lock (default 180)
set -Eeu

PATH=${PATH:+$PATH:}/usr/sbin:/usr/bin:/sbin:/bin
umask 077 # the records and locks are root's alone
tag=ovl-epilog
state=${OVL_SLURM_STATE:-/run/ovl-slurm}
stop_timeout=${OVL_SLURM_STOP_TIMEOUT:-90}
lock_timeout=${OVL_SLURM_LOCK_TIMEOUT:-180}

# log PRIORITY MESSAGE: to syslog and to stderr.
log() {
    logger -t "$tag" -p "daemon.$1" -- "$2" 2>/dev/null || true
    printf '%s: %s\n' "$tag" "$2" >&2
}

# fail MESSAGE: logged as an error; exit 0 all the same.
fail() {
    log err "$1"
    exit 0
}

trap 'fail "unexpected failure (rc $?) at line $LINENO; ovld left as it was"' ERR

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

mkdir -p -- "$state"
{ exec 9>>"$state/$uid.lock"; } 2>/dev/null || fail "job $job: cannot open $state/$uid.lock"
flock -w "$lock_timeout" 9 || fail "job $job: $state/$uid.lock still held after $lock_timeout s"

rm -f -- "$state/$uid/$job"
shopt -s nullglob
others=("$state/$uid"/*)
others=("${others[@]##*/}")
if [ ${#others[@]} -gt 0 ]; then
    log info "job $job ended; ovld@$uid.service stays for job(s) ${others[*]} of ${user:-uid $uid}"
    exit 0
fi
rmdir -- "$state/$uid" 2>/dev/null || true

if timeout "$stop_timeout" systemctl stop "ovld@$uid.socket" "ovld@$uid.service"; then
    log info "job $job was the last of ${user:-uid $uid} here: ovld@$uid.service stopped"
else
    fail "job $job: cannot stop ovld@$uid.service (rc $?); see journalctl -u ovld@$uid.service"
fi
