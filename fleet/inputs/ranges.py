"""Cutting a file into work items: byte ranges that end where a document ends."""

from __future__ import annotations

from fleet.store import Store

_SCAN = 64 << 10


# Where a document starts, in formats that mark it on its first line.
_MARKS = {"jsonl": b"", "cirrus": b'{"index"', "wikiextractor": b"<doc"}


def _next_boundary(store: Store, name: str, pos: int, size: int, fmt: str, limit: int) -> tuple[int, bool]:
    """(offset, True) of the first document boundary at or after pos (an offset where a
    document starts), looking no further than ``limit`` bytes past pos; failing that,
    (the first line boundary after pos, False): a plain-text document longer than an item is
    cut between lines rather than make one item (and one worker's memory) as big as it.
    Documents of the other formats are never cut (a <doc> or a JSON record must stay whole)."""
    mark = _MARKS.get(fmt)
    # Step back one byte so that a line starting exactly at pos is seen as a line start.
    offset = max(0, pos - 1)
    stop = min(size, pos + limit) if mark is None else size
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
        while True:
            if mark is not None and base + i >= pos and data.startswith(mark, i):
                return base + i, True
            nl = data.find(b"\n", i)
            if nl < 0:
                carry = data[i:]
                break
            if first_line_end is None:
                first_line_end = base + nl + 1
            if mark is None and not data[i:nl].decode("utf-8", "ignore").strip():
                return base + nl + 1, True
            i = nl + 1
        offset += len(chunk)
        if offset >= stop and first_line_end is not None and mark is None:
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
