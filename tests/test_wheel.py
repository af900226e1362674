"""fleet as a user installs it: the wheel `pip wheel` builds (with and without a C compiler),
installed outside the checkout, converting the sample and syncing the code a VM boots from.

The wheel must carry the tokenizer's C core (setup.py's optional extension), and it must be the
one that runs; startup/, the Packer template and the lock ride along as fleet/_data, and
`fleet sync` from the installed package uploads them under the paths a VM looks for. Where no
compiler works the build still succeeds and the installed package converts in Python, to the
same bytes. Each wheel is built once per module from a copy of the source (`git ls-files`), so
no build folder or in-place library of the checkout leaks in; it is installed with
`pip install --no-deps --target` and run with PYTHONPATH, the dependencies coming from this
interpreter's environment (nothing is downloaded).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
LIBRARY = "fleet_jobs/text/tokenizers/_ccore.abi3.so"

pytestmark = pytest.mark.skipif(
    not (ROOT / ".git").exists() or not shutil.which("git"), reason="builds from `git ls-files` of a checkout"
)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    site: Path  # the --target folder
    build_log: str
    build_seconds: float


def _build_and_install(tmp: Path, **env: str) -> Installed:
    src = tmp / "src"
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, files):
        if (ROOT / rel).is_file():  # (a file deleted in the work tree is still in the index)
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    environ = {**os.environ, **env}
    t = time.monotonic()
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(tmp / "dist"), "-v"],
        env=environ,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - t
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("fleet-*.whl")
    site = tmp / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\n{wheel.name}: built in {seconds:.1f} s", file=sys.stderr)
    return Installed(wheel, site, built.stdout + built.stderr, seconds)


@pytest.fixture(scope="module")
def with_cc(tmp_path_factory) -> Installed:
    return _build_and_install(tmp_path_factory.mktemp("with-cc"))


@pytest.fixture(scope="module")
def without_cc(tmp_path_factory) -> Installed:
    return _build_and_install(tmp_path_factory.mktemp("without-cc"), CC="/bin/false")


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    from fleet_jobs.text.tokenizers.vocab import train_vocab

    lines = [line for f in ("sample_zh.txt", "sample_en.txt") for line in (CORPUS / f).read_text("utf-8").splitlines()]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(train_vocab(lines, 3000)) + "\n", encoding="utf-8")
    return path


def _run(installed: Installed, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """python -m ARGS with only the installed package on the path, outside the checkout."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLEET_", "PYTEST")) and k not in ("PYTHONPATH", "GOOGLE_APPLICATION_CREDENTIALS")
    }
    environ.update(PYTHONPATH=str(installed.site), **env)
    return subprocess.run([sys.executable, *args], env=environ, cwd=cwd, capture_output=True, text=True, timeout=600)


def _convert(installed: Installed, tmp: Path, vocab: Path, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp / "out"
    done = _run(
        installed,
        tmp,
        "-m",
        "fleet.cli",
        "local",
        str(CORPUS / "sample_en.txt"),
        str(CORPUS / "sample_zh.txt"),
        str(out),
        "--workers",
        "1",
        "--set",
        f"vocab_file={vocab}",
        **env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*.tfrecord*") if p.is_file()}
    assert records
    return done, records


@pytest.fixture(scope="module")
def c_records(with_cc, vocab, tmp_path_factory) -> dict:
    """The sample converted by the installed package with FLEET_NATIVE=1: the C core, or an error."""
    tmp = tmp_path_factory.mktemp("c-run")
    done, records = _convert(with_cc, tmp, vocab, FLEET_NATIVE="1")
    assert "tokenizing in Python" not in done.stderr
    return records


def test_the_wheel_carries_the_c_core_and_what_a_vm_boots_from(with_cc):
    names = set(zipfile.ZipFile(with_cc.wheel).namelist())
    assert with_cc.wheel.name.endswith("-cp310-abi3-linux_x86_64.whl")  # plain C: one wheel for every Python 3
    assert {
        LIBRARY,
        "fleet_jobs/text/tokenizers/wordpiece.c",
        "fleet_jobs/text/tokenizers/unigram.c",
        "fleet/formats/tfrecord/records.c",
        "fleet_jobs/text/tokenizers/native.py",
    } <= names
    data = {
        "startup/startup.sh",
        "startup/shutdown.sh",
        "images/packer/fleet-worker.pkr.hcl",
        "requirements.lock",
        "pyproject.toml",
    }
    with zipfile.ZipFile(with_cc.wheel) as z:
        for rel in data:
            assert z.read(f"fleet/_data/{rel}") == (ROOT / rel).read_bytes(), rel
    assert not [n for n in names if n.startswith(("tests/", "bench/", "corpus/", "startup/", "images/"))]
    assert "the tokenizer's C core was not built" not in with_cc.build_log


def test_installed_outside_the_checkout_the_c_core_runs(with_cc, c_records, tmp_path):
    where = _run(
        with_cc,
        tmp_path,
        "-c",
        "import fleet, fleet_jobs.text.tokenizers.native as n; print(fleet.__file__); print(n.load().path)",
    )
    assert where.returncode == 0, where.stderr
    fleet_file, library = where.stdout.split()
    assert Path(fleet_file).is_relative_to(with_cc.site) and Path(library) == with_cc.site / LIBRARY
    said = _run(with_cc, tmp_path, "-m", "fleet_jobs.text.tokenizers.native")  # what a VM's startup.sh logs
    assert said.returncode == 0 and said.stdout.strip() == str(with_cc.site / LIBRARY), said.stderr


def test_fleet_sync_from_the_installed_package_uploads_what_a_vm_needs(with_cc, tmp_path):
    from fleet.core.codesync import parse_manifest, sha256_file
    from fleet.core.layout import code_manifest_name as manifest_name, code_object_name

    bucket = tmp_path / "bucket"
    done = _run(with_cc, tmp_path, "-m", "fleet.cli", "sync", "--bucket", str(bucket))
    assert done.returncode == 0, done.stdout + done.stderr
    version = done.stdout.strip().splitlines()[-1]
    files = {path: sha for sha, path in parse_manifest((bucket / manifest_name(version)).read_bytes())}
    # The paths startup.sh and the workers look for, as a checkout's sync names them; no fleet/_data twice.
    assert {
        "startup/startup.sh",
        "startup/shutdown.sh",
        "requirements.lock",
        "pyproject.toml",
        LIBRARY,
        "fleet_jobs/text/tokenizers/wordpiece.c",
        "fleet_jobs/text/tokenizers/unigram.c",
        "fleet/formats/tfrecord/records.c",
        "fleet/cli/__init__.py",
    } <= set(files)
    assert not [p for p in files if p.startswith("fleet/_data/") or ".dist-info" in p or p.endswith(".pyc")]
    for rel in ("startup/startup.sh", "requirements.lock"):
        assert files[rel] == sha256_file(str(ROOT / rel))
        assert (bucket / code_object_name(files[rel])).read_bytes() == (ROOT / rel).read_bytes()
    assert files[LIBRARY] == sha256_file(str(with_cc.site / LIBRARY))
    again = _run(with_cc, tmp_path, "-m", "fleet.cli", "sync", "--bucket", str(bucket))
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == version  # the same code: the same version


def test_without_a_compiler_the_install_works_and_converts_in_python_to_the_same_bytes(
    without_cc, c_records, vocab, tmp_path
):
    assert "WARNING: the tokenizer's C core was not built" in without_cc.build_log
    names = zipfile.ZipFile(without_cc.wheel).namelist()
    assert LIBRARY not in names and "fleet/_data/startup/startup.sh" in names
    said = _run(without_cc, tmp_path, "-m", "fleet_jobs.text.tokenizers.native")
    assert said.returncode == 1 and said.stderr.startswith(
        f"fleet: no _ccore.abi3.so in {without_cc.site}/fleet_jobs/text"
    )
    done, records = _convert(without_cc, tmp_path, vocab)
    assert "tokenizing in Python, about 3x slower" in done.stderr
    assert records == c_records


def test_installed_it_plans_and_dry_runs_a_launch_from_the_code_it_synced(
    with_cc, vocab, fake_gcs, gcs_bucket, tmp_path
):
    """The GCP path of an installed fleet, up to the requests `fleet launch` would send (no credentials:
    nothing reaches Google; the bucket is fake-gcs-server): the VMs' startup script is the installed one."""
    from fleet.core.store import open_store

    bucket = f"gs://{gcs_bucket}"
    store = open_store(bucket)
    store.upload_file("corpus/sample_en.txt", str(CORPUS / "sample_en.txt"))
    store.upload_file("vocab.txt", str(vocab))
    env = {
        "FLEET_CONFIG": str(tmp_path / "fleet.toml"),
        "HOME": str(tmp_path / "home"),
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
    }

    def fleet(*args: str, **more: str) -> subprocess.CompletedProcess:
        done = _run(with_cc, tmp_path, "-m", "fleet.cli", *args, **env, **more)
        assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
        return done

    fleet(
        "init",
        "--project",
        "fleet-test-1",
        "--zone",
        "us-central1-a",
        "--bucket",
        bucket,
        "--service-account",
        "fleet-worker@fleet-test-1.iam.gserviceaccount.com",
    )
    version = fleet("sync").stdout.strip().splitlines()[-1]
    fleet(
        "plan",
        "--run",
        "wheel",
        "--job",
        "electra_zh_en",
        "--input",
        f"{bucket}/corpus/sample_en.txt",
        "--output",
        f"{bucket}/out/",
        "--set",
        f"vocab_file={bucket}/vocab.txt",
    )
    dry = fleet("launch", "--run", "wheel", "--workers", "1", "--dry-run", NO_GCE_CHECK="true").stdout
    assert "POST https://compute.googleapis.com/compute/v1/projects/fleet-test-1/" in dry
    assert version in dry and "fleet worker VM startup script" in dry
