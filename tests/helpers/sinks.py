"""An in-memory Sink, so a job's converter is tested without a store."""

from __future__ import annotations

import io

from fleet.job import Sink


class MemorySink(Sink):
    def __init__(self):
        self.files: dict[str, bytes] = {}

    def open(self, suffix):
        sink = self

        class File(io.BytesIO):
            def close(self):
                sink.files[suffix] = self.getvalue()
                super().close()

        return File()
