#!/usr/bin/env bash
# fleet worker VM shutdown script: GCE runs it as root when the VM stops (Spot preemption,
# deleteInstances, the MIG's deletion by `fleet down`, the run's deadline: terminationTime).
#
# GCE's guest agent signals only the startup script's runner at a stop (its unit has
# KillMode=process): startup.sh and the workers it started get nothing until the power-off,
# which comes 30 s after a preemption (about 90 s after other stops). So this script tells them:
#
#   1. mark the boot as stopping: startup.sh then records it as stopped and leaves the VM to
#      the MIG (which recreates a preempted VM) instead of removing it
#   2. SIGTERM the workers' process group (startup.sh wrote its id to work.pgid) and
#      startup.sh itself: each worker gives its item back at once, so other workers take it
#      within seconds instead of after the lease's TTL
#   3. wait until they are gone (startup.sh ships the log last), within the window: 25 s after
#      a preemption, 80 s otherwise
#
#   FLEET_WORK_DIR, GCE_METADATA_HOST  as startup.sh reads them
set -uo pipefail

WORK_DIR=${FLEET_WORK_DIR:-/var/lib/fleet}
MD=http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1
LOG=$WORK_DIR/logs/startup.log

log() { echo "$(date -u +%FT%TZ) shutdown: $*" | tee -a "$LOG"; }
alive() { [[ -n $1 ]] && kill -0 -- "$1" 2>/dev/null; }

[[ -d $WORK_DIR/logs ]] || exit 0 # startup.sh never ran on this boot
preempted=$(curl -fsS --max-time 2 --noproxy '*' -H 'Metadata-Flavor: Google' "$MD/instance/preempted" 2>/dev/null)
budget=80
[[ $preempted == TRUE ]] && budget=25
touch "$WORK_DIR/stopping"

group=$(cat "$WORK_DIR/work.pgid" 2>/dev/null) && [[ $group =~ ^[0-9]+$ ]] && group=-$group || group=
startup=$(cat "$WORK_DIR/startup.pid" 2>/dev/null) && [[ $startup =~ ^[0-9]+$ ]] || startup=
alive "$startup" || startup=
log "the VM is stopping${preempted:+ (preempted: $preempted)}: SIGTERM to the workers and startup.sh; waiting up to ${budget}s"
if alive "$group"; then kill -TERM -- "$group" 2>/dev/null; fi
if [[ -n $startup ]]; then kill -TERM "$startup" 2>/dev/null; fi

deadline=$((SECONDS + budget))
while ((SECONDS < deadline)) && { alive "$group" || alive "$startup"; }; do
  sleep 0.2
done
if alive "$group" || alive "$startup"; then
  log "still running after ${budget}s; the power-off ends them"
else
  log "workers and startup.sh are done"
fi
