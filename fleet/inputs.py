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

Memory stays bounded whatever the data: a document longer than
MAX_DOCUMENT_CHARS is handed on in parts cut at line boundaries (counted as
``documents_cut``), and a document longer than an item is cut between items
at a line boundary too. Each item pins the version of its input file (size,
mtime and inode of a local file, the generation of a ``gs://`` object), so a
file that changes under a run fails its items instead of feeding them other
bytes.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import logging
import os
import stat
import tempfile
from dataclasses import dataclass
from typing import BinaryIO, Iterator, MutableMapping

from fleet.job import InputError
from fleet.store import Changed, NotFound, Store, open_store, split_url
from fleet.store.local import file_version

log = logging.getLogger("fleet.inputs")

COMPRESSIONS = {".gz": "gz", ".gzip": "gz", ".bz2": "bz2", ".zst": "zst", ".zstd": "zst"}
_BLOCK = 4 << 20
MAX_LINE_BYTES = 16 << 20
MAX_DOCUMENT_CHARS = 4 << 20  # longer documents reach the job in parts: bounded memory per document
_BOM = b"\xef\xbb\xbf"
_SCAN = 64 << 10


def printable(text: str) -> str:
    """A file name fit for a log line or a terminal: bytes that are not UTF-8 (kept by
    the OS as surrogate escapes) shown as \\xNN instead of crashing the writer."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class InputFile:
    url: str  # store URL (a local folder or gs://bucket[/prefix])
    name: str  # object name inside that store
    size: int
    version: str = ""  # Blob.version when found: what a worker checks before reading

    @property
    def display(self) -> str:
        return printable(f"{self.url.rstrip('/')}/{self.name}")


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


def _warn(message: str) -> None:
    log.warning("warning: %s", message)  # on stderr even where logging is not set up (logging.lastResort)


def _readable(path: str, display: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise InputError(f"{display}: cannot read it ({e.strerror or e})") from None


def _walk(root: str, exclude: tuple[str, ...]) -> Iterator[tuple[str, os.stat_result]]:
    """Corpus files under a folder, following symbolic links to files and folders.

    A folder reached twice (a link loop, or two links to one folder) is read once; a
    broken or looping link, a FIFO or a device is named in a warning and skipped."""
    seen: set[tuple[int, int]] = set()

    def visit(folder: str, rel: str) -> Iterator[tuple[str, os.stat_result]]:
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            _warn(f"{printable(folder)}: a folder already read (a symbolic link loop or a second link to it); "
                  "read once")
            return
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.listdir(folder))
        except OSError as e:
            raise InputError(f"{printable(folder)}: cannot list it ({e.strerror or e})") from None
        for entry in entries:
            if entry.startswith((".", "_")):
                continue
            path = os.path.join(folder, entry)
            name = f"{rel}{entry}"
            real = os.path.realpath(path)
            if any(real == x or real.startswith(x + os.sep) for x in exclude):
                continue
            try:
                st = os.stat(path)
            except OSError as e:
                target = os.readlink(path) if os.path.islink(path) else "?"
                why = "a symbolic link loop" if e.errno == 40 else f"a broken symbolic link (to {target})" \
                    if os.path.islink(path) else e.strerror
                _warn(f"{printable(path)}: {printable(why)}; skipped")
                continue
            if stat.S_ISDIR(st.st_mode):
                yield from visit(path, name + "/")
            elif not _corpus_file(name):
                continue
            elif not stat.S_ISREG(st.st_mode):
                _warn(f"{printable(path)}: not a regular file (a FIFO, socket or device); skipped")
            else:
                yield name, st

    yield from visit(root, "")


def find_inputs(paths: list[str], exclude: list[str] = ()) -> list[InputFile]:
    """Expand files and folders (local or gs://) into input files, in a stable order.

    Each file is planned once, however often it is named (directly, inside a named
    folder, or through links): the same corpus twice would be converted twice. Paths
    under ``exclude`` (the output folder of `fleet local`) are never inputs."""
    found: list[InputFile] = []
    seen: dict[str, str] = {}  # resolved path or URL -> how it was first found
    excluded = tuple(os.path.realpath(x) for x in exclude)

    def add(inp: InputFile, key: str) -> None:
        if key in seen:
            if seen[key] != inp.display:
                _warn(f"{inp.display}: the same file as {seen[key]}; planned once")
            else:
                _warn(f"{inp.display}: named twice; planned once")
            return
        seen[key] = inp.display
        found.append(inp)

    for path in paths:
        if path.startswith("gs://"):
            root, prefix = split_url(path)
            store = open_store(root)
            blob = store.stat(prefix) if prefix else None
            if blob is not None:
                add(InputFile(root, prefix, blob.size, blob.version), f"{root}/{prefix}")
                continue
            folder = prefix + "/" if prefix else ""
            blobs = [b for b in store.list(folder) if _corpus_file(b.name[len(folder):]) and b.size > 0]
            if not blobs:
                raise InputError(f"{path}: no input files there")
            for b in blobs:
                add(InputFile(root, b.name, b.size, b.version), f"{root}/{b.name}")
            continue
        if "://" in path and not path.startswith("file://"):
            raise InputError(f"{path}: unsupported URL (inputs are local paths or gs://BUCKET/PATH)")
        local = os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)
        if os.path.isfile(local):
            st = os.stat(local)
            inp = InputFile(os.path.dirname(local), os.path.basename(local), st.st_size, file_version(st))
            _readable(local, inp.display)
            add(inp, os.path.realpath(local))
        elif os.path.isdir(local):
            files = [InputFile(local, rel, st.st_size, file_version(st)) for rel, st in _walk(local, excluded)]
            if not files:
                raise InputError(f"{printable(path)}: no input files there")
            for inp in files:
                real = os.path.realpath(os.path.join(local, inp.name))
                if any(real == x or real.startswith(x + os.sep) for x in excluded):
                    continue  # a link into the output folder
                _readable(real, inp.display)
                add(inp, real)
        elif os.path.islink(local):
            raise InputError(f"{printable(path)}: a broken symbolic link (to {printable(os.readlink(local))})")
        elif os.path.exists(local):
            raise InputError(f"{printable(path)}: not a regular file or folder")
        else:
            raise InputError(f"{printable(path)}: no such file or folder")
    return found


def _next_boundary(store: Store, name: str, pos: int, size: int, fmt: str, limit: int) -> tuple[int, bool]:
    """(offset, True) of the first document boundary at or after pos (an offset where a
    document starts), looking no further than ``limit`` bytes past pos; failing that,
    (the first line boundary after pos, False): a document longer than an item is cut
    between lines rather than make one item (and one worker's memory) as big as it."""
    # Step back one byte so that a line starting exactly at pos is seen as a line start.
    offset = max(0, pos - 1)
    stop = min(size, pos + limit)
    carry = b""
    at_line_start = offset == 0
    first_line_end = None
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
                return base + i, True
        while True:
            nl = data.find(b"\n", i)
            if nl < 0:
                carry = data[i:]
                break
            if first_line_end is None:
                first_line_end = base + nl + 1
            if fmt == "jsonl" or not data[i:nl].decode("utf-8", "ignore").strip():
                return base + nl + 1, True
            i = nl + 1
        offset += len(chunk)
        if offset >= stop and first_line_end is not None:
            return first_line_end, False
    return size, True


def plan_ranges(store: Store, name: str, size: int, fmt: str, target: int) -> list[tuple[int, int, bool]]:
    """Byte ranges of about ``target`` bytes: (start, end, ends inside a document).

    Each ends at a document boundary when there is one within ``target`` bytes of where
    it would end; otherwise at a line boundary, inside a document longer than an item."""
    ranges, start = [], 0
    while start < size:
        if size - start <= target * 1.25:
            ranges.append((start, size, False))
            break
        end, clean = _next_boundary(store, name, start + target, size, fmt, target)
        ranges.append((start, end, not clean))
        start = end
    return ranges


def cut_ranges(store: Store, name: str, size: int, fmt: str, target: int) -> list[tuple[int, int]]:
    """Byte ranges of about ``target`` bytes, each ending at a document boundary (or inside
    a document longer than ``target``, at a line boundary)."""
    return [(start, end) for start, end, _ in plan_ranges(store, name, size, fmt, target)]


class _ZstdFrames(io.RawIOBase):
    """A zstd stream of one or more frames that ends only where a frame ends.

    zstandard's own stream reader returns a short read at a truncated frame as if the
    data had ended there; this one raises EOFError, as gzip and bz2 do."""

    _FEED = 16 << 10  # compressed bytes per step: bounds the output of one step

    def __init__(self, raw: BinaryIO):
        import zstandard

        self._new = zstandard.ZstdDecompressor().decompressobj
        self._raw = raw
        self._frame = None  # the frame being decoded, None between frames
        self._input = b""
        self._output = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while not self._output:
            if not self._input:
                self._input = self._raw.read(1 << 20)
                if not self._input:
                    if self._frame is not None:
                        raise EOFError("the zstd stream ends inside a frame (truncated)")
                    return b""
            if self._frame is None:
                self._frame = self._new()
            feed, self._input = self._input[:self._FEED], self._input[self._FEED:]
            self._output = self._frame.decompress(feed)
            if self._frame.eof:  # the next frame starts in what this one did not use
                self._input = self._frame.unused_data + self._input
                self._frame = None
        if 0 <= size < len(self._output):
            out, self._output = self._output[:size], self._output[size:]
        else:
            out, self._output = self._output, b""
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _decompressed(f: BinaryIO, compression: str) -> BinaryIO:
    if compression == "gz":
        return gzip.GzipFile(fileobj=f)  # type: ignore[return-value]
    if compression == "bz2":
        return bz2.BZ2File(f)  # type: ignore[return-value]
    if compression == "zst":
        return _ZstdFrames(f)  # type: ignore[return-value]
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


def iter_documents(raw: BinaryIO, fmt: str, compression: str, source: str, base_offset: int = 0,
                   counts: MutableMapping[str, int] | None = None) -> Iterator[list[str]]:
    """Documents (lists of lines) from an open binary file.

    A document of more than MAX_DOCUMENT_CHARS characters comes in parts cut at line
    boundaries, so that no document costs more memory than that whatever the input;
    ``counts["documents_cut"]`` counts the documents cut so."""
    cut = 0
    try:
        if fmt == "jsonl":
            for text in _json_texts(raw, compression, source, base_offset):
                for n, part in enumerate(_parts(text.split("\n"))):
                    cut += n == 1
                    yield part
            return
        doc: list[str] = []
        size, was_cut = 0, False
        for line in _text_lines(raw, source, base_offset, compression):
            if line.strip():
                if doc and size + len(line) > MAX_DOCUMENT_CHARS:
                    yield doc
                    doc, size, was_cut = [], 0, True
                doc.append(line)
                size += len(line)
            elif doc:
                yield doc
                cut += was_cut
                doc, size, was_cut = [], 0, False
        if doc:
            yield doc
            cut += was_cut
    finally:
        if counts is not None and cut:
            counts["documents_cut"] = counts.get("documents_cut", 0) + cut


def _parts(lines: list[str]) -> Iterator[list[str]]:
    """A record's lines in parts of at most MAX_DOCUMENT_CHARS characters (at least one line each)."""
    part: list[str] = []
    size = 0
    for line in lines:
        if part and size + len(line) > MAX_DOCUMENT_CHARS:
            yield part
            part, size = [], 0
        part.append(line)
        size += len(line)
    yield part


def _json_texts(raw: BinaryIO, compression: str, source: str, base_offset: int) -> Iterator[str]:
    at = base_offset  # offset of the line's first byte (in the decompressed stream, if compressed)
    unit = "decompressed byte" if compression != "none" else "byte"
    for number, line in enumerate(_text_lines(raw, source, base_offset, compression), 1):
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
        yield text


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


def read_all(data: bytes, name: str) -> list[list[str]]:
    """Documents of an in-memory file (tests, small tools)."""
    fmt, compression = describe(name)
    return list(iter_documents(io.BytesIO(data), fmt, compression, name))
