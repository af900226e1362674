"""Documents handed on in groups: short documents are tokenized together, where their time goes."""

from __future__ import annotations

from typing import Iterable, Iterator


def document_groups(documents: Iterable[list[str]], chars: int) -> Iterator[list[list[str]]]:
    """Consecutive documents of about ``chars`` characters in all (a bigger document alone)."""
    group: list[list[str]] = []
    size = 0
    for document in documents:
        group.append(document)
        size += sum(map(len, document))
        if size >= chars:
            yield group
            group, size = [], 0
    if group:
        yield group
