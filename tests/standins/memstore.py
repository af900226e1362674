"""A bucket in memory, for the scale simulation: Cloud Storage's semantics, its pages and a latency.

fake-gcs-server serves about 100 requests a second to one Python process, so a simulation of
100,000 items (a million requests) would take hours there and measure its queue. This store keeps
the objects in a dict, holds to the same contract (tests/test_store_contract.py runs against it)
and models what costs on Cloud Storage: every request (a read, a write, a stat, each page of a
listing: at most ``page_size`` objects, 1,000 as on GCS) calls ``on_request(method, name)`` and
then sleeps ``latency()`` seconds outside the lock, so that 200 worker threads wait for the
bucket the way 200 VMs do, while the bucket itself never queues.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

from sortedcontainers import SortedList  # hypothesis's own dependency, so in the test extra

from fleet.core.store import Blob, Changed, NotFound, PreconditionFailed, Store


class _Bucket:
    """The objects, shared by every view of one bucket (``mem://sim/out/run`` is a view of ``mem://sim``)."""

    def __init__(self):
        self.objects: dict[str, tuple[bytes, int]] = {}
        self.names = SortedList()  # a listing is a range of these, whatever the bucket holds
        self.lock = threading.Lock()
        self.generation = 0


class MemoryStore(Store):
    page_size = 1000

    def __init__(
        self,
        url: str = "mem://sim",
        latency: Callable[[], float] = lambda: 0.0,
        on_request: Callable[[str, str], None] = lambda method, name: None,
        *,
        _bucket=None,
        _prefix: str = "",
    ):
        self.url = url
        self._b = _bucket or _Bucket()
        if _bucket is None:
            self._b.latency, self._b.on_request = latency, on_request
        self.prefix = _prefix

    @property
    def latency(self) -> Callable[[], float]:
        return self._b.latency

    @latency.setter
    def latency(self, value: Callable[[], float]) -> None:
        """Every view of the bucket waits alike: the simulation's own checks set it to nothing."""
        self._b.latency = value

    def view(self, url: str) -> "MemoryStore":
        """The store for ``url``, a place in this bucket (``<this url>/some/prefix``)."""
        rest = url[len(self.url) :].strip("/") if url.startswith(self.url) else None
        if rest is None:
            raise ValueError(f"{url} is not in {self.url}")
        prefix = "/".join(p for p in (self.prefix, rest) if p)
        return MemoryStore(url.rstrip("/"), _bucket=self._b, _prefix=prefix)

    def _full(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _request(self, method: str, name: str) -> None:
        self._b.on_request(method, self._full(name))
        wait = self._b.latency()
        if wait > 0:
            time.sleep(wait)

    def _get(self, name: str) -> tuple[bytes, int]:
        with self._b.lock:
            got = self._b.objects.get(self._full(name))
        if got is None:
            raise NotFound(f"{self.url}/{name}: no such object")
        return got

    @staticmethod
    def _version(generation: int) -> str:
        return str(generation)

    def read(self, name: str, start: int = 0, end: int | None = None, version: str | None = None) -> bytes:
        self._request("read", name)
        return self._bytes(name, start, end, version)

    def _bytes(self, name: str, start: int, end: int | None, version: str | None) -> bytes:
        data, gen = self._get(name)
        if version is not None and version != self._version(gen):
            raise Changed(f"{self.url}/{name}: changed since it was planned")
        return data[start:end]

    def read_generation(self, name: str) -> tuple[bytes, int]:
        self._request("read_generation", name)
        return self._get(name)

    def write(self, name: str, data: bytes, if_generation_match: int | None = None, *, idempotent: bool = False) -> int:
        self._request("write", name)
        return self._put(name, data, if_generation_match)

    def _put(self, name: str, data: bytes, if_generation_match: int | None) -> int:
        full, b = self._full(name), self._b
        with b.lock:
            current = b.objects.get(full, (b"", 0))[1]
            if if_generation_match is not None and if_generation_match != current:
                raise PreconditionFailed(f"{self.url}/{name}: generation {current}, not {if_generation_match}")
            b.generation += 1
            if full not in b.objects:
                b.names.add(full)
            b.objects[full] = (bytes(data), b.generation)
            return b.generation

    def upload_file(self, name: str, path: str) -> int:
        with open(path, "rb") as f:
            data = f.read()
        self._request("upload_file", name)
        return self._put(name, data, None)

    def download_file(
        self, name: str, path: str, start: int = 0, end: int | None = None, version: str | None = None
    ) -> None:
        self._request("download_file", name)  # one request, as a ranged download is on Cloud Storage
        data = self._bytes(name, start, end, version)
        with open(path, "wb") as f:
            f.write(data)

    def stat(self, name: str) -> Blob | None:
        self._request("stat", name)
        with self._b.lock:
            got = self._b.objects.get(self._full(name))
        if got is None:
            return None
        return Blob(name, got[1], len(got[0]), self._version(got[1]))

    def list(self, prefix: str = "", start: str | None = None, end: str | None = None) -> Iterator[Blob]:
        cut = len(self.prefix) + 1 if self.prefix else 0
        full = self._full(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        low = max(full, self._full(start) if start is not None else "")
        high = self._full(end) if end is not None else None
        b = self._b
        with b.lock:
            found = []
            for n in b.names.irange(minimum=low, maximum=high, inclusive=(True, False)):
                if not n.startswith(full):
                    break
                data, gen = b.objects[n]
                found.append(Blob(n[cut:], gen, len(data), self._version(gen)))
        for page in range(0, max(1, len(found)), self.page_size):  # each page a request, the first even if empty
            self._request("list", prefix)
            yield from found[page : page + self.page_size]

    def delete(self, name: str) -> None:
        self._request("delete", name)
        full, b = self._full(name), self._b
        with b.lock:
            if b.objects.pop(full, None) is not None:
                b.names.remove(full)
