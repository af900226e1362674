"""A seekable read-only file over one object version, by ranged reads.

What a reader that seeks needs (pyarrow reading a Parquet footer and some column chunks,
a reader of a run's outputs) without fetching the whole object; a version that changed
fails the read (Changed) instead of mixing bytes of two versions."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleet.core.store.base import Store


class StoreFile(io.RawIOBase):
    """A seekable read-only file over one object version (``version`` None: whatever is there)."""

    def __init__(self, store: "Store", name: str, size: int, version: str | None):
        self.store, self.name, self.size, self.version = store, name, size, version
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        end = min(self.size, self.pos + len(buffer))
        if end <= self.pos:
            return 0
        data = self.store.read(self.name, self.pos, end, version=self.version)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)
