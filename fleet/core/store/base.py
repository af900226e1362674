"""The store's interface: what every store is (Store: ranged and whole reads, writes conditioned
on a generation, listings by name range), what it lists (Blob), and what its calls raise.

Its own module, under the package's ``open_store`` and the stores it opens (``local``, ``gcs``),
which all import it; ``fleet.core.store`` re-exports every name, the same objects.
"""

from __future__ import annotations

import abc
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
    def write(self, name: str, data: bytes, if_generation_match: int | None = None, *, idempotent: bool = False) -> int:
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
    def download_file(
        self, name: str, path: str, start: int = 0, end: int | None = None, version: str | None = None
    ) -> None:
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
