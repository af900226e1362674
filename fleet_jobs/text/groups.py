"""Text handed on in groups of a bounded size: short documents are tokenized together, where their
time goes, and a huge document's lines a group at a time, so no call builds unbounded Python lists."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")


def _sized(items: Iterable[T], size_of: Callable[[T], int], chars: int) -> Iterator[list[T]]:
    group: list[T] = []
    size = 0
    for item in items:
        group.append(item)
        size += size_of(item)
        if size >= chars:
            yield group
            group, size = [], 0
    if group:
        yield group


def document_groups(documents: Iterable[list[str]], chars: int) -> Iterator[list[list[str]]]:
    """Consecutive documents of about ``chars`` characters in all (a bigger document alone)."""
    return _sized(documents, lambda document: sum(map(len, document)), chars)


def line_groups(lines: list[str], chars: int) -> Iterator[list[str]]:
    """A document's lines in groups of about ``chars`` characters (the list itself when it is no
    bigger; a longer line alone)."""
    if sum(map(len, lines)) <= chars:
        return iter((lines,))
    return _sized(lines, len, chars)
