"""Code versions and `fleet sync`: a content-addressed snapshot of the code in the bucket.

A snapshot is a manifest in ``sha256sum`` format (``<sha256>  <path>`` per
line, sorted by path) and one object per distinct file content:

    code/<version>/manifest.sha256     the manifest; <version> = its sha256, first 16 hex
    code/objects/<sha256>              a file's bytes, shared by every version that has it

So syncing again uploads only files whose content is new, and a VM can check
what it downloaded with nothing but ``sha256sum --check`` (startup.sh does).
A run pins the version it was planned with, so a fleet never mixes two
versions of the converter in one output.

The files come from the project root: a checkout, or, for a fleet installed from a wheel, the
folder holding the installed packages, with what is no package (startup/, requirements.lock,
pyproject.toml) taken from ``fleet/_data``, where setup.py puts them in the wheel. So an
installed fleet syncs the same tree a checkout does.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Sequence

from fleet.core.layout import CODE_OBJECTS, code_manifest_name as manifest_name, code_object_name
from fleet.core.run import PlanError

MANIFEST = "MANIFEST.sha256"  # the manifest's name inside a downloaded snapshot
_SKIP_DIRS = {"__pycache__", "node_modules"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
DATA = "_data"  # fleet/_data in an installed wheel (setup.py: build_py_with_data)


class CodeError(PlanError):
    """The code on disk or in the bucket is not what it claims to be (a worker reports it and stops)."""


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the project root, '/'-separated
    sha256: str
    size: int


@dataclass(frozen=True)
class SyncResult:
    version: str
    files: int
    uploaded: int
    uploaded_bytes: int
    manifest_created: bool


def project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def data_root() -> str:
    """``fleet/_data``: the project's files that are no package, as an installed wheel holds them."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), DATA)


def installed(root: str | None = None) -> bool:
    """True when root is the folder of an installed fleet (site-packages), not a checkout."""
    root = root or project_root()
    return os.path.isdir(data_root()) and os.path.abspath(root) == project_root()


def locate(rel: str, root: str | None = None) -> str:
    """Where the project's file or folder ``rel`` is on disk: under root, else, for an installed
    fleet, under fleet/_data (startup/startup.sh, requirements.lock...)."""
    root = root or project_root()
    path = os.path.join(root, rel)
    if not os.path.exists(path) and installed(root):
        return os.path.join(data_root(), rel)
    return path


def _is_venv(path: str) -> bool:
    return os.path.exists(os.path.join(path, "pyvenv.cfg"))


def _skipped(name: str) -> bool:
    # Dot-names cover .git, .venv, .fleet state folders, .pytest_cache and editor files.
    return name.startswith(".") or name in _SKIP_DIRS or name.endswith(_SKIP_SUFFIXES)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def code_files(root: str | None = None, *, paths: Sequence[str]) -> list[str]:
    """Files of the snapshot, relative to root, sorted; leaves out VCS folders, venvs and caches.

    ``paths`` (what to take, relative to root) come from the caller: fleet.toml's code_paths or the
    CLI's default, so this module knows nothing of the configuration."""
    return sorted(_files(root or project_root(), paths))


def _files(root: str, paths: Sequence[str]) -> dict[str, str]:
    """The snapshot's files: path in the manifest -> path on disk (see ``locate``)."""
    found: dict[str, str] = {}
    data = os.path.abspath(data_root())
    for top in paths:
        top = os.path.normpath(top).replace(os.sep, "/")
        start = locate(top, root)
        if os.path.isfile(start):
            found[top] = start
            continue
        if not os.path.isdir(start):
            continue  # a project without e.g. startup/ still syncs
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = sorted(
                d
                for d in dirnames
                if not _skipped(d)
                and not _is_venv(os.path.join(dirpath, d))
                and os.path.abspath(os.path.join(dirpath, d)) != data
            )
            for fn in filenames:
                full = os.path.join(dirpath, fn)
                if _skipped(fn) or not os.path.isfile(full):
                    continue
                found[top + "/" + os.path.relpath(full, start).replace(os.sep, "/")] = full
    for rel in found:
        if any(c in rel for c in "\n\r\\") or rel.startswith("/") or ".." in rel.split("/"):
            raise CodeError(f"{rel!r}: a file name that cannot go into a manifest")
    return found


def snapshot(root: str | None = None, *, paths: Sequence[str]) -> list[Entry]:
    files = _files(root or project_root(), paths)
    return [Entry(rel, sha256_file(files[rel]), os.path.getsize(files[rel])) for rel in sorted(files)]


def manifest_bytes(entries: list[Entry]) -> bytes:
    return "".join(f"{e.sha256}  {e.path}\n" for e in sorted(entries, key=lambda e: e.path)).encode()


def version_of(manifest: bytes) -> str:
    return hashlib.sha256(manifest).hexdigest()[:16]


def parse_manifest(data: bytes) -> list[tuple[str, str]]:
    out = []
    for n, line in enumerate(data.decode().splitlines(), 1):
        sha, sep, path = line.partition("  ")
        if (
            not sep
            or len(sha) != 64
            or any(c not in "0123456789abcdef" for c in sha)
            or not path
            or path.startswith("/")
            or ".." in path.split("/")
        ):
            raise CodeError(f"manifest line {n}: not '<sha256>  <relative path>': {line[:80]!r}")
        out.append((sha, path))
    return out


def verify(root: str) -> str:
    """Check every file of a downloaded snapshot against its manifest; return its version."""
    try:
        with open(os.path.join(root, MANIFEST), "rb") as f:
            manifest = f.read()
    except FileNotFoundError:
        raise CodeError(f"{root}: no {MANIFEST}; not a synced snapshot") from None
    for sha, path in parse_manifest(manifest):
        full = os.path.join(root, path)
        if not os.path.isfile(full):
            raise CodeError(f"{full}: listed in {MANIFEST} but missing")
        if sha256_file(full) != sha:
            raise CodeError(f"{full}: content does not match its hash in {MANIFEST}; refusing to run it")
    return version_of(manifest)


def code_version(root: str | None = None, *, paths: Sequence[str]) -> str:
    """The version a run pins: the manifest's hash.

    In a downloaded snapshot (it has MANIFEST.sha256) that is the verified
    manifest's hash; in a working tree, the hash of the manifest `fleet sync`
    would upload.
    """
    root = root or project_root()
    if os.path.exists(os.path.join(root, MANIFEST)):
        return verify(root)
    return version_of(manifest_bytes(snapshot(root, paths=paths)))


def check_pinned(pinned: str, root: str | None = None) -> None:
    """Refuse to work on a run pinned to other code; a development tree (no manifest) is trusted."""
    root = root or project_root()
    if not os.path.exists(os.path.join(root, MANIFEST)):
        return
    have = verify(root)
    if have != pinned:
        raise CodeError(f"this code is version {have} ({root}) but the run pins {pinned}; refusing to work on it")


def sync(bucket: str, root: str | None = None, *, paths: Sequence[str], threads: int = 16) -> SyncResult:
    """Upload the files the bucket lacks (in parallel), then the manifest, create-only."""
    from fleet.core.store import PreconditionFailed, open_store

    root = root or project_root()
    files = _files(root, paths)
    entries = [Entry(rel, sha256_file(files[rel]), os.path.getsize(files[rel])) for rel in sorted(files)]
    if not entries:
        raise CodeError(f"{root}: no files under {', '.join(paths)}")
    manifest = manifest_bytes(entries)
    version = version_of(manifest)
    store = open_store(bucket)
    have = {b.name[len(CODE_OBJECTS) :] for b in store.list(CODE_OBJECTS)}
    new: dict[str, str] = {}
    for e in entries:
        if e.sha256 not in have:
            new.setdefault(e.sha256, files[e.path])
    if new:
        _upload(store, new, threads)
    created = True
    try:
        store.write(manifest_name(version), manifest, if_generation_match=0)
    except PreconditionFailed:
        created = False
        if store.read(manifest_name(version)) != manifest:  # cannot happen unless the bucket was tampered with
            raise CodeError(
                f"{store.url}/{manifest_name(version)} differs from the manifest it is named after"
            ) from None
    return SyncResult(version, len(entries), len(new), sum(os.path.getsize(p) for p in new.values()), created)


def _upload(store, files: dict[str, str], threads: int) -> None:
    """Objects are named by content, so a create-only upload that finds one present is harmless."""
    from fleet.core.store.gcs import GCSStore

    if isinstance(store, GCSStore):
        from google.cloud.storage import transfer_manager

        pairs = [(path, store.bucket.blob(store._full(code_object_name(sha)))) for sha, path in files.items()]
        results = transfer_manager.upload_many(
            pairs, skip_if_exists=True, max_workers=threads, worker_type=transfer_manager.THREAD
        )
        errors = [
            (path, r)
            for (path, _), r in zip(pairs, results)
            if isinstance(r, Exception) and getattr(r, "code", None) != 412
        ]
        if errors:
            path, err = errors[0]
            raise CodeError(f"uploading {path} to {store.url}: {err}".splitlines()[0])
        return
    for sha, path in files.items():
        store.upload_file(code_object_name(sha), path)


def has_version(bucket: str, version: str) -> bool:
    from fleet.core.store import open_store

    return open_store(bucket).stat(manifest_name(version)) is not None
