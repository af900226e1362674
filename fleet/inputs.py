"""Input corpora: finding the files, cutting them into items, reading documents.

A corpus is plain text (one line per sentence or paragraph, a blank line
between documents) or JSON Lines with a ``text`` field, optionally
compressed with gzip, bzip2 or zstd. A plain file is cut into byte ranges
that start and end at a document boundary, so a document is never split and
every line is read exactly once. Compressed files cannot be entered in the
middle, so each is one item.

Input that cannot be right fails its item with an InputError naming the file
and the byte offset: invalid UTF-8, a NUL byte (a binary file, or UTF-16
text), a line longer than MAX_LINE_BYTES (no newlines: not line-oriented
text; one line is tokenized as one string), a corrupt or truncated
compressed stream, a .jsonl line that is not a JSON object with a string
``text``. A UTF-8 byte order mark at the start of a file is skipped.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
import tempfile
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from fleet.job import InputError
from fleet.store import NotFound, Store, open_store, split_url

COMPRESSIONS = {".gz": "gz", ".gzip": "gz", ".bz2": "bz2", ".zst": "zst", ".zstd": "zst"}
_BLOCK = 4 << 20
MAX_LINE_BYTES = 16 << 20
_BOM = b"\xef\xbb\xbf"
_SCAN = 64 << 10


@dataclass(frozen=True)
class InputFile:
    url: str  # store URL (a local folder or gs://bucket[/prefix])
    name: str  # object name inside that store
    size: int

    @property
    def display(self) -> str:
        return f"{self.url.rstrip('/')}/{self.name}"


def describe(name: str) -> tuple[str, str]:
    """(format, compression) from a file name: 'a.jsonl.gz' -> ('jsonl', 'gz')."""
    base = name.lower()
    compression = "none"
    for ext, comp in COMPRESSIONS.items():
        if base.endswith(ext):
            compression, base = comp, base[: -len(ext)]
            break
    fmt = "jsonl" if base.endswith((".jsonl", ".json", ".ndjson")) else "text"
    return fmt, compression


TEXT_EXTENSIONS = (".txt", ".text", ".jsonl", ".json", ".ndjson")


def _hidden(name: str) -> bool:
    return any(part.startswith((".", "_")) for part in name.split("/"))


def _corpus_file(name: str) -> bool:
    """Inside a folder, take text files and extension-less shards (wiki_00); skip READMEs and code."""
    if _hidden(name):
        return False
    base = name.rsplit("/", 1)[-1].lower()
    for ext in COMPRESSIONS:
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    return base.endswith(TEXT_EXTENSIONS) or "." not in base


def find_inputs(paths: list[str]) -> list[InputFile]:
    """Expand files and folders (local or gs://) into input files, in a stable order."""
    found: list[InputFile] = []
    for path in paths:
        if path.startswith("gs://"):
            root, prefix = split_url(path)
            store = open_store(root)
            blob = store.stat(prefix) if prefix else None
            if blob is not None:
                found.append(InputFile(root, prefix, blob.size))
                continue
            folder = prefix + "/" if prefix else ""
            blobs = [b for b in store.list(folder) if _corpus_file(b.name[len(folder):]) and b.size > 0]
            if not blobs:
                raise InputError(f"{path}: no input files there")
            found += [InputFile(root, b.name, b.size) for b in blobs]
            continue
        local = os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)
        if os.path.isfile(local):
            found.append(InputFile(os.path.dirname(local), os.path.basename(local), os.path.getsize(local)))
        elif os.path.isdir(local):
            files = []
            for dirpath, dirnames, filenames in os.walk(local):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
                for fn in sorted(filenames):
                    rel = os.path.relpath(os.path.join(dirpath, fn), local).replace(os.sep, "/")
                    if not _corpus_file(rel):
                        continue
                    files.append(InputFile(local, rel, os.path.getsize(os.path.join(dirpath, fn))))
            if not files:
                raise InputError(f"{path}: no input files there")
            found += sorted(files, key=lambda f: f.name)
        else:
            raise InputError(f"{path}: no such file or folder")
    return found


def _next_boundary(store: Store, name: str, pos: int, size: int, fmt: str) -> int:
    """The first document boundary at or after pos (an offset where a document starts)."""
    # Step back one byte so that a line starting exactly at pos is seen as a line start.
    offset = max(0, pos - 1)
    carry = b""
    at_line_start = offset == 0
    while offset < size:
        chunk = store.read(name, offset, min(size, offset + _SCAN))
        if not chunk:
            break
        data = carry + chunk
        base = offset - len(carry)
        i = 0
        if not at_line_start:
            nl = data.find(b"\n")
            if nl < 0:
                carry, offset = b"", offset + len(chunk)
                continue
            i = nl + 1
            at_line_start = True
            if fmt == "jsonl":
                return base + i
        while True:
            nl = data.find(b"\n", i)
            if nl < 0:
                carry = data[i:]
                break
            if fmt == "jsonl" or not data[i:nl].decode("utf-8", "ignore").strip():
                return base + nl + 1
            i = nl + 1
        offset += len(chunk)
    return size


def cut_ranges(store: Store, name: str, size: int, fmt: str, target: int) -> list[tuple[int, int]]:
    """Byte ranges of about ``target`` bytes, each ending at a document boundary."""
    ranges, start = [], 0
    while start < size:
        if size - start <= target * 1.25:
            ranges.append((start, size))
            break
        end = _next_boundary(store, name, start + target, size, fmt)
        ranges.append((start, end))
        start = end
    return ranges


def _decompressed(f: BinaryIO, compression: str) -> BinaryIO:
    if compression == "gz":
        return gzip.GzipFile(fileobj=f)  # type: ignore[return-value]
    if compression == "bz2":
        return bz2.BZ2File(f)  # type: ignore[return-value]
    if compression == "zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)  # type: ignore[return-value]
    return f


def _text_lines(raw: BinaryIO, source: str, base_offset: int, compression: str) -> Iterator[str]:
    """Decoded lines; invalid UTF-8 is an InputError naming the byte offset."""
    stream = _decompressed(raw, compression)
    where = "decompressed byte" if compression != "none" else "byte"
    carry = b""
    offset = base_offset  # offset of carry[0] in the (decompressed) stream
    while True:
        try:
            block = stream.read(_BLOCK)
        except Exception as e:  # EOFError, OSError, zlib.error; zstd raises its own ZstdError
            raise InputError(f"{source}: corrupt or truncated {compression} data ({e})") from None
        if not block:
            break
        if offset == 0 and not carry and block.startswith(_BOM):
            block, offset = block[len(_BOM):], len(_BOM)
        nul = block.find(b"\x00")
        if nul >= 0:
            raise InputError(f"{source}: NUL byte at {where} {offset + len(carry) + nul} "
                             "(a binary file, or text that is not UTF-8?)")
        data = carry + block
        cut = data.rfind(b"\n") + 1
        first = data.find(b"\n") if carry else 0
        if cut == 0 and len(data) > MAX_LINE_BYTES or first > MAX_LINE_BYTES:
            raise InputError(f"{source}: the line at {where} {offset} is longer than {MAX_LINE_BYTES >> 20} MiB "
                             "(not line-oriented text?)")
        if cut == 0:
            carry = data
            continue
        try:
            text = data[:cut].decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{source}: invalid UTF-8 at {where} {offset + e.start}") from None
        lines = text.split("\n")
        lines.pop()  # the empty string after the final newline
        yield from lines
        offset += cut
        carry = data[cut:]
    if carry:
        try:
            yield carry.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{source}: invalid UTF-8 at {where} {offset + e.start}") from None


def iter_documents(raw: BinaryIO, fmt: str, compression: str, source: str, base_offset: int = 0) -> Iterator[list[str]]:
    """Documents (lists of lines) from an open binary file."""
    lines = _text_lines(raw, source, base_offset, compression)
    if fmt == "jsonl":
        at = base_offset  # offset of the line's first byte (in the decompressed stream, if compressed)
        unit = "decompressed byte" if compression != "none" else "byte"
        for number, line in enumerate(lines, 1):
            start, at = at, at + len(line.encode()) + 1
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise InputError(f"{source}: record {number} is not JSON at {unit} {start} "
                                 f"({e.__class__.__name__}: {str(e)[:80]})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise InputError(f"{source}: record {number} has no string field 'text' ({unit} {start})")
            yield text.split("\n")
        return
    doc: list[str] = []
    for line in lines:
        if line.strip():
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


@dataclass(frozen=True)
class Slice:
    """The part of an input file one work item covers."""

    url: str
    name: str
    start: int
    end: int
    format: str
    compression: str

    @property
    def display(self) -> str:
        where = f"{self.url.rstrip('/')}/{self.name}"
        if self.compression == "none" and self.start:
            where += f" (from byte {self.start})"
        return where


def read_slice(piece: Slice, workdir: str) -> Iterator[list[str]]:
    """Download a slice to a local file, then stream its documents."""
    store = open_store(piece.url)
    fd, tmp = tempfile.mkstemp(prefix="input-", dir=workdir)
    os.close(fd)
    try:
        try:
            if piece.compression == "none":
                store.download_file(piece.name, tmp, piece.start, piece.end)
            else:
                store.download_file(piece.name, tmp)
        except NotFound:
            raise InputError(f"{piece.display}: input file is gone") from None
        with open(tmp, "rb") as f:
            base = piece.start if piece.compression == "none" else 0
            yield from iter_documents(f, piece.format, piece.compression, f"{piece.url.rstrip('/')}/{piece.name}", base)
    finally:
        os.unlink(tmp)


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


def read_all(data: bytes, name: str) -> list[list[str]]:
    """Documents of an in-memory file (tests, small tools)."""
    fmt, compression = describe(name)
    return list(iter_documents(io.BytesIO(data), fmt, compression, name))
