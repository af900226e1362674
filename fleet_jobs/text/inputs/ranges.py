"""Cutting a file into work items: byte ranges that end where a document ends."""

from __future__ import annotations

from fleet.job import Store

from fleet_jobs.text.inputs.formats import _DOC_OPEN

_SCAN = 64 << 10
_SHORT = 64 << 10  # a line longer than this is not taken for a document boundary (the reader may
# still see one there: a cut where the reader sees none would change what is read; no cut
# where it sees one changes nothing)

# Where a document starts, in formats that mark it on its first line: a JSON record on any
# line; a CirrusSearch pair on its index line (every line is read alone, so any would do);
# a WikiExtractor document on a <doc id=…> line, as the reader decides it (formats._DOC_OPEN).
_MARKS = {"jsonl": b"", "cirrus": b'{"index"', "wikiextractor": b"<doc"}


def _starts(fmt: str, line: bytes) -> bool:
    """A whole line that the reader takes for the start of a document (marked formats)."""
    if fmt != "wikiextractor":
        return True
    try:
        return _DOC_OPEN.match(line.decode("utf-8")) is not None
    except UnicodeDecodeError:  # the reader drops that line as bad: it starts nothing
        return False


def _blank(line: bytes) -> bool:
    """A line the reader takes for blank: a document boundary in plain text."""
    try:
        return not line.decode("utf-8").strip()
    except UnicodeDecodeError:  # a bad line: the reader drops it, and its document goes on
        return False


def _next_boundary(store: Store, name: str, pos: int, size: int, fmt: str, limit: int) -> tuple[int, bool]:
    """(offset, True) of the first document boundary at or after pos (an offset where a
    document starts), looking no further than ``limit`` bytes past pos; failing that,
    (the first line boundary after pos, False): a plain-text document longer than an item is
    cut between lines rather than make one item (and one worker's memory) as big as it.
    Documents of the other formats are never cut (a <doc> or a JSON record must stay whole)."""
    mark = _MARKS.get(fmt)
    whole = fmt == "wikiextractor"  # its mark is judged on the whole line
    # Step back one byte so that a line starting exactly at pos is seen as a line start.
    offset = max(0, pos - 1)
    stop = min(size, pos + limit) if mark is None else size
    carry = b""
    at_line_start = offset == 0
    passing = False  # inside a line too long to be a boundary: only its end matters
    first_line_end = None
    while offset < size:
        chunk = store.read(name, offset, min(size, offset + _SCAN))
        if not chunk:
            break
        data = carry + chunk
        base = offset - len(carry)
        offset += len(chunk)
        carry = b""
        i = -1
        if not at_line_start or passing:
            nl = data.find(b"\n")
            if nl >= 0:
                if passing and first_line_end is None:
                    first_line_end = base + nl + 1
                i, at_line_start, passing = nl + 1, True, False
        else:
            i = 0
        while i >= 0:
            if mark is not None and base + i >= pos and data.startswith(mark, i) and not whole:
                return base + i, True
            nl = data.find(b"\n", i)
            if nl < 0:
                if offset >= size:  # the last line, with no newline
                    if (
                        whole
                        and mark is not None
                        and base + i >= pos
                        and data.startswith(mark, i)
                        and _starts(fmt, data[i:])
                    ):
                        return base + i, True
                elif len(data) - i > _SHORT:
                    passing = True
                else:
                    carry = data[i:]
                break
            if whole and mark is not None and base + i >= pos and data.startswith(mark, i) and _starts(fmt, data[i:nl]):
                return base + i, True
            if first_line_end is None:
                first_line_end = base + nl + 1
            if mark is None and _blank(data[i:nl]):
                return base + nl + 1, True
            i = nl + 1
        if offset >= stop and stop < size and first_line_end is not None and mark is None:
            return first_line_end, False  # (the end of the file, when the look reaches it, ends a document)
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
