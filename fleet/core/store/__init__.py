"""One small interface over an object store with generations.

Everything the fleet coordinates goes through these few calls, so the lease
protocol can be proven on a local folder and run unchanged on Cloud Storage.
Generations are positive integers that change on every write of an object;
``if_generation_match=0`` means "only if the object does not exist".
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from typing import Iterator


class StoreError(Exception):
    """A store call failed in a way the caller should report, not retry."""


class NotFound(StoreError):
    pass


class PreconditionFailed(StoreError):
    """The object's generation was not the one the write was conditioned on."""


class Forbidden(StoreError):
    pass


class BucketNotFound(NotFound):
    """The bucket itself does not exist (not just the object)."""


class Unavailable(StoreError):
    """The store did not answer, or answered 408, 429 or 5xx, beyond the client's own retries: an
    outage, which passes. Nothing is known to be wrong with the call, so a worker waits it out
    (fleet.core.processes) instead of spending an attempt or leaving."""


class Changed(StoreError):
    """The object is no longer the version the caller pinned (rewritten, truncated, replaced)."""


@dataclass(frozen=True)
class Blob:
    name: str
    generation: int
    size: int
    # What identifies this content for a reader that must notice a change: on GCS the
    # generation, in a local folder size, mtime and inode (a copy that keeps the mtime
    # is still a new inode). Compared as an opaque string.
    version: str = field(default="", compare=False)


class Store(abc.ABC):
    """An object store with generation preconditions (GCS semantics)."""

    url: str

    @abc.abstractmethod
    def read(self, name: str, start: int = 0, end: int | None = None, version: str | None = None) -> bytes:
        """Bytes [start, end) of an object; raises NotFound, and Changed when ``version`` (a
        ``Blob.version``) is given and the object is no longer that version."""

    @abc.abstractmethod
    def read_generation(self, name: str) -> tuple[bytes, int]:
        """Whole object and the generation those bytes belong to; raises NotFound."""

    @abc.abstractmethod
    def write(self, name: str, data: bytes, if_generation_match: int | None = None, *,
              idempotent: bool = False) -> int:
        """Write an object, optionally conditioned; returns the new generation.

        A conditional write is retried on transient errors (a replay that finds its own
        write comes back as PreconditionFailed, which the caller checks). An unconditional
        one is retried only if ``idempotent``: the object has a single writer (a worker's
        heartbeat or log), so replaying it cannot overwrite someone else's newer write.
        """

    @abc.abstractmethod
    def upload_file(self, name: str, path: str) -> int:
        """Upload a local file (large outputs); unconditional, atomic to readers."""

    @abc.abstractmethod
    def download_file(self, name: str, path: str, start: int = 0, end: int | None = None,
                      version: str | None = None) -> None:
        """Copy an object, or bytes [start, end) of it, to a local file.

        With ``version`` (a ``Blob.version`` seen earlier), raises Changed unless the
        bytes copied belong to exactly that version of the object."""

    @abc.abstractmethod
    def stat(self, name: str) -> Blob | None:
        """Size and generation, or None when absent."""

    @abc.abstractmethod
    def list(self, prefix: str = "", start: str | None = None, end: str | None = None) -> Iterator[Blob]:
        """Objects whose names start with prefix, in name order; with ``start``/``end`` (whole
        names, as Cloud Storage's startOffset/endOffset) only names >= start and < end.

        A range is how a worker lists one window of the leases (fleet.core.windows) instead of
        all of them: what a listing hands back, and so what it costs, is bounded by the range."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Delete an object; absent is not an error."""

    def join(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def split_url(url: str) -> tuple[str, str]:
    """'gs://b/p/q' -> ('gs://b', 'p/q'); a local path -> (its folder root, '')."""
    if url.startswith("gs://"):
        rest = url[len("gs://"):]
        bucket, _, prefix = rest.partition("/")
        return f"gs://{bucket}", prefix.strip("/")
    return url, ""


_BUCKET_NAME = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")  # Cloud Storage's bucket naming rules


def open_store(url: str) -> Store:
    """A store for ``gs://bucket`` or a local folder (``file://`` or a plain path)."""
    if url.startswith("gs://"):
        from fleet.core.store.gcs import GCSStore

        bucket, prefix = split_url(url)
        if not _BUCKET_NAME.match(bucket[len("gs://"):]):  # the client would fail on it with an IndexError or a 400
            raise StoreError(f"{url}: not a bucket URL (gs://BUCKET[/PATH], a bucket name of 3-222 lowercase "
                             "letters, digits, '-', '_' and '.')")
        return GCSStore(bucket[len("gs://"):], prefix=prefix)
    from fleet.core.store.local import LocalStore

    if url.startswith("file://"):
        url = url[len("file://"):]
    _check_scheme(url)
    return LocalStore(url)


def _check_scheme(url: str) -> None:
    scheme, sep, _ = url.partition("://")
    if sep and scheme.isalnum():  # s3://, http://...: never a local folder named "s3:"
        raise StoreError(f"{url}: unsupported URL scheme {scheme}:// (use gs://BUCKET[/PATH] or a local path)")


def locate(url: str) -> tuple[Store, str]:
    """The store holding one object and its name there: 'gs://b/x/v.txt' or '/d/v.txt'."""
    if url.startswith("gs://"):
        bucket, name = split_url(url)
        return open_store(bucket), name
    import os

    if not url.startswith("file://"):
        _check_scheme(url)
    path = os.path.abspath(url[len("file://"):] if url.startswith("file://") else url)
    return open_store(os.path.dirname(path)), os.path.basename(path)


def read_url(url: str) -> bytes:
    """A small object (a vocab, a config) named by URL or local path."""
    store, name = locate(url)
    return store.read(name)


from fleet.core.store.file import StoreFile  # noqa: E402,F401  (a reader over the Store above)
