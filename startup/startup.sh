#!/usr/bin/env bash
# fleet worker VM startup script (GCE runs it as root at every boot; running it again is safe).
#
#   1. read the run, bucket and code version from instance metadata
#   2. download the pinned code snapshot and check every file against its manifest
#   3. make sure Python and the dependencies are there (a Packer image already has them)
#   4. run `fleet work`, one process per core, streaming this log to the bucket
#   5. on exit, remove this VM from its MIG through deleteInstances (`fleet leave`);
#      the last one out deletes the MIG and the template. Not when the platform
#      stops the VM (preemption, `fleet down`): then the MIG decides.
#
# Production defaults; a test overrides what differs on a laptop:
#   FLEET_PYTHON        python with the dependencies (default /opt/fleet/venv/bin/python)
#   FLEET_SKIP_INSTALL  1 = only check that FLEET_PYTHON has the dependencies, never install
#   FLEET_WORK_DIR      code, logs and lock (default /var/lib/fleet)
#   FLEET_LOG_INTERVAL  seconds between log uploads (default 30)
#   FLEET_INSTALL_ONLY  path of a pyproject.toml: install Python and its dependencies, then stop (Packer)
#   GCE_METADATA_HOST, STORAGE_EMULATOR_HOST  as google-auth and google-cloud-storage read them
set -euo pipefail
umask 022

PY=${FLEET_PYTHON:-/opt/fleet/venv/bin/python}
VENV=$(dirname "$(dirname "$PY")")
STAMP=/opt/fleet/deps.sha256 # sha256 of the dependency list the venv was built from
WORK_DIR=${FLEET_WORK_DIR:-/var/lib/fleet}
SKIP_INSTALL=${FLEET_SKIP_INSTALL:-0}
LOG_INTERVAL=${FLEET_LOG_INTERVAL:-30}
MD=http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1
GCS=${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}
IMPORTS="google.cloud.storage, google.cloud.compute_v1, google.auth, typer, rich, tenacity"

log() { echo "$(date -u +%FT%TZ) startup: $*"; }
die() { log "error: $*"; exit 1; }

md() { curl -fsS --retry 5 --retry-connrefused --noproxy '*' -H 'Metadata-Flavor: Google' "$MD/$1"; }
token() { md instance/service-accounts/default/token | sed -n 's/.*"access_token" *: *"\([^"]*\)".*/\1/p'; }
gs_get() { # OBJECT FILE
  curl -fsS --retry 5 --retry-connrefused -H "Authorization: Bearer $TOKEN" -o "$2" \
    "$GCS/storage/v1/b/$BUCKET/o/${1//\//%2F}?alt=media"
}
gs_put() { # FILE OBJECT
  curl -fsS --retry 3 -X POST -H "Authorization: Bearer $(token)" -H 'Content-Type: text/plain' \
    --data-binary "@$1" "$GCS/upload/storage/v1/b/$BUCKET/o?uploadType=media&name=${2//\//%2F}" >/dev/null
}

deps() { # PYPROJECT: the project's dependencies, one per line
  python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$1"
}

install_deps() { # PYPROJECT
  if [[ $SKIP_INSTALL == 1 ]]; then
    "$PY" -c "import $IMPORTS" || die "$PY cannot import $IMPORTS (and FLEET_SKIP_INSTALL=1)"
    log "python: $PY has the dependencies"
    return
  fi
  if ! python3 -c 'import venv, ensurepip, tomllib' 2>/dev/null; then
    log "installing python3 and python3-venv"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
  fi
  local want
  want=$(deps "$1" | sha256sum | cut -c1-64)
  if [[ -x $PY && -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
    log "python: dependencies already installed (image or earlier boot)"
    return
  fi
  log "python: installing the dependencies into $VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  local pkgs
  mapfile -t pkgs < <(deps "$1")
  "$PY" -m pip install -q "${pkgs[@]}"
  "$PY" -c "import $IMPORTS"
  mkdir -p "$(dirname "$STAMP")"
  echo "$want" >"$STAMP"
}

fetch_code() { # the pinned snapshot into $CODE, every file checked against the manifest
  CODE=$WORK_DIR/code/$VERSION
  if [[ -f $CODE/MANIFEST.sha256 ]] && (cd "$CODE" && sha256sum --quiet --strict -c MANIFEST.sha256 >/dev/null 2>&1); then
    log "code $VERSION: already here and verified"
    return
  fi
  mkdir -p "$WORK_DIR/code"
  TOKEN=$(token)
  local tmp sum path n=0
  tmp=$(mktemp -d "$WORK_DIR/code/.incoming-XXXXXX")
  gs_get "code/$VERSION/manifest.sha256" "$tmp/MANIFEST.sha256" || die "no code $VERSION in gs://$BUCKET (fleet sync)"
  [[ $(sha256sum <"$tmp/MANIFEST.sha256" | cut -c1-16) == "$VERSION" ]] ||
    die "the manifest of code $VERSION does not hash to its name; refusing it"
  while read -r sum path; do
    [[ $sum =~ ^[0-9a-f]{64}$ && -n $path && $path != /* && /$path/ != */../* ]] || die "bad manifest line: $sum $path"
    mkdir -p "$tmp/$(dirname "$path")"
    gs_get "code/objects/$sum" "$tmp/$path"
    n=$((n + 1))
  done <"$tmp/MANIFEST.sha256"
  (cd "$tmp" && sha256sum --quiet --strict -c MANIFEST.sha256) ||
    die "the downloaded code does not match its manifest; refusing to run it"
  chmod 755 "$tmp"
  rm -rf "$CODE"
  mv "$tmp" "$CODE"
  log "code $VERSION: $n files downloaded and verified"
}

ship_log() { gs_put "$LOG" "runs/$RUN/logs/$INSTANCE.log" || log "log upload failed"; }

on_term() {
  STOPPING=1
  log "SIGTERM: the platform is stopping this VM; workers give their items back"
  if [[ -n ${WORKER:-} ]]; then kill -TERM "$WORKER" 2>/dev/null || true; fi
}

on_exit() {
  local rc=$?
  trap '' TERM
  if [[ -n ${WORKER:-} ]]; then wait "$WORKER" 2>/dev/null || true; fi
  if [[ -n ${SHIPPER:-} ]]; then kill "$SHIPPER" 2>/dev/null || true; fi
  log "exiting ($rc)"
  if [[ ${STOPPING:-0} == 1 ]]; then
    log "left to the MIG: it recreates a preempted VM, or finishes deleting this one"
  elif [[ -n ${CODE:-} && -f ${CODE}/MANIFEST.sha256 ]]; then
    ship_log # removing this VM starts its shutdown: the log goes up first, then once more if there is time
    (cd "$CODE" && PYTHONPATH=$CODE "$PY" -m fleet.cli leave) ||
      log "could not remove this VM from its MIG; it ends at the template's maxRunDuration"
  else
    log "no code to leave the MIG with; this VM ends at the template's maxRunDuration"
  fi
  ship_log
}

if [[ -n ${FLEET_INSTALL_ONLY:-} ]]; then # image build: Python and the dependencies, nothing else
  install_deps "$FLEET_INSTALL_ONLY"
  exit 0
fi

INSTANCE=$(md instance/name)
BUCKET_URL=$(md instance/attributes/fleet-bucket)
BUCKET=${BUCKET_URL#gs://}
RUN=$(md instance/attributes/fleet-run)
VERSION=$(md instance/attributes/fleet-code-version)
PROCS=$(md instance/attributes/fleet-workers-per-vm)
STANDBY=$(md instance/attributes/fleet-standby)
[[ $VERSION =~ ^[0-9a-f]{16}$ ]] || die "metadata fleet-code-version '$VERSION' is not a code version"
[[ $PROCS =~ ^[0-9]+$ && $STANDBY =~ ^[0-9]+$ ]] || die "metadata fleet-workers-per-vm/fleet-standby must be numbers"
if [[ $PROCS == 0 ]]; then PROCS=$(nproc); fi

mkdir -p "$WORK_DIR/logs"
exec 9>"$WORK_DIR/startup.lock"
flock -n 9 || { log "another startup.sh is running on this VM"; exit 0; }
LOG=$WORK_DIR/logs/$INSTANCE.log
log "VM $INSTANCE: run $RUN, code $VERSION, $PROCS worker(s); log in $LOG and gs://$BUCKET/runs/$RUN/logs/"
exec >>"$LOG" 2>&1
log "VM $INSTANCE boots: run $RUN from $BUCKET_URL, code $VERSION, $PROCS worker(s), $STANDBY standby"

(while sleep "$LOG_INTERVAL"; do ship_log; done) &
SHIPPER=$!
trap on_exit EXIT
trap on_term TERM

fetch_code
install_deps "$CODE/pyproject.toml"
cd "$CODE"
export PYTHONPATH=$CODE
"$PY" -m fleet.cli work --bucket "$BUCKET_URL" --run "$RUN" --procs "$PROCS" --name-prefix "$INSTANCE" \
  --standby "$STANDBY" &
WORKER=$!
rc=0
wait "$WORKER" || rc=$?
if [[ ${STOPPING:-0} == 1 ]]; then wait "$WORKER" || true; fi
log "fleet work finished ($rc)"
WORKER=
exit "$rc"
