"""startup/startup.sh as a local process against fake-gcs-server, a metadata server and the Compute stand-in.

The happy path (work, then leave the MIG) runs in tests/test_gcp_e2e.py; here: the
checks that keep a VM from running code that is not what the run pinned.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from fleet.core.codesync import parse_manifest, sync
from fleet.core.layout import code_manifest_name as manifest_name, code_object_name
from fleet.gce.boots import boot_records
from fleet.gce.config import DEFAULT_CODE_PATHS
from fleet.core.layout import log_name, vm_paths_text
from fleet.core.run import PlanRequest, plan
from fleet.core.store import NotFound, open_store
from tests.standins.compute import ComputeStandin
from tests.standins.faultproxy import FaultProxy
from tests.standins.metadata import Instance, MetadataServer

ROOT = Path(__file__).resolve().parent.parent
STARTUP = ROOT / "startup" / "startup.sh"


@dataclass
class Boot:
    returncode: int
    log: str  # the VM's log, as streamed to the bucket ("" if it never got there)
    disk: Path
    stdout: str  # what the guest agent's runner reads: it goes to the journal and the serial console


@pytest.fixture
def vm(fake_gcs, gcs_bucket, tmp_path):
    bucket = f"gs://{gcs_bucket}"
    version = sync(bucket, paths=DEFAULT_CODE_PATHS).version
    standin = ComputeStandin("fleet-test-1").start()
    servers = []

    def boot(
        run: str,
        code_version: str = version,
        disk: Path | None = None,
        drop: tuple[str, ...] = (),
        during=None,
        **extra_env: str,
    ) -> Boot:
        attributes = {
            "fleet-bucket": bucket,
            "fleet-run": run,
            "fleet-code-version": code_version,
            "fleet-workers-per-vm": "1",
            "fleet-standby": "1",
            "fleet-paths": vm_paths_text(run),
            "created-by": "projects/1/zones/us-central1-a/instanceGroupManagers/fleet-x",
        }
        attributes = {k: v for k, v in attributes.items() if k not in drop}
        server = MetadataServer(Instance("fleet-x-abcd", "fleet-test-1", "us-central1-a", attributes)).start()
        servers.append(server)
        disk = disk or tmp_path / f"disk{len(servers)}"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(
            FLEET_PYTHON=sys.executable,
            FLEET_SKIP_INSTALL="1",
            FLEET_WORK_DIR=str(disk),
            FLEET_RUN_AS="",
            FLEET_LOG_INTERVAL="1",
            GCE_METADATA_HOST=server.host,
            FLEET_COMPUTE_ENDPOINT=standin.url,
        )
        env.pop("FLEET_NATIVE", None)
        env.update(extra_env)
        # As GCE's runner does: stdout and stderr on one pipe, read to its end, and only then the script reaped.
        proc = subprocess.Popen(
            ["bash", str(STARTUP)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            if during is not None:
                during(proc)  # (e.g. the platform stopping the VM mid-boot)
            try:
                stdout, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail("startup.sh's stdout never ended: the runner would wait forever")
        finally:
            proc.kill()
        try:
            log = open_store(bucket).read(log_name(run, "fleet-x-abcd")).decode()
        except NotFound:
            log = ""
        return Boot(proc.returncode, log, disk, stdout.decode(errors="replace"))

    try:
        boot.standin = standin
        yield bucket, version, boot
    finally:
        standin.stop()
        for s in servers:
            s.stop()
    assert standin.violations == []  # startup.sh's REST calls are ones the published API accepts


def plan_pinned_to(bucket: str, run: str, code_version: str) -> None:
    plan(
        bucket,
        PlanRequest(
            run=run,
            job="tests.helpers.linejob:JOB",
            inputs=[str(ROOT / "corpus" / "sample_en.txt")],
            output=f"{bucket}/out-{run}",
            code_version=code_version,
            item_bytes=200_000,
        ),
    )


def test_syntax_and_strict_mode():
    assert subprocess.run(["bash", "-n", str(STARTUP)]).returncode == 0
    code = [line for line in STARTUP.read_text().splitlines() if line and not line.startswith("#")]
    assert code[:2] == ["set -euo pipefail", "umask 022"]  # strict before anything runs; nothing world-writable


def test_a_worker_refuses_a_run_pinned_to_other_code_and_a_second_boot_reuses_the_code(vm):
    bucket, version, boot = vm
    plan_pinned_to(bucket, "other", "0123456789abcdef")
    first = boot("other")
    assert first.returncode == 1, first.log
    assert "this boot failed: fleet work exited 2: " in first.log
    assert f"code {version}: " in first.log and "downloaded and verified" in first.log
    assert f"this code is version {version}" in first.log and "the run pins 0123456789abcdef; refusing" in first.log
    assert "fleet-x-abcd: fleet-x is already deleted, and this VM with it" in first.log  # no such MIG in the stand-in
    # The tokenizer's C core came with the code (built by this checkout's pip install -e .): no compiler at boot.
    assert f"tokenizer C core: {first.disk / 'code' / version}/fleet_jobs/text/tokenizers/_ccore." in first.log
    again = boot("other", disk=first.disk)  # a reboot: same disk
    assert again.returncode == 1
    assert f"code {version}: already here and verified" in again.log
    files = [p for p in first.disk.rglob("*") if not p.is_symlink()]
    assert files and not [p for p in files if p.stat().st_mode & 0o002]  # nothing world-writable


def test_code_without_the_c_core_is_no_reason_to_stop(vm, tmp_path):
    """The C core is only speed: code synced from where no compiler built it (or from another
    kind of machine) logs why and runs the workers in Python."""
    bucket, version, boot = vm
    tree = tmp_path / "tree"
    for top in DEFAULT_CODE_PATHS:
        src = ROOT / top
        if src.is_dir():
            shutil.copytree(src, tree / top, ignore=shutil.ignore_patterns("__pycache__", "_ccore*"))
        else:
            shutil.copy2(src, tree / top)
    bare = sync(bucket, str(tree), paths=DEFAULT_CODE_PATHS).version
    assert bare != version
    plan_pinned_to(bucket, "nocc", "0123456789abcdef")
    result = boot("nocc", code_version=bare)
    assert f"tokenizer C core: no _ccore.abi3.so in {result.disk / 'code' / bare}/fleet_jobs/text" in result.log
    assert "the tokenizer's C core is unavailable: workers tokenize in Python" in result.log
    assert "the run pins 0123456789abcdef; refusing" in result.log  # the workers did start
    assert "this boot failed: fleet work exited 2: " in result.log  # (for that reason, not the C core)


def test_a_tampered_code_object_is_refused(vm):
    bucket, version, boot = vm
    store = open_store(bucket)
    sha = dict((path, sha) for sha, path in parse_manifest(store.read(manifest_name(version))))["fleet/core/spawner.py"]
    store.write(code_object_name(sha), b"raise SystemExit('not the real spawner')\n")
    plan_pinned_to(bucket, "tampered", version)
    result = boot("tampered")
    assert result.returncode == 1
    assert "the downloaded code does not match its manifest; refusing to run it" in result.log
    assert "fleet work" not in result.log and not (result.disk / "code" / version).exists()


def test_a_tampered_manifest_is_refused(vm):
    bucket, version, boot = vm
    store = open_store(bucket)
    manifest = store.read(manifest_name(version))
    store.write(manifest_name(version), manifest.replace(b"fleet/cli/commands.py", b"fleet/cli2.py"))
    plan_pinned_to(bucket, "badmanifest", version)
    result = boot("badmanifest")
    assert result.returncode == 1
    assert f"the manifest of code {version} does not hash to its name; refusing it" in result.log
    assert hashlib.sha256(manifest).hexdigest()[:16] == version


def test_unreadable_metadata_still_leaves_the_mig(vm):
    """Before anything that can fail, startup.sh arms its way out: curl and the metadata token."""
    bucket, version, boot = vm
    plan_pinned_to(bucket, "nomd", version)
    result = boot("nomd", drop=("fleet-code-version",))
    assert result.returncode == 1
    assert "this boot failed: metadata fleet-code-version is unreadable" in result.log
    removals = [c for c in boot.standin.calls if c.path.endswith("/instanceGroupManagers/fleet-x/deleteInstances")]
    assert len(removals) == 1 and removals[0].auth.startswith("Bearer ya29.standin-")
    assert removals[0].body == {
        "instances": ["zones/us-central1-a/instances/fleet-x-abcd"],
        "skipInstancesOnValidationError": True,
    }
    record = json.loads(open_store(bucket).read(next(b.name for b in open_store(bucket).list("runs/nomd/boots/"))))
    assert record["outcome"] == "failed" and record["instance"] == "fleet-x-abcd"


def test_shutdown_script_syntax():
    assert subprocess.run(["bash", "-n", str(ROOT / "startup" / "shutdown.sh")]).returncode == 0


def test_every_line_reaches_stdout_for_the_journal_and_the_serial_console_when_the_bucket_refuses(vm, fake_gcs):
    """GCE's runner writes the script's stdout to the journal and the serial console. Before, after
    `exec >>"$LOG"` nothing went there: with the bucket refusing (a 403 to every request, as for a
    wrong name or a missing grant), no boot record and no log reached anyone."""
    bucket, version, boot = vm
    plan_pinned_to(bucket, "refused", version)
    with FaultProxy(fake_gcs.url, forbid=lambda method, path: True) as proxy:
        result = boot("refused", STORAGE_EMULATOR_HOST=proxy.url)
    assert result.returncode == 1 and result.log == "" and proxy.counts["403"] >= 3
    lines = result.stdout.splitlines()
    on_disk = (result.disk / "logs" / "startup.log").read_text().splitlines()
    assert lines == on_disk  # every line of the log, in order, and nothing else
    text = result.stdout
    assert "startup: VM fleet-x-abcd (boot " in text and "boot record upload failed" in text
    assert "bucket request failed: HTTP 403" in text  # (said on stderr)
    assert f"startup: error: code {version}: gs://" in text and "refused this VM (HTTP 403)" in text
    assert "this boot failed: code " in text
    assert "fleet-x is already deleted, and this VM with it" in text and "log upload failed" in text  # the way out, too


def test_a_bucket_outage_while_the_vm_fetches_its_code_is_waited_out(vm, fake_gcs):
    """Before, every bucket request of startup.sh gave up with curl's own retries (about 31 s): a VM
    that booted in an outage (Spot VMs are recreated at any time) failed its boot, counted towards
    the run's stop and left its MIG for good, with "no code ... (fleet sync)" as the reason (seen in
    CI: a VM still booting when tests/test_gcp_e2e_outage.py began its outage). Now it waits for
    the bucket as the workers do, jittered, up to FLEET_OUTAGE_MINUTES."""
    bucket, version, boot = vm
    plan_pinned_to(bucket, "outage", "0123456789abcdef")  # (workers that start refuse the run: a quick end)
    began: list[float] = []
    # curl's own retries cut from 5 (~31 s) to 1 (1 s), and the outage from 40 s to 10 s with them: still ten
    # times longer than curl alone waits, so the old gs() fails this boot; the 30 min limit is the default.
    curl_retries, outage_s = 1, 10

    def down(method: str, path: str) -> bool:  # every request for outage_s from the first read of the code
        if not began and "code" in urllib.parse.unquote(path):
            began.append(time.time())
        return bool(began) and time.time() < began[0] + outage_s

    with FaultProxy(fake_gcs.url, script=[(down, "503", 10**9)]) as proxy:
        result = boot("outage", STORAGE_EMULATOR_HOST=proxy.url, FLEET_CURL_RETRIES=str(curl_retries))
    assert proxy.counts["503"] >= 6
    assert "the bucket is unreachable (HTTP 503): waiting for it, up to 30 min" in result.log
    assert f"code {version}: " in result.log and "downloaded and verified" in result.log, result.log
    assert "the run pins 0123456789abcdef; refusing" in result.log  # the workers started, after the outage
    records = boot_records(open_store(bucket), "outage")
    assert len(records) == 1 and "fleet work exited 2" in records[0].reason


TRANSIENT = ["000", "408", "429", "500", "502", "503", "504"]  # no answer, or what an outage answers
FINAL = ["200", "204", "400", "401", "403", "404", "412"]


def _gs_with_answers(tmp_path: Path, answers: list[str], outage_s: int = 1800) -> tuple[int, int]:
    """startup.sh's gs() alone, with curl answering ``answers`` in turn and sleep taking no time:
    (its exit status, how many requests it made)."""
    body = STARTUP.read_text()
    function = body[body.index("\ngs() {") + 1 :]
    function = function[: function.index("\n}\n") + 3]
    (tmp_path / "answers").write_text("\n".join(answers) + "\n")
    script = f"""
set -euo pipefail
log() {{ :; }}
sleep() {{ :; }}
curl() {{  # the next answer: its HTTP code on stdout; no answer (000) is curl's exit status 7
  local n code
  n=$(cat {tmp_path}/n 2>/dev/null || echo 0)
  echo $((n + 1)) >{tmp_path}/n
  code=$(sed -n "$((n + 1))p" {tmp_path}/answers)
  printf '%s' "$code"
  [[ $code != 000 ]] || return 7
}}
OUTAGE_S={outage_s}
CURL_RETRIES=5
{function}
rc=0
gs /dev/null https://bucket.example/o || rc=$?
echo "$rc $(cat {tmp_path}/n)"
"""
    (tmp_path / "n").unlink(missing_ok=True)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    rc, calls = out.stdout.split()
    return int(rc), int(calls)


@settings(max_examples=60)
@given(outage=st.lists(st.sampled_from(TRANSIENT), max_size=12), final=st.sampled_from(FINAL))
def test_a_bucket_request_waits_out_any_outage_and_stops_at_the_first_real_answer(tmp_path_factory, outage, final):
    """The invariant the boot's failure in an outage broke: whatever mix of no answers, 408, 429 and
    5xx comes first, and however long (within FLEET_OUTAGE_MINUTES), a bucket request of startup.sh
    ends with the first real answer: success on a 2xx, failure at once on any other (a 404, a 403),
    never sooner and never a request more."""
    rc, calls = _gs_with_answers(tmp_path_factory.mktemp("gs"), [*outage, final])
    assert calls == len(outage) + 1
    assert (rc == 0) == final.startswith("2")


def test_a_bucket_request_gives_up_an_outage_at_its_limit(tmp_path):
    rc, calls = _gs_with_answers(tmp_path, ["503"] * 5 + ["200"], outage_s=0)
    assert (rc, calls) == (1, 1)  # (FLEET_OUTAGE_MINUTES=0: the first outage answer is the last)


def test_an_upload_rides_out_the_503s_that_curl_retries_itself(tmp_path):
    """gs_put with the real curl against a server that answers 503 twice: curl's own retries get it
    through. It used to send the answer to /dev/null, which curl cannot truncate before a retry
    ("curl: (23) Failed to truncate file"): an upload in an outage (a log, a boot record) failed at once."""
    import http.server
    import threading

    seen: list[bytes] = []

    class Bucket(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(self.rfile.read(int(self.headers["Content-Length"])))
            status = 503 if len(seen) <= 2 else 200
            body = b'{"error": "try again"}' if status == 503 else b'{"name": "logs/vm.log"}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Bucket)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    body = STARTUP.read_text()
    functions = ""
    for name in ("gs", "gs_put"):
        part = body[body.index(f"\n{name}() {{") + 1 :]
        functions += part[: part.index("\n}\n") + 3]
    (tmp_path / "log.txt").write_text("the VM's log\n")
    script = f"""
set -euo pipefail
log() {{ echo "$*" >&2; }}
token() {{ echo t; }}
GCS=http://127.0.0.1:{server.server_address[1]} BUCKET=b WORK_DIR={tmp_path} OUTAGE_S=0 CURL_RETRIES=3
{functions}
gs_put {tmp_path}/log.txt logs/vm.log
"""
    try:
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    assert seen == [b"the VM's log\n"] * 3 and "(23)" not in out.stderr
    assert not list(tmp_path.glob("put.*"))  # its answer's file is gone


def test_a_bucket_that_stays_unreachable_fails_the_boot_after_the_outage_limit_saying_so(vm, fake_gcs):
    bucket, version, boot = vm
    plan_pinned_to(bucket, "gone", version)
    code = lambda method, path: "code" in urllib.parse.unquote(path)  # noqa: E731
    # The limit's value is not the point here: 6 s, and curl's own retries 2 (3 s) instead of 5 (31 s). The first
    # check of the limit comes after curl's 3 s: a second curl (3 requests more) before the boot gives up.
    with FaultProxy(fake_gcs.url, script=[(code, "503", 10**9)]) as proxy:
        result = boot("gone", STORAGE_EMULATOR_HOST=proxy.url, FLEET_OUTAGE_MINUTES="0.1", FLEET_CURL_RETRIES="2")
    assert result.returncode == 1 and proxy.counts["503"] >= 6
    assert "the bucket is still unreachable (HTTP 503) after " in result.log
    assert f"this boot failed: code {version}: gs://" in result.log and "is unreachable (HTTP 503)" in result.log


def test_a_reboot_sends_only_its_own_lines(vm):
    bucket, version, boot = vm
    plan_pinned_to(bucket, "twice", "0123456789abcdef")
    first = boot("twice")
    again = boot("twice", disk=first.disk)  # the same disk: the log file goes on
    assert "downloaded and verified" in first.stdout and "downloaded and verified" not in again.stdout
    assert "already here and verified" in again.stdout
    assert (first.disk / "logs" / "startup.log").read_text() == first.stdout + again.stdout


def _own_action(page: dict, instance: str) -> str:
    """startup.sh's own_action on a listManagedInstances page, run by bash."""
    lines = STARTUP.read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("own_action() {")))
    end = lines.index("}", start)
    body = "\n".join(lines[start : end + 1])
    proc = subprocess.run(
        ["bash", "-c", f"{body}\nown_action"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"], "INSTANCE": instance, "API_OUT": json.dumps(page, indent=1)},
    )
    return proc.stdout.strip()


def test_a_vm_finds_its_own_action_in_its_migs_list_whatever_the_order_of_the_fields():
    """The last VM out of an unfinished run waits until its own deletion shows (DELETING, or gone) before it
    counts the VMs left: its entry is told by its name, whatever order GCE gives the fields in, and
    beside nested objects (version, lastAttempt's errors) and names that share a prefix with it."""
    from hypothesis import given, settings, strategies as st

    actions = st.sampled_from(["NONE", "CREATING", "DELETING", "RECREATING", "VERIFYING"])

    @settings(max_examples=25, deadline=None)
    @given(st.lists(actions, min_size=1, max_size=6), st.randoms(use_true_random=False), st.booleans())
    def check(states, rnd, present):
        names = [f"fleet-r-{i}" for i in range(len(states))] + ["fleet-r-0x"]
        entries = []
        for name, state in zip(names, states + ["NONE"]):
            fields = [
                ("instance", f"https://www.googleapis.com/compute/v1/projects/p/zones/z/instances/{name}"),
                ("currentAction", state),
                ("id", "123"),
                ("instanceStatus", "RUNNING"),
                ("version", {"instanceTemplate": "global/instanceTemplates/t"}),
                ("lastAttempt", {"errors": {"errors": [{"code": "X", "message": f"about {name}"}]}}),
            ]
            rnd.shuffle(fields)
            entries.append(dict(fields))
        me = names[0] if present else "fleet-r-9"
        page = {"managedInstances": entries}
        assert _own_action(page, me) == (states[0] if present else "")

    check()


def test_a_boot_whose_worker_finished_the_run_is_done_even_if_the_vm_is_being_deleted(vm, tmp_path):
    """The first VM to find the run finished deletes every VM of the MIG, and the others' shutdown.sh
    marks them stopping while their own workers are finishing too. Before, such a boot was recorded
    "stopped" although its worker exited 0 with the run drained (seen in CI: one of three boots)."""
    bucket, _, boot = vm
    version = sync(bucket, paths=(*DEFAULT_CODE_PATHS, "tests/__init__.py", "tests/helpers")).version  # + linejob
    plan_pinned_to(bucket, "racing", version)

    def deleted_while_working(proc):
        deadline = time.time() + 60
        while not (disk / "work.pgid").exists():  # the workers started (startup.sh removed old marks before)
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.01)
        (disk / "stopping").touch()  # shutdown.sh's first step, before its SIGTERM

    disk = tmp_path / "racing-disk"
    result = boot("racing", version, disk=disk, during=deleted_while_working)
    assert "fleet work finished (0)" in result.log and (disk / "report" / "drained").exists()
    records = boot_records(open_store(bucket), "racing")
    assert [r.outcome for r in records] == ["done"], result.log
    assert "this boot done" in result.log and "left to the MIG" not in result.log
