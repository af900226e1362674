"""The requests a Store's calls make, counted the way Cloud Storage bills them.

Operations, not bytes, are what a run's coordination costs on a bucket, and they grow with
the run where a careless claim loop lists too much: so a worker counts its own, and its
heartbeat carries the counts (fleet.core.spawner), so that `fleet status` can add them up.
:class:`MeteredStore` wraps any Store and changes nothing of what it does or raises; it only
counts, per call, the requests Cloud Storage would bill for it, whichever store is underneath
(a local folder bills nothing, but its run shows what the same run costs on a bucket):

- Class A: a list call's pages (one per 1,000 objects handed back, at least one: a page is
  one ``objects.list`` request), a write or a file upload (one multipart request up to 8 MiB;
  above, a resumable upload: one request to start it, one per 100 MiB chunk), as
  google-cloud-storage sends them from GCSStore;
- Class B: a read, ``read_generation``, ``download_file`` (one ranged GET each), and ``stat``
  (one metadata GET);
- free: ``delete``.

A call counts whether it succeeds or not (a 404 or a 412 is still a request). Not counted:
the library's retries of a failed request, and the few extra requests GCSStore makes only
on an error path (after a 404 it may ask once whether the bucket exists, or stat a pinned
object to tell Changed from gone; a range past an object's end costs a second request).
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterator

from fleet.core.store import Blob, Store

LIST_PAGE = 1000  # objects per page of objects.list: GCS's maximum, which GCSStore asks for
# google-cloud-storage's own thresholds (google.cloud.storage.blob: _MAX_MULTIPART_SIZE,
# _DEFAULT_CHUNKSIZE), which GCSStore keeps by setting no chunk_size: a test holds them together.
MULTIPART_MAX = 8 * 1024 * 1024
RESUMABLE_CHUNK = 100 * 1024 * 1024


def upload_requests(size: int) -> int:
    """Requests of one upload of ``size`` bytes: one multipart request, or a resumable upload's
    start and its chunks."""
    if size <= MULTIPART_MAX:
        return 1
    return 1 + math.ceil(size / RESUMABLE_CHUNK)


def list_pages(objects: int, page: int = LIST_PAGE) -> int:
    """Pages (``objects.list`` requests) of a listing that hands back ``objects`` objects."""
    return max(1, math.ceil(objects / page))


@dataclass
class RequestCounts:
    """Requests by kind; the billing class of each kind is fixed (see the module's docstring)."""

    list_pages: int = 0  # Class A
    writes: int = 0  # Class A: every request of writes and uploads
    reads: int = 0  # Class B: reads and downloads
    stats: int = 0  # Class B: object metadata
    deletes: int = 0  # free

    @property
    def class_a(self) -> int:
        return self.list_pages + self.writes

    @property
    def class_b(self) -> int:
        return self.reads + self.stats

    @property
    def free(self) -> int:
        return self.deletes

    def __add__(self, other: "RequestCounts") -> "RequestCounts":
        return RequestCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "RequestCounts | None":
        """The counts a heartbeat carries; None when it carries none, or not as counts (a beat
        written by code from before counting, or damaged)."""
        if not isinstance(data, dict):
            return None
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values.values()):
            return None
        return cls(**values)


class RequestMeter:
    """Counts shared by the stores of one worker (its run's bucket, its outputs) and the threads
    that use them (a lease's renewer, the shuffle's readers)."""

    def __init__(self) -> None:
        self._counts = RequestCounts()
        self._lock = threading.Lock()

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            setattr(self._counts, kind, getattr(self._counts, kind) + n)

    def snapshot(self) -> RequestCounts:
        with self._lock:
            return RequestCounts(**self._counts.to_dict())

    def for_beat(self) -> dict[str, int]:
        """The counts as a heartbeat carries them: the heartbeat's own write, made right after,
        included, so that a worker's last beat holds every request it made."""
        counts = self.snapshot()
        counts.writes += 1
        return counts.to_dict()


class MeteredStore(Store):
    """A Store that counts the requests of each call (into ``meter``) and otherwise is ``inner``:
    the same results, the same exceptions, the same laziness of a listing."""

    def __init__(self, inner: Store, meter: RequestMeter | None = None, page: int = LIST_PAGE):
        self.inner = inner
        self.meter = meter if meter is not None else RequestMeter()
        self.page = page
        self.url = inner.url

    def __getattr__(self, name: str) -> Any:  # a store's own attributes (a GCSStore's bucket name, a root)
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def read(self, name: str, start: int = 0, end: int | None = None, version: str | None = None) -> bytes:
        self.meter.add("reads")
        return self.inner.read(name, start, end, version=version)

    def read_generation(self, name: str) -> tuple[bytes, int]:
        self.meter.add("reads")
        return self.inner.read_generation(name)

    def write(self, name: str, data: bytes, if_generation_match: int | None = None, *, idempotent: bool = False) -> int:
        self.meter.add("writes", upload_requests(len(data)))
        return self.inner.write(name, data, if_generation_match, idempotent=idempotent)

    def upload_file(self, name: str, path: str) -> int:
        try:
            size = os.path.getsize(path)
        except OSError:  # the upload fails on the file before it asks anything
            size = None
        if size is not None:
            self.meter.add("writes", upload_requests(size))
        return self.inner.upload_file(name, path)

    def download_file(
        self, name: str, path: str, start: int = 0, end: int | None = None, version: str | None = None
    ) -> None:
        self.meter.add("reads")
        return self.inner.download_file(name, path, start, end, version=version)

    def stat(self, name: str) -> Blob | None:
        self.meter.add("stats")
        return self.inner.stat(name)

    def list(self, prefix: str = "", start: str | None = None, end: str | None = None) -> Iterator[Blob]:
        # Asked of the inner store now, as a caller of it would (a bad prefix raises here); the
        # pages are counted as they are consumed, which is when GCSStore requests them.
        return self._paged(iter(self.inner.list(prefix, start, end)))

    def _paged(self, blobs: Iterator[Blob]) -> Iterator[Blob]:
        self.meter.add("list_pages")
        for n, blob in enumerate(blobs):
            if n and n % self.page == 0:
                self.meter.add("list_pages")
            yield blob

    def delete(self, name: str) -> None:
        self.meter.add("deletes")
        return self.inner.delete(name)

    def join(self, *parts: str) -> str:
        return self.inner.join(*parts)
