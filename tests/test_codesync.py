"""Code snapshots: what goes in, content addressing, and refusing code that is not what it claims."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.core.layout import code_manifest_name as manifest_name, code_object_name
from fleet.core.codesync import (
    MANIFEST,
    CodeError,
    check_pinned,
    code_files,
    code_version,
    manifest_bytes,
    parse_manifest,
    snapshot,
    sync,
    verify,
    version_of,
)
from fleet.gce.config import DEFAULT_CODE_PATHS
from fleet.core.store import open_store

PATHS = ["fleet", "fleet_jobs", "startup", "pyproject.toml"]


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "project"
    for rel, text in {
        "fleet/__init__.py": "",
        "fleet/a.py": "A = 1\n",
        "fleet/sub/b.py": "B = 2\n",
        "fleet/sub/data.json": "{}\n",
        "fleet_jobs/__init__.py": "",
        "startup/startup.sh": "#!/bin/bash\n",
        "pyproject.toml": "[project]\nname = 'x'\n",
        # left out:
        "fleet/__pycache__/a.cpython-311.pyc": "junk",
        "fleet/a.pyc": "junk",
        "fleet/.hidden": "x",
        "fleet/x.egg-info/PKG-INFO": "x",
        "fleet_jobs/venv/pyvenv.cfg": "home = /usr\n",
        "fleet_jobs/venv/lib/site.py": "x",
        "fleet_jobs/.git/HEAD": "ref",
        "out/part-00000.tfrecord": "x",
        "README.md": "not code",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_snapshot_holds_code_only(tree):
    assert code_files(str(tree), paths=PATHS) == [
        "fleet/__init__.py",
        "fleet/a.py",
        "fleet/sub/b.py",
        "fleet/sub/data.json",
        "fleet_jobs/__init__.py",
        "pyproject.toml",
        "startup/startup.sh",
    ]


def test_version_is_the_hash_of_a_sha256sum_manifest(tree):
    entries = snapshot(str(tree), paths=PATHS)
    manifest = manifest_bytes(entries)
    assert code_version(str(tree), paths=PATHS) == version_of(manifest) == hashlib.sha256(manifest).hexdigest()[:16]
    first = manifest.decode().splitlines()[0]
    assert first == f"{hashlib.sha256(b'').hexdigest()}  fleet/__init__.py"  # what `sha256sum --check` reads
    assert parse_manifest(manifest) == [(e.sha256, e.path) for e in entries]
    (tree / "fleet" / "a.py").write_text("A = 2\n")
    assert code_version(str(tree), paths=PATHS) != version_of(manifest)


@pytest.mark.parametrize(
    "line", ["abc  x.py", "f" * 64 + "  /etc/passwd", "f" * 64 + "  a/../../x", "f" * 64 + " x.py"]
)
def test_a_bad_manifest_line_is_refused(line):
    with pytest.raises(CodeError, match="manifest line 1"):
        parse_manifest(line.encode() + b"\n")


def test_sync_uploads_only_new_content(tree, store_url):
    first = sync(store_url, str(tree), paths=PATHS)
    assert first.files == 7 and first.manifest_created
    assert first.uploaded == 6  # two empty __init__.py files share one object
    store = open_store(store_url)
    assert store.read(manifest_name(first.version)) == manifest_bytes(snapshot(str(tree), paths=PATHS))
    for sha, path in parse_manifest(store.read(manifest_name(first.version))):
        assert store.read(code_object_name(sha)) == (tree / path).read_bytes()
    again = sync(store_url, str(tree), paths=PATHS)
    assert (again.version, again.uploaded, again.manifest_created) == (first.version, 0, False)
    (tree / "fleet" / "sub" / "b.py").write_text("B = 3\n")
    third = sync(store_url, str(tree), paths=PATHS)
    assert third.version != first.version and third.uploaded == 1 and third.uploaded_bytes == 6
    assert store.stat(manifest_name(first.version)) is not None  # a running fleet's version stays


def download(store_url: str, version: str, dest: Path) -> None:
    """What startup.sh does, in Python: manifest, then every object by hash."""
    store = open_store(store_url)
    manifest = store.read(manifest_name(version))
    for sha, path in parse_manifest(manifest):
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes(store.read(code_object_name(sha)))
    (dest / MANIFEST).write_bytes(manifest)


def test_a_snapshot_verifies_and_refuses_tampering(tree, tmp_path, store_url):
    result = sync(store_url, str(tree), paths=PATHS)
    snap = tmp_path / "snap"
    download(store_url, result.version, snap)
    assert verify(str(snap)) == result.version == code_version(str(snap), paths=PATHS)
    check_pinned(result.version, str(snap))
    with pytest.raises(CodeError, match="run pins 0123456789abcdef; refusing"):
        check_pinned("0123456789abcdef", str(snap))
    (snap / "fleet" / "a.py").write_text("A = 'evil'\n")
    with pytest.raises(CodeError, match=r"fleet/a.py: content does not match its hash"):
        check_pinned(result.version, str(snap))
    os.remove(snap / "fleet" / "a.py")
    with pytest.raises(CodeError, match="listed in MANIFEST.sha256 but missing"):
        verify(str(snap))


def test_a_working_tree_is_trusted_and_has_no_manifest(tree):
    check_pinned("anything", str(tree))  # development: no snapshot, nothing to check against
    with pytest.raises(CodeError, match="not a synced snapshot"):
        verify(str(tree))


def test_this_repository_syncs_without_tests_or_venv():
    root = Path(__file__).resolve().parent.parent
    files = code_files(str(root), paths=DEFAULT_CODE_PATHS)
    assert "fleet/core/codesync.py" in files and "startup/startup.sh" in files and "pyproject.toml" in files
    assert not [f for f in files if f.startswith((".venv", "tests/", ".git")) or "__pycache__" in f]


def test_the_worker_side_reads_no_configuration():
    """codesync is what a worker checks its code with: its paths come from its caller (the CLI),
    and importing it loads nothing of fleet.toml's module."""
    code = "import sys, fleet.core.codesync; print('fleet.gce.config' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
