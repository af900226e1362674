#!/usr/bin/env bash
# fleet worker VM startup script (GCE runs it as root at every boot; running it again is safe).
#
#   0. arm the way out first: whatever fails from here on, the EXIT trap records this boot in
#      the bucket and removes the VM from its MIG with nothing but bash, curl and the metadata
#      server's token (REST deleteInstances); when a few boots in a row have failed with no item
#      finished in between, it deletes the MIG and the template instead: the run stops itself.
#      A boot the run's deadline ended (fleet-deadline, the template's terminationTime) counts as
#      failed, and stops the run at once: no VM of it can start after that time
#   1. read the run, bucket, code version and the run's object names from instance metadata
#      (fleet-paths: fleet/core/layout.py owns every name under runs/<run>/; this script spells none)
#   2. download the pinned code snapshot and check every file against its manifest
#   3. make sure Python and the locked dependencies are there (a Packer image already has them),
#      and log which path the tokenizer takes: the C core the snapshot carries (built by setup.py
#      where it was synced from; no compiler here), else Python (slower, the same records)
#   4. run `fleet work` as an unprivileged user, one process per core, in its own process group
#      (recorded for shutdown.sh), streaming this log to the bucket
#   Everything it and the workers say goes to its log file (shipped to the bucket) and to its stdout,
#   which the guest agent's runner writes to the journal and the serial console.
#   5. on exit, leave the MIG through deleteInstances; a VM that finds every item of the run
#      finished deletes the MIG (every VM leaving through deleteInstances first) and the template.
#      Not when the platform stops the VM (preemption, `fleet down`): then the MIG decides, and
#      startup/shutdown.sh has the workers give their items back.
#
# Production defaults; a test overrides what differs on a laptop:
#   FLEET_PYTHON        python with the dependencies (default /opt/fleet/venv/bin/python)
#   FLEET_SKIP_INSTALL  1 = only check that FLEET_PYTHON has the dependencies, never install
#   FLEET_WORK_DIR      code, logs and lock (default /var/lib/fleet)
#   FLEET_LOG_INTERVAL  seconds between log uploads (default 30)
#   FLEET_RUN_AS        the system user the workers run as (default fleet; empty = this user)
#   FLEET_MAX_FAILED_BOOTS  failed boots with no item finished in between that stop the run (default 3)
#   FLEET_CURL_RETRIES  curl's own retries of a bucket request before gs() calls it an outage (default 5: ~31 s)
#   FLEET_INSTALL_ONLY  path of a requirements.lock: install Python and exactly it, then stop (Packer)
#   FLEET_COMPUTE_ENDPOINT, GCE_METADATA_HOST, STORAGE_EMULATOR_HOST  as fleet, google-auth and
#                       google-cloud-storage read them
set -euo pipefail
umask 022

PY=${FLEET_PYTHON:-/opt/fleet/venv/bin/python}
VENV=$(dirname "$(dirname "$PY")")
STAMP=$VENV/fleet-lock.sha256 # sha256 of the lock file the venv was installed from
LOCK=requirements.lock       # in the code snapshot: exact versions and hashes of the dependencies
WORK_DIR=${FLEET_WORK_DIR:-/var/lib/fleet}
SKIP_INSTALL=${FLEET_SKIP_INSTALL:-0}
LOG_INTERVAL=${FLEET_LOG_INTERVAL:-30}
RUN_AS=${FLEET_RUN_AS-fleet}
MAX_FAILED_BOOTS=${FLEET_MAX_FAILED_BOOTS:-3}
MD=http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1
GCS=${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}
CE=${FLEET_COMPUTE_ENDPOINT:-https://compute.googleapis.com}
# What `fleet work` imports: the check that the venv has the dependencies. Not compute_v1: the VM talks to Compute
# with curl, and importing it costs 3-4 s of CPU at every boot.
IMPORTS="google.cloud.storage, google.auth, typer, rich, tenacity"
LOG=$WORK_DIR/logs/startup.log
STARTED=$(date +%s)
CURL_RETRIES=${FLEET_CURL_RETRIES:-5}
# How long a bucket request waits out an outage: the workers' FLEET_OUTAGE_MINUTES (fleet.core.processes), 30.
OUTAGE_S=$(awk -v m="${FLEET_OUTAGE_MINUTES:-30}" 'BEGIN { if (m ~ /^[0-9]+([.][0-9]*)?$/) printf "%d", m * 60; else print 1800 }')

log() { echo "$(date -u +%FT%TZ) startup: $*"; }
fail() { # REASON: record why this boot failed (a step in a subshell too), then exit through on_exit
  log "error: $*"
  echo "$*" >"$WORK_DIR/reason" 2>/dev/null || true
  exit 1
}

step_failed() { # WHAT: a step in the background failed; it said why (fail) unless a signal stopped it
  [[ -s $WORK_DIR/reason ]] && exit 1
  fail "$1"
}

md() { curl -fsS --retry 5 --retry-connrefused --noproxy '*' -H 'Metadata-Flavor: Google' "$MD/$1"; }
token() { md instance/service-accounts/default/token | sed -n 's/.*"access_token" *: *"\([^"]*\)".*/\1/p'; }
json() { # STRING as a JSON string
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/ }
  printf '"%s"' "$(printf '%s' "$s" | tr -d '\000-\037')"
}
gs() { # OUT CURL-ARGS...: one request to the bucket (its answer's body in the file OUT); 0 once it succeeded.
  # An outage (no answer, or 408, 429 or 5xx once curl's own retries are spent) is ridden out as the workers ride
  # it out (fleet.core.processes.riding_out): tried again after a jittered pause of up to a minute, for up to
  # OUTAGE_S seconds from the first failure, so that a VM booting in an outage waits for the bucket instead of
  # failing its boot. Any other answer (a 404, a 403) fails at once. Said on stderr: gs_count's stdout is a number.
  local out=$1 code rc began=$SECONDS n=0 cap
  shift
  while :; do
    rc=0
    code=$(curl -sS --retry "$CURL_RETRIES" --retry-connrefused -o "$out" -w '%{http_code}' "$@") || rc=$?
    GS_CODE=$code
    [[ $rc == 0 && $code == 2* ]] && return 0
    [[ $code =~ ^(000|408|429|5[0-9][0-9])$ ]] || { log "bucket request failed: HTTP $code" >&2; return 1; }
    if ((SECONDS - began >= OUTAGE_S)); then
      log "the bucket is still unreachable (HTTP $code) after $((SECONDS - began)) s: giving up" >&2
      return 1
    fi
    cap=$((1 << (n < 6 ? n : 6)))
    ((cap < 60)) || cap=60
    n=$((n + 1))
    log "the bucket is unreachable (HTTP $code): waiting for it, up to $((OUTAGE_S / 60)) min" >&2
    sleep $((1 + RANDOM % cap))
  done
}
gs_get() { # OBJECT FILE
  gs "$2" -H "Authorization: Bearer $TOKEN" "$GCS/storage/v1/b/$BUCKET/o/${1//\//%2F}?alt=media"
}
gs_put() { # FILE OBJECT [CONTENT-TYPE]
  # The answer goes to a file of its own, not /dev/null: curl truncates its output before each retry, which
  # /dev/null refuses ("curl: (23)"), and the upload failed at once instead of riding out an outage.
  local answer rc=0
  answer=$(mktemp "$WORK_DIR/put.XXXXXX") || return 1
  gs "$answer" -X POST -H "Authorization: Bearer $(token)" -H "Content-Type: ${3:-text/plain}" \
    --data-binary "@$1" "$GCS/upload/storage/v1/b/$BUCKET/o?uploadType=media&name=${2//\//%2F}" || rc=$?
  rm -f "$answer"
  return $rc
}
gs_count() { # PREFIX: how many objects it holds
  local n=0 page="" out f=$WORK_DIR/list.json
  while :; do
    gs "$f" -H "Authorization: Bearer $(token)" \
      "$GCS/storage/v1/b/$BUCKET/o?prefix=${1//\//%2F}&fields=items(name),nextPageToken${page:+&pageToken=$page}" ||
      return 1
    out=$(cat "$f")
    n=$((n + $(grep -o '"name"' <<<"$out" | wc -l)))
    page=$(sed -n 's/.*"nextPageToken": *"\([^"]*\)".*/\1/p' <<<"$out")
    [[ -n $page ]] || break
  done
  echo "$n"
}

api() { # METHOD PATH [BODY]: one Compute Engine REST call as this VM; answer in API_OUT, 0 if it succeeded
  local args=(-sS --retry 5 --retry-connrefused -X "$1" -o "$WORK_DIR/api.out" -w '%{http_code}'
    -H "Authorization: Bearer $(token)")
  if [[ -n ${3:-} ]]; then args+=(-H 'Content-Type: application/json' --data-binary "$3")
  elif [[ $1 == POST ]]; then args+=(-H 'Content-Length: 0'); fi
  API_CODE=$(curl "${args[@]}" "$CE/compute/v1/projects/$PROJECT/$2") || API_CODE=${API_CODE:-000}
  API_OUT=$(cat "$WORK_DIR/api.out" 2>/dev/null || true)
  [[ $API_CODE == 2* ]] && ! grep -q '"error"' <<<"$API_OUT"
}
api_error() { echo "HTTP $API_CODE $(sed -n 's/.*"message": *"\([^"]*\)".*/\1/p' <<<"$API_OUT" | head -n 1)"; }
api_wait() { # wait (up to a minute) for the operation in API_OUT; 0 if it ended without error
  local name i
  name=$(sed -n 's/.*"name": *"\(operation-[^"]*\)".*/\1/p' <<<"$API_OUT" | head -n 1)
  for ((i = 0; i < 60; i++)); do
    grep -q '"status": *"DONE"' <<<"$API_OUT" && break
    sleep 1
    api GET "global/operations/$name" || return 1
  done
  grep -q '"status": *"DONE"' <<<"$API_OUT" && ! grep -q '"error"' <<<"$API_OUT"
}

mig_pages() { # FUNC: list the MIG's VMs page by page (listManagedInstances), FUNC on each page (in API_OUT);
  # a FUNC that returns non-zero ends the walk. 1 if a page cannot be listed.
  local page=""
  while :; do
    api POST "$SCOPE/instanceGroupManagers/$MIG/listManagedInstances${page:+?pageToken=$page}" || return 1
    "$1" || return 0
    page=$(sed -n 's/.*"nextPageToken": *"\([^"]*\)".*/\1/p' <<<"$API_OUT" | head -n 1)
    [[ -n $page ]] || return 0
  done
}

remove_all() { # deleteInstances on every VM of the MIG (1000 a call), so that none holds up the MIG's deletion
  local urls=() i body
  add_urls() { mapfile -t -O "${#urls[@]}" urls < <(grep -o '"instance": *"[^"]*"' <<<"$API_OUT" | sed 's/.*"\([^"]*\)"$/\1/'); }
  mig_pages add_urls || { log "could not list the VMs of $MIG: $(api_error)"; return; }
  for ((i = 0; i < ${#urls[@]}; i += 1000)); do
    body=$(printf '"%s", ' "${urls[@]:i:1000}")
    api POST "$SCOPE/instanceGroupManagers/$MIG/deleteInstances" \
      "{\"instances\": [${body%, }], \"skipInstancesOnValidationError\": true}" ||
      log "could not remove the VMs of $MIG: $(api_error)"
  done
  log "$MIG: deleteInstances on its ${#urls[@]} VM(s)"
}

staying() { # how many VMs of the MIG are not being deleted (yet): "" if the MIG cannot be listed
  local n=0
  count_staying() { n=$((n + $(grep -o '"currentAction": *"[A-Z_]*"' <<<"$API_OUT" | grep -vc '"DELETING"' || true))); }
  mig_pages count_staying || return
  echo "$n"
}

delete_fleet() { # the MIG and then the template, which stays in use until the MIG is gone
  # Every VM leaves through deleteInstances first: a MIG none of whose VMs it must stop itself is gone at once
  # (a VM stopped by the MIG's deletion would hold it up, and with it the template, until it powers off).
  # deleteInstances is DONE once the deletions are scheduled: wait (a minute at most) until every VM is DELETING.
  remove_all
  local n i
  for ((i = 0; i < 60; i++)); do
    n=$(staying)
    [[ $n == 0 || -z $n ]] && break
    sleep 1
  done
  [[ $n == 0 ]] || log "$MIG: ${n:-?} VM(s) not yet deleting after a minute; deleting the MIG stops them"
  if api DELETE "$SCOPE/instanceGroupManagers/$MIG"; then log "$MIG: deleting"
  elif [[ $API_CODE == 404 ]]; then log "$MIG: already deleted"
  else log "could not delete $MIG: $(api_error)"; fi
  [[ -n $TEMPLATE ]] || { log "no instance-template in metadata: \`fleet down\` deletes the template"; return; }
  local i
  for ((i = 0; i < 60; i++)); do
    if api DELETE "global/instanceTemplates/$TEMPLATE" && api_wait; then
      log "$TEMPLATE: deleted"
      return
    elif [[ $API_CODE == 404 ]]; then
      log "$TEMPLATE: already deleted"
      return
    elif ! grep -qE 'resourceInUseByAnotherResource|RESOURCE_IN_USE_BY_ANOTHER_RESOURCE' <<<"$API_OUT"; then
      # (GCE says "in use" as a 400 or as the error of the delete's operation)
      log "could not delete $TEMPLATE: $(api_error)"
      return
    fi
    sleep 2 # still used by the MIG being deleted
  done
  log "$TEMPLATE still in use after 2 minutes: \`fleet down\` deletes it"
}

leave() { # remove this VM from its MIG (deleteInstances lowers the target size; a plain delete would be undone)
  local body="{\"instances\": [\"zones/$ZONE/instances/$INSTANCE\"], \"skipInstancesOnValidationError\": true}"
  if api POST "$SCOPE/instanceGroupManagers/$MIG/deleteInstances" "$body"; then
    log "$INSTANCE: removed from $MIG through deleteInstances"
  elif [[ $API_CODE == 404 ]]; then # a VM that found the run finished first removed every VM, then the MIG
    log "$INSTANCE: $MIG is already deleted, and this VM with it"
  else
    log "could not remove this VM from its MIG ($(api_error)); it ends at the run's deadline"
  fi
  if [[ ${STOP_RUN:-0} == 1 ]]; then
    log "stopping the run: deleting $MIG and its template"
    delete_fleet
  elif [[ ${OUTCOME:-} == done ]] && run_finished; then
    # Not "the last one out" by the MIG's size: deleteInstances lowers it only later, and VMs stuck in
    # CREATING (a stock-out, a quota) count in it. Whoever sees the run finished deletes the fleet; a
    # second one finds it gone (404), so the workers that drain together may all try.
    log "$INSTANCE: the run is finished: deleting $MIG and template $TEMPLATE"
    delete_fleet
  elif own_deletion_shows && [[ $(staying) == 0 ]]; then
    # The run is not finished, and no VM is left to finish it (a bucket that refuses every VM finishes
    # nothing, and cannot count their failed boots either): the last one out takes the fleet with it. Judged
    # by the VMs' own states once this one's deletion shows, never by the target size, which drops later.
    log "$INSTANCE: the last VM of $MIG, with the run unfinished: deleting $MIG and template $TEMPLATE"
    delete_fleet
  else
    log "$MIG: the run goes on; leaving it to the other VMs"
  fi
}

own_deletion_shows() { # wait (a minute at most) until this VM is DELETING in its MIG's list, or gone from it
  local i state
  find_own() { state=$(own_action); [[ -z $state ]]; } # (on to the next page while not found)
  for ((i = 0; i < 60; i++)); do
    state=""
    mig_pages find_own || return 1
    [[ -z $state || $state == DELETING ]] && return 0
    sleep 1
  done
  log "$INSTANCE: still $state in $MIG after a minute"
  return 1
}

own_action() { # this VM's currentAction on the listManagedInstances page in API_OUT ("" if not on it)
  # Each managed instance is an object of the array (depth 2), its own fields at any order beside nested ones.
  awk -v me="/instances/$INSTANCE\"" 'BEGIN { RS = "\001" } {
    d = 0; obj = ""
    for (i = 1; i <= length($0); i++) {
      c = substr($0, i, 1)
      if (c == "{") d++
      if (d >= 2) obj = obj c
      if (c == "}") {
        if (d == 2) {
          if (index(obj, me) && match(obj, /"currentAction": *"[A-Z_]*"/)) {
            s = substr(obj, RSTART, RLENGTH); sub(/.*: *"/, "", s); sub(/"$/, "", s); print s; exit
          }
          obj = ""
        }
        d--
      }
    }
  }' <<<"$API_OUT"
}

run_finished() { # has every item of the run finished, and are the run's files written? A worker of this VM found so
  # (fleet work --drained-file): it confirmed the drain by a listing of every lease and marker and wrote the files,
  # or it waited for the word of the worker that did (fleet.core.manifest.run_ended). A VM whose workers all left
  # as spares did not: standbys elsewhere stay until the drain (or the last one out takes the fleet with it). Each
  # VM listing the run on its way out would cost 2 x items / 1,000 calls a VM.
  [[ -f $WORK_DIR/report/drained ]]
}

declare -A PATHS=() # KEY -> an object name in the bucket, a template over {instance}, {boot}, {finished}, {version}, {sha256}

load_paths() { # TEXT: the metadata fleet-paths, one KEY=TEMPLATE a line (fleet/core/layout.py: vm_paths_text)
  local key value
  while IFS='=' read -r key value; do
    [[ -n $key ]] || continue
    [[ $key =~ ^[a-z-]+$ && $value =~ ^[-A-Za-z0-9_./{}]+$ ]] || return 1
    PATHS[$key]=$value
  done <<<"$1"
  for key in boot log final failed failed-now stop code-manifest code-object; do [[ -n ${PATHS[$key]:-} ]] || return 1; done
}

at() { # KEY [VALUE]: the object name, this VM's instance, boot and code version (and VALUE: {finished}, {sha256}) filled in
  local name
  at_into name "$@"
  printf '%s' "$name"
}
at_into() { # VAR KEY [VALUE]: at's name into VAR (no subshell: fetch_code names an object a file)
  local _name=${PATHS[$2]}
  _name=${_name//\{instance\}/$INSTANCE}
  _name=${_name//\{boot\}/$BOOT}
  _name=${_name//\{version\}/${VERSION:-}}
  _name=${_name//\{sha256\}/${3:-}}
  printf -v "$1" '%s' "${_name//\{finished\}/${3:-}}"
}

record_boot() { # OUTCOME REASON: this boot's record (at boot: one per boot, never another boot's)
  local f=$WORK_DIR/boot.json
  printf '{"instance": %s, "boot": %s, "zone": %s, "code_version": %s, "started": %s, "updated": %s, "outcome": %s, "reason": %s, "log_tail": %s}\n' \
    "$(json "$INSTANCE")" "$(json "$BOOT")" "$(json "$ZONE")" "$(json "${VERSION:-}")" "$STARTED" "$(date +%s)" \
    "$(json "$1")" "$(json "$2")" "$(json "$(tail -n 20 "$LOG" 2>/dev/null)")" >"$f"
  gs_put "$f" "$(at boot)" application/json || log "boot record upload failed"
}

count_failure() { # REASON: a failed boot; after MAX_FAILED_BOOTS of them with no item finished in between, stop the run
  local finished failed f=$WORK_DIR/stop.json
  finished=$(gs_count "$(at final)") || { log "cannot list $(at final)"; return; }
  FINISHED=$finished
  gs_put /dev/null "$(at failed "$finished")" || { log "cannot record the failure"; return; }
  failed=$(gs_count "$(at failed-now "$finished")") || return
  FAILED=$failed
  log "$failed failed boot(s) with $finished item(s) finished, none since; the run stops at $MAX_FAILED_BOOTS"
  if ((failed >= MAX_FAILED_BOOTS)); then
    STOP_RUN=1
    printf '{"time": %s, "instance": %s, "failed_boots": %s, "items_finished": %s, "reason": %s}\n' "$(date +%s)" \
      "$(json "$INSTANCE-$BOOT")" "$failed" "$finished" "$(json "$1")" >"$f"
    gs_put "$f" "$(at stop)" application/json || log "could not write $(at stop)"
  fi
}

ship_log() { gs_put "$LOG" "$(at log)" || log "log upload failed"; }

at_deadline() { # did the run's deadline end this boot? (GCE stops a VM at its terminationTime, up to 30 s late, never early)
  [[ -n ${DEADLINE:-} ]] && (($(date +%s) >= DEADLINE - 30))
}

stop_at_deadline() { # REASON: no VM of the run can start any more, so its MIG and template go now (the stop record says why)
  local f=$WORK_DIR/stop.json
  STOP_RUN=1
  printf '{"time": %s, "instance": %s, "failed_boots": %s, "items_finished": %s, "reason": %s, "deadline": %s}\n' \
    "$(date +%s)" "$(json "$INSTANCE-$BOOT")" "${FAILED:-0}" "${FINISHED:-0}" "$(json "$1")" "$DEADLINE" >"$f"
  gs_put "$f" "$(at stop)" application/json || log "could not write $(at stop)"
}

run() { # COMMAND...: one step of the boot, in the background so that a stop (SIGTERM) interrupts it at once
  "$@" &
  CHILD=$!
  local rc=0
  wait "$CHILD" || rc=$?
  if [[ ${STOPPING:-0} == 1 ]]; then wait "$CHILD" 2>/dev/null || true; fi
  CHILD=
  return "$rc"
}

on_term() { # from shutdown.sh: the platform is stopping this VM
  STOPPING=1
  log "SIGTERM: the VM is stopping; workers give their items back"
  if [[ -n ${CHILD:-} ]]; then kill -TERM "$CHILD" 2>/dev/null || true; fi
  if [[ -n ${WORKER:-} ]]; then kill -TERM -- "-$WORKER" 2>/dev/null || true; fi
}

on_exit() { # the way out: record the boot, then leave the MIG (or stop the run), whatever happened before
  local rc=$? outcome reason=""
  set +e
  trap '' TERM
  ((OUTAGE_S < 120)) || OUTAGE_S=120 # on the way out a record is worth the storage client's 2 minutes, not the workers' 30
  if [[ -n ${WORKER:-} ]]; then wait "$WORKER" 2>/dev/null; fi
  if [[ -n ${SHIPPER:-} ]]; then kill "$SHIPPER" 2>/dev/null; fi
  [[ -f $WORK_DIR/stopping ]] && STOPPING=1
  if [[ ${WORK_RC:-} == 0 ]] && { [[ ${WORK_ENDED:-0} == 1 ]] || run_finished; }; then
    # The workers finished before the stop reached them, or found the whole run finished: a VM that another one
    # deletes because the run drained is done, not stopped (and leaves like one: the MIG must not recreate it).
    outcome=done
  elif [[ ${STOPPING:-0} == 1 ]] && at_deadline; then
    outcome=failed # a time limit that ends boots must count: a hung worker would otherwise never stop the run
    reason="the run's deadline ($(date -u -d "@$DEADLINE" +%FT%TZ)) ended this boot"
  elif [[ ${STOPPING:-0} == 1 ]]; then
    outcome=stopped
  elif [[ $rc == 0 ]]; then
    outcome=done
  else
    outcome=failed
    reason=$(cat "$WORK_DIR/reason" 2>/dev/null)
    reason=${reason:-exit status $rc}
  fi
  log "exiting ($rc): this boot $outcome${reason:+: $reason}"
  OUTCOME=$outcome
  if [[ -z ${MIG:-} ]]; then
    log "cannot leave the MIG (its name, zone or project is unreadable from metadata); this VM ends at the run's deadline"
    return
  fi
  if [[ -n ${BUCKET:-} && ${#PATHS[@]} -gt 0 ]]; then
    record_boot "$outcome" "$reason"
    if [[ $outcome == failed ]]; then count_failure "$reason"; fi
    if [[ $outcome == failed ]] && at_deadline; then stop_at_deadline "$reason"; fi
    ship_log
  fi
  if [[ $outcome == stopped ]]; then
    log "left to the MIG: it recreates a preempted VM, or finishes deleting this one"
  else
    leave # its deletion starts this VM's shutdown: the log went up first, and goes once more if there is time
  fi
  if [[ -n ${BUCKET:-} && ${#PATHS[@]} -gt 0 ]]; then ship_log; fi
}

end_log() { # the follower copies the last lines to the runner, then ends (so that the runner's pipe does)
  kill "$SENTINEL" 2>/dev/null
  wait "$SENTINEL" "$FOLLOWER" 2>/dev/null
}

apt_install() { # PACKAGE...: waiting for the dpkg lock (unattended-upgrades at boot) instead of failing on it
  local wait=(-o DPkg::Lock::Timeout=600) i
  export DEBIAN_FRONTEND=noninteractive
  for ((i = 1; ; i++)); do # the lists lock is not the dpkg lock: update is retried instead
    run apt-get "${wait[@]}" update -qq && break
    ((i < 5)) || fail "apt-get update failed 5 times"
    sleep 10
  done
  run apt-get "${wait[@]}" install -y -qq --no-install-recommends "$@" >/dev/null || fail "apt-get install $* failed"
}

install_deps() { # LOCK: Python and exactly the locked dependencies (versions and hashes)
  [[ -f $1 ]] || fail "$1: no lock file; this code snapshot cannot be installed"
  if [[ $SKIP_INSTALL == 1 ]]; then
    "$PY" -c "import $IMPORTS" || fail "$PY cannot import $IMPORTS (and FLEET_SKIP_INSTALL=1)"
    log "python: $PY has the dependencies"
    return
  fi
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    log "installing python3 and python3-venv"
    apt_install python3 python3-venv
  fi
  local want
  want=$(sha256sum <"$1" | cut -c1-64)
  if [[ -x $PY && -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
    log "python: the locked dependencies are installed (image or earlier boot)"
    return
  fi
  log "python: installing the locked dependencies into $VENV"
  run python3 -m venv "$VENV" || fail "python3 -m venv $VENV failed"
  run "$PY" -m pip install -q --no-input --require-hashes --no-deps --only-binary=:all: -r "$1" ||
    fail "pip could not install $1 (--require-hashes)"
  "$PY" -c "import $IMPORTS" || fail "$PY cannot import $IMPORTS after installing $1"
  mkdir -p "$(dirname "$STAMP")"
  echo "$want" >"$STAMP"
}

check_native() { # which path the tokenizer takes: the C core in the snapshot (fleet_jobs/text/tokenizers/native.py), or Python
  local out
  if out=$("$PY" -m fleet_jobs.text.tokenizers.native 2>&1); then
    log "tokenizer C core: $out"
    return
  fi
  out=$(tail -n 1 <<<"$out")
  log "tokenizer C core: ${out#fleet: }"
  return 1
}

unread() { # WHAT-A-404-MEANS: why the last bucket read failed (GS_CODE), in words
  case $GS_CODE in
    404) echo "$1" ;;
    401 | 403) echo "code $VERSION: gs://$BUCKET refused this VM (HTTP $GS_CODE): the VMs' service account needs to read it" ;;
    *) echo "code $VERSION: gs://$BUCKET is unreachable (HTTP $GS_CODE), longer than $((OUTAGE_S / 60)) min" ;;
  esac
}

fetch_code() { # the pinned snapshot into $CODE, every file checked against the manifest
  if [[ -f $CODE/MANIFEST.sha256 ]] && (cd "$CODE" && sha256sum --quiet --strict -c MANIFEST.sha256 >/dev/null 2>&1); then
    log "code $VERSION: already here and verified"
    return
  fi
  mkdir -p "$WORK_DIR/code"
  TOKEN=$(token)
  local tmp sum path n=0
  tmp=$(mktemp -d "$WORK_DIR/code/.incoming-XXXXXX")
  gs_get "$(at code-manifest)" "$tmp/MANIFEST.sha256" || fail "$(unread "no code $VERSION in gs://$BUCKET (fleet sync)")"
  [[ $(sha256sum <"$tmp/MANIFEST.sha256" | cut -c1-16) == "$VERSION" ]] ||
    fail "the manifest of code $VERSION does not hash to its name; refusing it"
  # Every object in one curl, over one connection: a curl and a connection per file cost about a second per
  # 10 files on a busy machine, and a TLS handshake each on GCS. An object it did not get whole with a 2xx
  # goes through gs_get, one by one: that rides out an outage and says why a 403 or a 404 fails the boot.
  local cfg=$WORK_DIR/code/fetch.curl got=$WORK_DIR/code/fetch.got dir name url q i
  local -a sums=() paths=() objects=() urls=()
  local -A made=() fetched=()
  : >"$cfg"
  while read -r sum path; do
    [[ $sum =~ ^[0-9a-f]{64}$ && -n $path && $path != /* && /$path/ != */../* ]] || fail "bad manifest line: $sum $path"
    dir=.
    [[ $path == */* ]] && dir=${path%/*}
    [[ -n ${made[$dir]:-} ]] || { mkdir -p "$tmp/$dir"; made[$dir]=1; }
    at_into name code-object "$sum"
    url="$GCS/storage/v1/b/$BUCKET/o/${name//\//%2F}?alt=media"
    sums+=("$sum") paths+=("$path") objects+=("$name") urls+=("$url")
    q="$tmp/$path"
    q=${q//\\/\\\\}
    printf 'url = "%s"\noutput = "%s"\n' "$url" "${q//\"/\\\"}" >>"$cfg"
  done <"$tmp/MANIFEST.sha256"
  curl -sS --retry "$CURL_RETRIES" --retry-connrefused -H "Authorization: Bearer $TOKEN" \
    -w '%{exitcode} %{http_code} %{url_effective}\n' -K "$cfg" >"$got" 2>/dev/null || true
  while read -r rc code url; do [[ $rc == 0 && $code == 2* ]] && fetched[$url]=1; done <"$got"
  for ((i = 0; i < ${#urls[@]}; i++)); do
    if [[ -z ${fetched[${urls[i]}]:-} ]]; then
      gs_get "${objects[i]}" "$tmp/${paths[i]}" ||
        fail "$(unread "code object ${sums[i]} (${paths[i]}) is missing from gs://$BUCKET")"
    fi
    n=$((n + 1))
  done
  rm -f "$cfg" "$got"
  (cd "$tmp" && sha256sum --quiet --strict -c MANIFEST.sha256) ||
    fail "the downloaded code does not match its manifest; refusing to run it"
  chmod 755 "$tmp"
  rm -rf "$CODE"
  mv "$tmp" "$CODE"
  log "code $VERSION: $n files downloaded and verified"
}

start_workers() { # `fleet work` in its own process group (its id in work.pgid, for shutdown.sh)
  local as=()
  if [[ -n $RUN_AS ]]; then
    id -u "$RUN_AS" >/dev/null 2>&1 ||
      useradd --system --user-group --home-dir "$WORK_DIR/home" --shell /usr/sbin/nologin "$RUN_AS" ||
      fail "cannot create the system user $RUN_AS"
    install -d -o "$RUN_AS" -g "$RUN_AS" -m 0700 "$WORK_DIR/home"
    as=(setpriv "--reuid=$RUN_AS" "--regid=$RUN_AS" --init-groups env "HOME=$WORK_DIR/home" "USER=$RUN_AS")
    log "workers run as $RUN_AS (uid $(id -u "$RUN_AS"))"
  fi
  # Not a process-group leader (no job control), so setsid makes the session in place: its pid is the group's id.
  install -d -m 0700 "$WORK_DIR/report" && rm -f "$WORK_DIR/report/drained"
  if [[ -n $RUN_AS ]]; then chown "$RUN_AS:$RUN_AS" "$WORK_DIR/report"; fi
  setsid "${as[@]}" "$PY" -m fleet.cli work --bucket "$BUCKET_URL" --run "$RUN" --procs "$PROCS" \
    --name-prefix "$INSTANCE" --standby "$STANDBY" --drained-file "$WORK_DIR/report/drained" 9>&- &
  WORKER=$!
  echo "$WORKER" >"$WORK_DIR/work.pgid"
}

if [[ -n ${FLEET_INSTALL_ONLY:-} ]]; then # image build: Python and the locked dependencies, nothing else
  WORK_DIR=$(mktemp -d)
  run() { "$@"; }
  install_deps "$FLEET_INSTALL_ONLY"
  exit 0
fi

mkdir -p "$WORK_DIR/logs"
exec 9>"$WORK_DIR/startup.lock"
flock -n 9 || { log "another startup.sh is running on this VM"; exit 0; }
rm -f "$WORK_DIR/stopping" "$WORK_DIR/reason" "$WORK_DIR/work.pgid"
echo $$ >"$WORK_DIR/startup.pid"
# Everything from here on (this script, curl, the workers) goes to $LOG, which the boot record quotes and
# the bucket receives, and, copied by a follower to this script's own stdout, to the guest agent's runner,
# which writes each line to the journal and the serial console (google-startup-scripts.service:
# StandardOutput=journal+console): the one way out when the bucket is the problem (a 403, a wrong name).
# A follower rather than a tee: the file is written at once, and when the runner goes (a stop kills it)
# only the follower dies of the broken pipe, never this script. It follows while a sentinel lives, which
# end_log ends last thing: not --pid=$$, for the runner reads the pipe to its end before it reaps this
# script, and tail takes an unreaped script for a live one (both would wait forever).
touch "$LOG"
sleep 2147483647 </dev/null >/dev/null 2>&1 9>&- &
SENTINEL=$!
tail -c "+$(($(wc -c <"$LOG") + 1))" -F -s 0.2 --pid=$SENTINEL "$LOG" 9>&- 2>/dev/null &
FOLLOWER=$!
exec >>"$LOG" 2>&1
trap 'on_exit; end_log' EXIT
trap on_term TERM

# Who this VM is: all the way out needs. Without it, only the run's deadline ends the VM.
INSTANCE=$(md instance/name) || fail "metadata instance/name is unreadable"
ZONE=$(md instance/zone) || fail "metadata instance/zone is unreadable"
ZONE=${ZONE##*/}
PROJECT=$(md project/project-id) || fail "metadata project/project-id is unreadable"
CREATED_BY=$(md instance/attributes/created-by) || fail "metadata created-by is unreadable"
TEMPLATE=$(md instance/attributes/instance-template 2>/dev/null || true) && TEMPLATE=${TEMPLATE##*/}
BOOT=$( (md instance/id || true; cat /proc/sys/kernel/random/boot_id) | sha256sum | cut -c1-12)
[[ $CREATED_BY =~ ^projects/[^/]+/((zones|regions)/[a-z0-9-]+)/instanceGroupManagers/([a-z0-9-]+)$ ]] ||
  fail "created-by '$CREATED_BY': this VM was not created by a managed instance group"
SCOPE=${BASH_REMATCH[1]}
MIG=${BASH_REMATCH[3]}

BUCKET_URL=$(md instance/attributes/fleet-bucket) || fail "metadata fleet-bucket is unreadable"
[[ $BUCKET_URL =~ ^gs://[a-z0-9][-a-z0-9_.]*$ ]] || fail "metadata fleet-bucket '$BUCKET_URL' is not gs://BUCKET"
BUCKET=${BUCKET_URL#gs://}
RUN=$(md instance/attributes/fleet-run) || fail "metadata fleet-run is unreadable"
[[ $RUN =~ ^[A-Za-z0-9_][-A-Za-z0-9_.]*$ ]] || fail "metadata fleet-run is not a run name"
PATHS_TEXT=$(md instance/attributes/fleet-paths) || fail "metadata fleet-paths is unreadable"
load_paths "$PATHS_TEXT" || { PATHS=(); fail "metadata fleet-paths is not the run's object names (KEY=NAME lines)"; }
DEADLINE=$(md instance/attributes/fleet-deadline 2>/dev/null || true) # absent on a template made before deadlines
[[ $DEADLINE =~ ^[0-9]+$ ]] || DEADLINE=
log "VM $INSTANCE (boot $BOOT) of $MIG: run $RUN; log in $LOG and gs://$BUCKET/$(at log)"
record_boot booting ""
(while sleep "$LOG_INTERVAL"; do ship_log; done) 9>&- &
SHIPPER=$!

VERSION=$(md instance/attributes/fleet-code-version) || fail "metadata fleet-code-version is unreadable"
PROCS=$(md instance/attributes/fleet-workers-per-vm) || fail "metadata fleet-workers-per-vm is unreadable"
STANDBY=$(md instance/attributes/fleet-standby) || fail "metadata fleet-standby is unreadable"
[[ $VERSION =~ ^[0-9a-f]{16}$ ]] || fail "metadata fleet-code-version '$VERSION' is not a code version"
[[ $PROCS =~ ^[0-9]+$ && $STANDBY =~ ^[0-9]+$ ]] || fail "metadata fleet-workers-per-vm/fleet-standby must be numbers"
if [[ $PROCS == 0 ]]; then PROCS=$(nproc); fi
log "VM $INSTANCE boots: run $RUN from $BUCKET_URL, code $VERSION, $PROCS worker(s), $STANDBY standby"

CODE=$WORK_DIR/code/$VERSION
run fetch_code || step_failed "downloading code $VERSION failed"
run install_deps "$CODE/$LOCK" || step_failed "installing the dependencies failed"
cd "$CODE"
export PYTHONPATH=$CODE
if ! check_native; then # never a reason to fail: the records are the same either way
  log "the tokenizer's C core is unavailable: workers tokenize in Python (about 3x slower)"
  export FLEET_NATIVE=0 # (so that each worker does not try and warn again)
fi
if [[ ${STOPPING:-0} == 1 ]]; then exit 1; fi # stopped while this boot prepared: no workers to start
start_workers
rc=0
wait "$WORKER" || rc=$?
if [[ ${STOPPING:-0} == 1 ]]; then
  rc=0
  wait "$WORKER" || rc=$?
elif [[ ! -f $WORK_DIR/stopping ]]; then
  WORK_ENDED=1 # on their own: shutdown.sh marks the stop before it signals them
fi
WORK_RC=$rc
log "fleet work finished ($rc)"
WORKER=
if [[ $rc != 0 && ${STOPPING:-0} != 1 ]]; then
  fail "fleet work exited $rc: $(grep -E ' (ERROR|CRITICAL) |Error:|error:' "$LOG" | tail -n 1 | cut -c1-300)"
fi
exit 0
