"""Figures about a corpus sample that catch a bad setup before the spend (``check``, bench/).

Pure: documents (lists of lines) and a tokenizer in, counts out. Each line is counted
as it is and as ``split_sentences`` would cut it, and both are packed by a job's example
builder (the check tool gives ELECTRA's) to count the tokens it truncates (what does not
fit in ``max_seq_length`` is dropped), so the effect of the option is measured, not guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import numpy as np

from ..sentences import split_lines
from ..tokenizers.tokenization import BertTokenizer

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")
_SPACE = re.compile(r"\s")


class Packed(Protocol):
    @property
    def length(self) -> int: ...  # ids, [CLS] and [SEP]s included

    @property
    def first_length(self) -> int: ...  # ids of the first segment; == length for one segment


class Builder(Protocol):
    """What packs a document's lines (their ids) into examples: one per Side, kept between documents."""

    def add_document(self, sentences: list[list[int]]) -> Iterable[Packed]: ...


@dataclass
class Side:
    """One way of cutting the sample into lines: as read, or with split_sentences."""

    lines: int = 0
    tokens: int = 0
    long_lines: int = 0  # lines whose tokens do not fit in one example
    kept: int = 0  # tokens the ELECTRA builder keeps; tokens - kept were truncated
    per_line: list[int] = field(default_factory=list)

    def percentiles(self) -> dict[str, float]:
        if not self.per_line:
            return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
        a = np.asarray(self.per_line)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(a.max()), "mean": float(a.mean())}

    @property
    def dropped(self) -> int:
        return self.tokens - self.kept


@dataclass
class Survey:
    tokenizer: BertTokenizer
    builder: Callable[[], Builder]  # a new builder (for max_seq_length), one per Side
    max_seq_length: int = 128
    documents: int = 0
    text_bytes: int = 0
    unk: int = 0
    cjk_chars: int = 0
    latin_chars: int = 0
    other_chars: int = 0  # digits, punctuation, other scripts (spaces not counted)
    as_read: Side = field(default_factory=Side)
    split: Side = field(default_factory=Side)

    def __post_init__(self) -> None:
        self._builders = [self.builder() for _ in range(2)]

    def add(self, document: list[str]) -> None:
        self.documents += 1
        for line in document:
            self.text_bytes += len(line.encode("utf-8")) + 1
            cjk, latin = len(_CJK.findall(line)), len(_LATIN.findall(line))
            self.cjk_chars += cjk
            self.latin_chars += latin
            self.other_chars += len(line) - len(_SPACE.findall(line)) - cjk - latin
        ids = self._count(self.as_read, self._builders[0], document)
        self.unk += sum(row.count(self.tokenizer.unk_id) for row in ids)
        self._count(self.split, self._builders[1], split_lines(document))

    def _count(self, side: Side, builder: Builder, lines: list[str]) -> list[list[int]]:
        ids = self.tokenizer.tokenize_lines(lines)
        fits = self.max_seq_length - 2  # [CLS] line [SEP]
        for row in ids:
            n = len(row)
            side.lines += 1
            side.tokens += n
            side.per_line.append(n)
            side.long_lines += n > fits
        for ex in builder.add_document(ids):
            side.kept += ex.length - (2 if ex.length == ex.first_length else 3)
        return ids

    # -- figures ---------------------------------------------------------------
    def shares(self) -> dict[str, float]:
        chars = self.cjk_chars + self.latin_chars + self.other_chars
        return {
            "chinese": self.cjk_chars / chars if chars else 0.0,
            "latin": self.latin_chars / chars if chars else 0.0,
            "other": self.other_chars / chars if chars else 0.0,
            "unk": self.unk / self.as_read.tokens if self.as_read.tokens else 0.0,
        }

    def text(self) -> str:
        mb = self.text_bytes / 1e6
        per_mb = (lambda n: n / mb) if mb else (lambda n: 0.0)
        s = self.shares()
        fits = self.max_seq_length - 2

        def tokens(side: Side) -> str:
            p = side.percentiles()
            return (
                f"p50 {p['p50']:.0f}, p90 {p['p90']:.0f}, p99 {p['p99']:.0f}, max {p['max']:.0f}, mean {p['mean']:.1f}"
            )

        def share(n: int, of: int) -> str:
            return f"{n:,} ({n / of:.1%})" if of else "0"

        a, b = self.as_read, self.split
        return "\n".join(
            [
                f"sample: {self.documents:,} documents, {a.lines:,} lines, {mb:.2f} MB of text",
                f"per MB of text: {per_mb(self.documents):,.0f} documents, {per_mb(a.lines):,.0f} lines",
                f"tokens per line: {tokens(a)}",
                f"[UNK]: {s['unk']:.2%} of {a.tokens:,} tokens",
                f"characters: Chinese {s['chinese']:.1%}, Latin letters {s['latin']:.1%}, other {s['other']:.1%}",
                f"lines over {fits} tokens (max_seq_length {self.max_seq_length} less [CLS] [SEP]): "
                f"{share(a.long_lines, a.lines)}",
                f"tokens truncated by the ELECTRA builder: {share(a.dropped, a.tokens)}",
                f"with split_sentences=true: {b.lines:,} lines ({b.lines / a.lines if a.lines else 0:.2f}x), "
                f"tokens per line {tokens(b)}",
                f"  lines over {fits} tokens {share(b.long_lines, b.lines)}, "
                f"tokens truncated {share(b.dropped, b.tokens)}",
            ]
        )
