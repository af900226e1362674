"""A local folder that behaves like a bucket with generations.

Each object is one file that is never modified in place: a write goes to a
temporary file that is renamed over the name, so a reader holding an open
file sees one whole version. The generation is stored as that file's
``mtime`` (in microseconds, unique and increasing per object), so data and
generation travel together through the rename and a reader needs no lock.
Conditional writes take an ``flock`` on the object's folder for the
check-then-rename.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import time
from stat import S_ISREG
from typing import Iterator

from fleet.core.store.base import Blob, Changed, NotFound, PreconditionFailed, Store, StoreError

_TMP_PREFIX = ".fleet-tmp-"


def file_version(st: os.stat_result) -> str:
    """A local file's ``Blob.version``: what changes when the file is rewritten, truncated or replaced.

    The change time is in it because a user can put an mtime back (``touch -r``, ``os.utime``,
    ``rsync -t``) but not a ctime: a rewrite in place with the mtime restored is still seen.
    (A chmod or a new hard link moves it too: the file then reads as changed, which errs safe.)"""
    return f"size={st.st_size},mtime_ns={st.st_mtime_ns},inode={st.st_ino},ctime_ns={st.st_ctime_ns}"


class LocalStore(Store):
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.url = self.root

    # -- names ---------------------------------------------------------------
    def _path(self, name: str) -> str:
        if not name or name.startswith("/") or "\\" in name or "\x00" in name:
            raise StoreError(f"{self.root}: invalid object name {name!r}")
        parts = name.split("/")
        if any(p in ("", ".", "..") or p.startswith(_TMP_PREFIX) for p in parts):
            raise StoreError(f"{self.root}: object name {name!r} escapes the store or is not a plain path")
        return os.path.join(self.root, *parts)

    def _lock_dir(self, path: str) -> int:
        """The folder of ``path`` locked (flock): the fd to close, in a ``finally`` whose first call
        is ``os.close``. Not a generator context manager: a Shutdown raised inside contextlib's
        calls, between the lock and the ``with`` (or on the way out of it), left the fd open and
        the folder locked, and the worker's next write there (giving its item back) waited forever."""
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _generation(st: os.stat_result) -> int:
        return st.st_mtime_ns // 1000

    def _current(self, path: str) -> int:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return 0
        return self._generation(st) if S_ISREG(st.st_mode) else 0  # a folder is no object

    def _install(self, tmp: str, path: str, old_generation: int) -> int:
        gen = max(time.time_ns() // 1000, old_generation + 1)
        os.utime(tmp, ns=(gen * 1000, gen * 1000))
        if self._generation(os.stat(tmp)) != gen:
            # A file system with coarse timestamps would merge generations and break
            # compare-and-swap silently; refuse instead.
            raise StoreError(f"{self.root}: the file system does not keep microsecond mtimes")
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            raise self._clash(path) from None
        return gen

    def _clash(self, path: str) -> StoreError:
        # A bucket may hold both "a" and "a/b"; a folder cannot. Say so instead of an OSError.
        name = os.path.relpath(path, self.root).replace(os.sep, "/")
        return StoreError(f"{self.root}: {name!r} cannot be both an object and a folder in a local store")

    @staticmethod
    @contextlib.contextmanager
    def _naming(path: str):
        """An OSError of a write (a full disk, a read-only mount) names the object's file,
        not a temporary file or nothing."""
        try:
            yield
        except OSError as e:
            if e.errno is None or e.filename == path:
                raise
            raise type(e)(e.errno, e.strerror, path) from None

    def _tmp_beside(self, path: str) -> str:
        """A name for a temporary file beside ``path`` (its folder made), not yet a file: the caller
        creates it (:meth:`_create`) inside the ``try`` whose ``finally`` removes it, so that a
        signal (a worker's SIGTERM raises Shutdown between any two calls) between the file's
        creation and that ``try`` cannot leave it behind, as mkstemp's own return could. CPython
        runs a signal handler on entering a Python function and after a call returns: so that
        ``finally`` calls ``os.unlink`` first, and a Shutdown met on the way into it (after a
        PreconditionFailed, say) lands once the file is gone."""
        folder = os.path.dirname(path)
        try:
            os.makedirs(folder, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise self._clash(path) from None
        return os.path.join(folder, _TMP_PREFIX + secrets.token_hex(8))

    @staticmethod
    def _create(tmp: str) -> int:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        os.fchmod(fd, 0o644)
        return fd

    # -- reads ---------------------------------------------------------------
    def read(self, name: str, start: int = 0, end: int | None = None, version: str | None = None) -> bytes:
        path = self._path(name)
        try:
            with open(path, "rb") as f:
                if version is not None:
                    self._check_version(name, os.fstat(f.fileno()), version)
                f.seek(start)
                data = f.read() if end is None else f.read(max(0, end - start))
                if version is not None:
                    self._check_version(name, os.fstat(f.fileno()), version)
                return data
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"{name}: no such object in {self.root}") from None

    def read_generation(self, name: str) -> tuple[bytes, int]:
        path = self._path(name)
        try:
            with open(path, "rb") as f:
                gen = self._generation(os.fstat(f.fileno()))
                return f.read(), gen
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"{name}: no such object in {self.root}") from None

    def download_file(
        self, name: str, path: str, start: int = 0, end: int | None = None, version: str | None = None
    ) -> None:
        src = self._path(name)
        try:
            with open(src, "rb") as f, open(path, "wb") as out:
                if version is not None:
                    self._check_version(name, os.fstat(f.fileno()), version)
                f.seek(start)
                remaining = None if end is None else max(0, end - start)
                while remaining is None or remaining > 0:
                    chunk = f.read(1 << 20 if remaining is None else min(1 << 20, remaining))
                    if not chunk:
                        break
                    out.write(chunk)
                    if remaining is not None:
                        remaining -= len(chunk)
                if version is not None:  # rewritten in place while we copied?
                    self._check_version(name, os.fstat(f.fileno()), version)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"{name}: no such object in {self.root}") from None

    def _check_version(self, name: str, st: os.stat_result, version: str) -> None:
        now = file_version(st)
        if now != version:
            raise Changed(f"{os.path.join(self.root, name)}: changed since it was planned ({version} then, {now} now)")

    def stat(self, name: str) -> Blob | None:
        try:
            st = os.stat(self._path(name))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not S_ISREG(st.st_mode):  # a folder is not an object
            return None
        return Blob(name, self._generation(st), st.st_size, file_version(st))

    def list(self, prefix: str = "", start: str | None = None, end: str | None = None) -> Iterator[Blob]:
        # Walk only the deepest folder the prefix names; names outside the prefix or the range are
        # dropped before their stat, so a ranged listing of a big folder stats only its range.
        folder_part = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = os.path.join(self.root, *folder_part.split("/")) if folder_part else self.root
        if folder_part:
            self._path(folder_part)  # validates
        found = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, self.root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            for fn in filenames:
                if fn.startswith(_TMP_PREFIX):
                    continue
                name = rel_dir + fn
                if (
                    not name.startswith(prefix)
                    or (start is not None and name < start)
                    or (end is not None and name >= end)
                ):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, fn))
                except FileNotFoundError:
                    continue
                found.append(Blob(name, self._generation(st), st.st_size, file_version(st)))
        found.sort(key=lambda b: b.name)
        return iter(found)

    # -- writes --------------------------------------------------------------
    def write(
        self, name: str, data: bytes, if_generation_match: int | None = None, *, idempotent: bool = False
    ) -> int:  # a local write has nothing to retry
        path = self._path(name)
        with self._naming(path):
            tmp = self._tmp_beside(path)
            try:
                with open(self._create(tmp), "wb") as f:
                    f.write(data)
                lock = self._lock_dir(path)
                try:
                    current = self._current(path)
                    if if_generation_match is not None and current != if_generation_match:
                        raise PreconditionFailed(
                            f"{name}: generation is {current}, write expected {if_generation_match}"
                        )
                    return self._install(tmp, path, current)
                finally:
                    os.close(lock)
            finally:  # its first call the unlink: see _tmp_beside
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass

    def upload_file(self, name: str, path: str) -> int:
        dest = self._path(name)
        with self._naming(dest):
            tmp = self._tmp_beside(dest)
            try:
                os.close(self._create(tmp))
                shutil.copyfile(path, tmp)
                lock = self._lock_dir(dest)
                try:
                    return self._install(tmp, dest, self._current(dest))
                finally:
                    os.close(lock)
            finally:  # its first call the unlink: see _tmp_beside
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass

    def delete(self, name: str) -> None:
        path = self._path(name)
        if not os.path.isdir(os.path.dirname(path)):
            return  # absent; taking the folder lock would create the folders (or fail on a file)
        lock = self._lock_dir(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno != errno.EISDIR:
                raise
        finally:
            os.close(lock)
