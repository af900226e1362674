"""A work item's slice of an input file, read as exactly the bytes that were planned."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Iterator, MutableMapping

from fleet.inputs.files import describe, find_inputs, printable
from fleet.inputs.formats import iter_documents
from fleet.job import InputError
from fleet.store import Changed, NotFound, open_store


@dataclass(frozen=True)
class Slice:
    """The part of an input file one work item covers."""

    url: str
    name: str
    start: int
    end: int
    format: str
    compression: str
    version: str = ""  # the file's Blob.version when planned ("" in runs planned before versions)
    cuts_document: bool = False  # ends inside a document longer than an item

    @property
    def display(self) -> str:
        where = f"{self.url.rstrip('/')}/{self.name}"
        if self.compression == "none" and self.start:
            where += f" (from byte {self.start})"
        return printable(where)


def read_slice(piece: Slice, workdir: str, counts: MutableMapping[str, int] | None = None) -> Iterator[list[str]]:
    """Download a slice to a local file, then stream its documents.

    The bytes read must be the bytes planned: a file that was rewritten, truncated or
    replaced since (another version, or fewer bytes than the slice) fails the item
    with an InputError rather than feed it other data or nothing."""
    store = open_store(piece.url)
    source = printable(f"{piece.url.rstrip('/')}/{piece.name}")
    fd, tmp = tempfile.mkstemp(prefix="input-", dir=workdir)
    os.close(fd)
    try:
        try:
            if piece.compression == "none":
                store.download_file(piece.name, tmp, piece.start, piece.end, version=piece.version or None)
            else:
                store.download_file(piece.name, tmp, version=piece.version or None)
        except NotFound:
            raise InputError(f"{piece.display}: input file is gone") from None
        except Changed as e:
            raise InputError(f"{printable(str(e))}; plan a new run for the new contents") from None
        got = os.path.getsize(tmp)
        if piece.compression == "none" and got != piece.end - piece.start:
            raise InputError(f"{source}: changed since it was planned (bytes {piece.start}-{piece.end} planned, "
                             f"{got} there now); plan a new run for the new contents")
        with open(tmp, "rb") as f:
            base = piece.start if piece.compression == "none" else 0
            yield from iter_documents(f, piece.format, piece.compression, source, base, counts)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:  # a failed download removes its own file
            pass


def iter_path_documents(paths: list[str]) -> Iterator[list[str]]:
    """Every document under some files or folders (for vocab training and tools)."""
    for inp in find_inputs(paths):
        fmt, compression = describe(inp.name)
        if not inp.url.startswith("gs://"):
            with open(os.path.join(inp.url, inp.name), "rb") as f:
                yield from iter_documents(f, fmt, compression, inp.display)
            continue
        with tempfile.TemporaryDirectory() as d:
            yield from read_slice(Slice(inp.url, inp.name, 0, inp.size, fmt, compression), d)
