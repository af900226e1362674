"""BERT's WordPiece tokenization (``FullTokenizer`` semantics), made fast.

BERT's reference walks every character in Python (0.5 MB/s). The same result
comes from whole-string C operations: delete the characters BERT drops with
one regex, ``str.lower``, NFD only when the text is not already NFD, one
``re.findall`` that yields BERT's basic tokens (a CJK character alone, a
punctuation character alone, or a run of anything else that is not
whitespace), and a cache from basic token to ids, since real text is Zipfian
and WordPiece proper rarely runs.

What is left per token (a ``str`` per basic token, a dict lookup) runs in C when
it can: ``wordpiece.c`` through ``native.py`` scans the normalized text's code
points with a class table built from the same ranges as the regexes below and
looks the pieces up in its own copy of the vocab. The Python code stays as the
reference and the fallback (``FLEET_NATIVE=0``; no compiler): the ids are the
same either way (tests/test_native.py).

Why whole-string processing equals BERT's per-token processing:
``str.lower`` is context-sensitive only for the Greek final sigma, whose
context never crosses whitespace or a CJK character; canonical reordering
never crosses a starter; and ``lower``/NFD neither create nor remove CJK
characters, whitespace or newlines (checked over all of Unicode).

Where this deliberately follows BERT rather than Hugging Face ``tokenizers``:
private-use (Co) and unassigned (Cn) characters are kept (so a word holding
one usually becomes ``[UNK]``; ``tokenizers`` deletes them, and so does
ELECTRA's copy of this tokenizer, which drops every C* category), a final
capital sigma lower-cases to ``ς`` as Python does (``tokenizers`` gives
``σ``), and U+2B820..U+2B91F are CJK (``tokenizers`` starts that range at
U+2B920). A word over 200 characters becomes ``[UNK]`` as in BERT's
``WordpieceTokenizer`` (``tokenizers`` defaults to 100; the tests set it to 200).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from itertools import chain
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .unicode_classes import Ranges, classes

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Flag bit on an id from ``tokenize_lines_words``: the token continues the previous token's
# word (a ``##`` piece, or a later character of a Chinese word). Ids stay below it.
WORD_CONTINUES = 1 << 30
_MARK = "\x00"  # never in normalized text (BERT's cleaning drops it): marks a word-continuing CJK character
REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")

# BERT's "Chinese character" blocks (CJK ideographs; not kana or hangul).
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


class VocabError(ValueError):
    """The vocab file is unusable; the message names it."""


def _char_class(ranges: Iterable[tuple[int, int]], limit: int) -> str:
    """A regex character class body from sorted inclusive code point ranges, cut at ``limit``."""
    return "".join(
        f"\\U{a:08x}" if a == min(b, limit - 1) else f"\\U{a:08x}-\\U{min(b, limit - 1):08x}"
        for a, b in ranges
        if a < limit
    )


class _Patterns:
    """The compiled regexes for the code points below ``limit``.

    A character class holding characters beyond U+FFFF is matched by a linear
    scan of its ranges (about 50x slower), so text without such characters,
    nearly all text, uses patterns limited to the BMP.

    The token patterns are compiled on first use (~35 ms of CPU for the four): with the C
    tokenizer (``native.py``) a worker normalizes with ``drop`` and ``marks`` and never needs them.
    """

    def __init__(self, limit: int, drop: Ranges, marks: Ranges, punct: Ranges):
        self._cjk = _char_class(CJK_RANGES, limit)
        self._punct = _char_class(punct, limit)
        self.drop = re.compile(_char_class(drop, limit).join("[]"))
        self.marks = re.compile(_char_class(marks, limit).join("[]"))
        self.limit = limit  # (cjk_table: runs of CJK characters to segment, for whole-word masking)

    @functools.cached_property
    def tokens(self) -> re.Pattern:
        # Word runs first: most tokens are words, and the three branches never start alike.
        cjk, p = self._cjk, self._punct
        return re.compile(f"[^\\s{cjk}{p}]+|[{cjk}]|[{p}]")

    @functools.cached_property
    def marked_tokens(self) -> re.Pattern:
        # For whole-word masking: the same tokens as above from text where a marker precedes
        # each CJK character that continues a word.
        cjk, p = self._cjk, self._punct
        return re.compile(f"[^\\s{_MARK}{cjk}{p}]+|[{cjk}]|{_MARK}[{cjk}]|[{p}]")

    # The same two with each newline a token of its own: many lines in one findall (tokenize_flat).
    @functools.cached_property
    def tokens_nl(self) -> re.Pattern:
        return re.compile(f"{self.tokens.pattern}|\n")

    @functools.cached_property
    def marked_tokens_nl(self) -> re.Pattern:
        return re.compile(f"{self.marked_tokens.pattern}|\n")

    @functools.cached_property
    def cjk_table(self) -> np.ndarray:
        """code point -> is it CJK (for the code points below ``limit``; 1.1 MB, built on first use)."""
        table = np.zeros(0x110000, bool)
        for a, b in CJK_RANGES:
            table[a : min(b, self.limit - 1) + 1] = True
        return table


@functools.cache
def _patterns(limit: int) -> _Patterns:
    """The patterns for the BMP (0x10000) or all of Unicode (0x110000), built on first use from
    ``unicode_classes`` (only a Unicode version it has no table for scans Unicode, ~0.3 s)."""
    return _Patterns(limit, *classes())


@functools.cache
def _class_table() -> np.ndarray:
    """code point -> its class bits for the C tokenizer (``native.CLS_*``), from the same sources
    as the regexes above: ``\\s`` of ``re`` itself (tested on every code point), ``CJK_RANGES``,
    the punctuation of ``unicode_classes`` and ``_MARK``. 1.1 MB, built once per process (~20 ms)."""
    from . import native

    table = np.zeros(0x110000, np.uint8)
    for a, b in CJK_RANGES:
        table[a : b + 1] |= native.CLS_CJK
    for a, b in classes()[2]:
        table[a : b + 1] |= native.CLS_PUNCT
    everything = np.arange(0x110000, dtype="<u4")
    everything[0xD800:0xE000] = 0  # surrogates (no class) cannot be decoded: \x00 is not \s either
    text = everything.tobytes().decode("utf-32-le")
    table[[m.start() for m in re.finditer(r"\s", text)]] |= native.CLS_WS
    table[ord(_MARK)] |= native.CLS_MARK
    return table


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_ASCII_DROP = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


_BOM = "\ufeff"


def load_vocab(data: bytes | str, source: str = "vocab") -> dict[str, int]:
    r"""Parse a BERT vocab (one token per line, id = line number) as BERT's ``load_vocab`` does:
    lines split at ``\n`` only, each token stripped, a repeated token keeps its last line's id
    (published vocabs repeat a few stripped tokens, so repeats are allowed; a repeated special
    token is refused: that is two vocabs run together).

    One deliberate difference: a leading UTF-8 byte order mark (Windows editors write one) is
    dropped, where BERT's would keep it in token 0 ("\ufeff[PAD]", so "missing [PAD]" here).
    Ids stay line numbers, so every id equals BERT's; only token 0's spelling differs, and
    BERT pads with id 0 and never looks [PAD] up. The C core gets this dict, not the file."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise VocabError(f"{source}: not UTF-8 ({e.reason} at byte {e.start})") from None
    if data.startswith(_BOM):
        data = data[1:]
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise VocabError(f"{source}: the vocab file is empty")
    tokens = [line.strip() for line in lines]
    vocab = {token: i for i, token in enumerate(tokens)}
    missing = [t for t in REQUIRED_TOKENS if t not in vocab]
    if missing:
        bare_cr = len(lines) == 1 and "\r" in data
        cr = " (its lines end in a bare CR; a token per LF-ended line, please)" if bare_cr else ""
        raise VocabError(f"{source}: not a BERT vocab, missing {' '.join(missing)}{cr}")
    for special in SPECIAL_TOKENS:
        if special in vocab and tokens.index(special) != vocab[special]:
            raise VocabError(
                f"{source}: {special} is on lines {tokens.index(special) + 1} and "
                f"{vocab[special] + 1} (two vocabs run together?)"
            )
    if vocab["[PAD]"] != 0:
        raise VocabError(f"{source}: [PAD] must have id 0 (examples are padded with 0), it has {vocab['[PAD]']}")
    return vocab


_NEWLINE = (-1,)  # what a newline "token" maps to in tokenize_flat: marks the end of a line


class _IdCache(dict[str, tuple[int, ...]]):
    """basic token -> tuple of ids; a miss runs WordPiece. Cleared when too big.
    A newline maps to ``_NEWLINE`` (tokenize_flat finds line ends by it)."""

    __slots__ = ("wordpiece", "limit")
    wordpiece: Callable[[str], tuple[int, ...]]
    limit: int

    def __missing__(self, word: str) -> tuple[int, ...]:
        ids = _NEWLINE if word == "\n" else self.wordpiece(word)
        if len(self) >= self.limit:
            self.clear()
        self[word] = ids
        return ids


class _CodeCache(dict[str, int]):
    """basic token -> one int for ``tokenize_flat``: the id of a one-piece token (nearly all),
    -1 for a newline, or ``-2 - k`` for ``pieces[k]``, the ids of a token of several pieces.
    One int per token lets numpy take the ids straight from the ``map`` with a known length,
    without chaining a tuple per token (about half the cost of that step)."""

    __slots__ = ("ids", "pieces")
    ids: _IdCache
    pieces: list[tuple[int, ...]]

    def __missing__(self, word: str) -> int:
        ids = self.ids[word]
        if len(ids) == 1:
            code = ids[0]
        else:
            code = -2 - len(self.pieces)
            self.pieces.append(ids)
        self[word] = code
        return code

    def flat(self, tokens: list[str]) -> np.ndarray:
        """The tokens' ids (newlines -1) as one int32 array."""
        if len(self) >= self.ids.limit:  # between calls only: codes of ``pieces`` stay valid during one
            self.clear()
            self.pieces.clear()
        codes = np.fromiter(map(self.__getitem__, tokens), np.int32, len(tokens))
        several = np.flatnonzero(codes < -1)
        if not len(several):
            return codes
        pieces = [self.pieces[-2 - c] for c in codes[several].tolist()]
        counts = np.ones(len(codes), np.int64)
        counts[several] = np.fromiter(map(len, pieces), np.int64, len(pieces))
        flat = np.repeat(codes, counts)
        starts = (np.cumsum(counts) - counts)[several]
        where = np.repeat(starts, counts[several]) + (
            np.arange(int(counts[several].sum()))
            - np.repeat(np.cumsum(counts[several]) - counts[several], counts[several])
        )
        flat[where] = np.fromiter(chain.from_iterable(pieces), np.int32, len(where))
        return flat


def _code_cache(ids: _IdCache) -> _CodeCache:
    cache = _CodeCache()
    cache.ids, cache.pieces = ids, []
    return cache


_native_module = None  # fleet_jobs.text.tokenizers.native, imported on first use (ctypes and the rest cost start-up)
_WP_LINES, _WP_WORDS = 1, 2  # native.WP_LINES, native.WP_WORDS


def _split_lines(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    """Ids per line from all lines' ids and each line's count of them."""
    ids, out, start = flat.tolist(), [], 0
    for n in lengths.tolist():
        out.append(ids[start : start + n])
        start += n
    return out


class BertTokenizer:
    """Text -> WordPiece ids, equal to BERT's ``FullTokenizer`` (see module doc)."""

    def __init__(
        self,
        vocab: Mapping[str, int],
        do_lower_case: bool = True,
        unk_token: str = "[UNK]",
        max_input_chars_per_word: int = 200,
        cache_limit: int = 1 << 18,
    ):
        self.vocab = dict(vocab)
        self.do_lower_case = do_lower_case
        self.unk_id = self.vocab[unk_token]
        self.max_input_chars_per_word = max_input_chars_per_word
        self.inv_vocab = {i: t for t, i in self.vocab.items()}
        # Longest pieces worth trying, so WordPiece does not test hopeless substrings.
        self._max_head = max((len(t) for t in self.vocab if not t.startswith("##")), default=1)
        self._max_tail = max((len(t) - 2 for t in self.vocab if t.startswith("##")), default=1)
        self._cache = _IdCache()
        self._cache.wordpiece = self._wordpiece
        self._cache.limit = cache_limit
        self._word_cache = _IdCache()  # the same, with WORD_CONTINUES flags (tokenize_lines_words)
        self._word_cache.wordpiece = self._wordpiece_flagged
        self._word_cache.limit = cache_limit
        self._codes = _code_cache(self._cache)  # the same as one int per token (tokenize_flat)
        self._word_codes = _code_cache(self._word_cache)
        self._table = None  # the C tokenizer's tables (native.Table), made on first use; False: none

    def __getstate__(self) -> dict:
        """Picklable (a spawned process gets one) without the C tables: they are made again there."""
        return {**self.__dict__, "_table": None}

    def _native(self):
        """The C tables for the per-token work (``native.py``), or None: this call runs in Python.
        ``FLEET_NATIVE`` is read at each call (cheap), so a test can switch an existing tokenizer."""
        global _native_module
        if _native_module is None:
            from . import native

            _native_module = native
        native = _native_module
        table = self._table
        if table is None:
            lib = native.available()  # ("0": None; "1": raises if unavailable; else warns once)
            if lib is None:
                return None
            try:
                table = native.Table(
                    lib,
                    _class_table(),
                    self.vocab,
                    self.unk_id,
                    self.max_input_chars_per_word,
                    self._max_head,
                    self._max_tail,
                )
            except UnicodeEncodeError:  # a vocab token holding a surrogate: Python for this vocab
                if native.mode() == "1":
                    raise native.NativeError("FLEET_NATIVE=1 but this vocab holds a lone surrogate") from None
                table = False
            self._table = table
        elif native.mode() == "0":
            return None
        return table or None

    @classmethod
    def from_bytes(cls, data: bytes | str, source: str = "vocab", **kwargs) -> "BertTokenizer":
        return cls(load_vocab(data, source), **kwargs)

    @classmethod
    def from_file(cls, path: str, **kwargs) -> "BertTokenizer":
        with open(path, "rb") as f:
            return cls.from_bytes(f.read(), path, **kwargs)

    @functools.cached_property
    def _bmp(self) -> _Patterns:
        """Patterns for the BMP, nearly all text: compiled when text first comes (~40 ms of CPU),
        not by a tokenizer made only to check a vocab (`fleet local`'s plan makes one in a
        process that never tokenizes); then an attribute like any other."""
        return _patterns(0x10000)

    @property
    def _all(self) -> _Patterns:
        """Patterns for text beyond the BMP: compiled when such text first comes."""
        return _patterns(0x110000)

    # -- the pipeline -------------------------------------------------------

    def _normalize(self, text: str) -> tuple[str, re.Pattern]:
        """BERT's cleaning, lower-casing and accent stripping, and the token regex that fits."""
        text, pats = self._normalize_pats(text)
        return text, pats.tokens

    def _normalize_pats(self, text: str) -> tuple[str, _Patterns]:
        if text.isascii():
            if _ASCII_DROP.search(text):
                text = _ASCII_DROP.sub("", text)
            return (text.lower() if self.do_lower_case else text), self._bmp
        pats = self._all if _ASTRAL.search(text) else self._bmp
        text = pats.drop.sub("", text)
        if self.do_lower_case:
            text = text.lower()
            if not unicodedata.is_normalized("NFD", text):
                text = unicodedata.normalize("NFD", text)
                if pats.limit == 0x10000 and _ASTRAL.search(text):  # U+FA6C and a few others
                    pats = self._all
            text = pats.marks.sub("", text)
        return text, pats

    def normalize(self, text: str) -> str:
        return self._normalize(text)[0]

    def basic_tokens(self, text: str) -> list[str]:
        """What BERT's BasicTokenizer returns."""
        text, tokens = self._normalize(text)
        return tokens.findall(text)

    def _wordpiece(self, word: str) -> tuple[int, ...]:
        n = len(word)
        if n > self.max_input_chars_per_word:
            return (self.unk_id,)
        vocab, ids, start = self.vocab, [], 0
        while start < n:
            if start:
                end = min(n, start + self._max_tail)
                while end > start and "##" + word[start:end] not in vocab:
                    end -= 1
                piece = "##" + word[start:end]
            else:
                end = min(n, self._max_head)
                while end > start and word[:end] not in vocab:
                    end -= 1
                piece = word[:end]
            if end == start:
                return (self.unk_id,)
            ids.append(vocab[piece])
            start = end
        return tuple(ids)

    def _wordpiece_flagged(self, token: str) -> tuple[int, ...]:
        """Ids of a basic token, flagged when they continue a word: ``##`` pieces, and a
        CJK character the segmenter put after another one of the same word (marked)."""
        if token[0] == _MARK:
            return tuple(i | WORD_CONTINUES for i in self._cache[token[1:]])
        first, *rest = self._cache[token]
        return (first, *(i | WORD_CONTINUES for i in rest))

    def _mark_words(self, text: str, pats: _Patterns, cut: Callable[[str], list[str]]) -> str:
        """Put ``_MARK`` before every CJK character that continues a word of ``cut``."""
        chars, continuing = self._continuations(text, pats, cut)
        if not len(continuing):
            return text
        return np.insert(chars, continuing, ord(_MARK)).tobytes().decode("utf-32-le")

    def _continuations(
        self, text: str, pats: _Patterns, cut: Callable[[str], list[str]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The text's code points, and the sorted positions of the CJK characters that continue
        a word of ``cut`` (where ``_mark_words`` puts its marks).

        Only runs of two or more CJK characters are segmented, all in one call (runs joined
        by newlines, which a segmenter never joins to a word): a word is then either all CJK
        or a newline, and ASCII words next to Chinese stay whole for WordPiece. The runs are
        found and the marks put in with numpy over the text's code points, not a regex
        ``split`` into a string per run and a join (a third of this step on short documents).
        """
        chars = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        edges = np.diff(pats.cjk_table[chars].view(np.int8), prepend=np.int8(0), append=np.int8(0))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        long_enough = ends - starts >= 2
        starts, ends = starts[long_enough], ends[long_enough]
        if not len(starts):
            return chars, np.zeros(0, np.int64)
        depth = np.zeros(len(chars) + 1, np.int8)
        depth[starts] = 1
        depth[ends] = -1
        in_run = np.flatnonzero(np.cumsum(depth[:-1], dtype=np.int8))  # the runs' positions in the text
        run_lengths = ends - starts
        runs = np.insert(chars[in_run], np.cumsum(run_lengths[:-1]), ord("\n")).tobytes().decode("utf-32-le")
        words = cut(runs)
        lengths = np.fromiter(map(len, words), np.int64, len(words))
        if lengths.sum() != len(runs):
            raise ValueError("the word segmenter did not return its input cut into words")
        continues = np.ones(len(runs), bool)
        continues[np.cumsum(lengths) - lengths] = False  # word starts ("\n" is a word of its own)
        separators = np.cumsum(run_lengths[:-1]) + np.arange(len(run_lengths) - 1)  # the "\n"s in ``runs``
        continues = np.delete(continues, separators)
        return chars, in_run[continues]

    def _native_words(
        self, text: str, pats: _Patterns, cut: Callable[[str], list[str]] | None, n_lines: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The words modes in C: ids and line lengths as ``native.Table.run`` gives them, or None
        (Python then). The C core takes the marks' positions, not the marked text."""
        table = self._native()
        if table is None:
            return None
        if cut is None or text.isascii():
            return table.run(text, _WP_LINES | _WP_WORDS, n_lines)
        return table.run_marked(*self._continuations(text, pats, cut), n_lines)

    def tokenize_lines_words(
        self, lines: Sequence[str], cut: Callable[[str], list[str]] | None = None
    ) -> list[list[int]]:
        """``tokenize_lines`` with ``WORD_CONTINUES`` set on ids that continue a word, for
        whole-word masking: ``##`` pieces, and with ``cut`` (a Chinese word segmenter such
        as ``rjieba.cut``) the second and later characters of a Chinese word. Chinese stays
        one token per character: ``id & (WORD_CONTINUES - 1)`` is what ``tokenize_lines`` gives."""
        if not lines:
            return []
        text, pats = self._normalize_pats("\n".join(lines))
        if text.count("\n") != len(lines) - 1:  # a line held its own "\n": go line by line
            return [self._tokenize_words(line, cut) for line in lines]
        if (done := self._native_words(text, pats, cut, len(lines))) is not None:
            return _split_lines(*done)
        if cut is not None and not text.isascii():
            text = self._mark_words(text, pats, cut)
        findall, get = pats.marked_tokens.findall, self._word_cache.__getitem__
        return [list(chain.from_iterable(map(get, findall(part)))) for part in text.split("\n")]

    def _tokenize_words(self, line: str, cut: Callable[[str], list[str]] | None) -> list[int]:
        text, pats = self._normalize_pats(line)
        if cut is not None and not text.isascii():
            text = self._mark_words(text, pats, cut)
        return list(chain.from_iterable(map(self._word_cache.__getitem__, pats.marked_tokens.findall(text))))

    def tokenize_flat(
        self, lines: Sequence[str], words: bool = False, cut: Callable[[str], list[str]] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """All lines' ids as one int32 array and each line's count of them: ``tokenize_lines``
        (``words``: ``tokenize_lines_words`` with ``cut``) concatenated, for many short documents
        at once. One normalization, one segmenter call and one ``findall`` over all lines (each
        newline a token that maps to -1), then C loops only: no Python step per line or token."""
        if not lines:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        text, pats = self._normalize_pats("\n".join(lines))
        if text.count("\n") != len(lines) - 1:  # a line held its own "\n": go line by line
            per_line = [self._tokenize_words(line, cut) if words else self.tokenize_ids(line) for line in lines]
            return (
                np.fromiter(chain.from_iterable(per_line), np.int32),
                np.fromiter(map(len, per_line), np.int64, len(per_line)),
            )
        if words:
            done = self._native_words(text, pats, cut, len(lines))
        else:
            done = (table := self._native()) and table.run(text, _WP_LINES, len(lines))
        if done is not None:
            return done[0].copy(), done[1].copy()  # (copies: the C core reuses its buffers at the next call)
        if words and cut is not None and not text.isascii():
            text = self._mark_words(text, pats, cut)
        found = (pats.marked_tokens_nl if words else pats.tokens_nl).findall(text)
        flat = (self._word_codes if words else self._codes).flat(found)
        ends = np.flatnonzero(flat < 0)  # len(lines) - 1 newlines
        lengths = np.diff(ends, prepend=-1, append=len(flat)) - 1
        return (np.delete(flat, ends) if len(ends) else flat), lengths

    def tokenize_ids(self, text: str) -> list[int]:
        text, tokens = self._normalize(text)
        table = self._native()
        if table is not None and (done := table.run(text)) is not None:
            return done[0].tolist()
        return list(chain.from_iterable(map(self._cache.__getitem__, tokens.findall(text))))

    def tokenize_lines(self, lines: Sequence[str]) -> list[list[int]]:
        """Ids per line; normalizes all lines in one pass to save per-call overhead."""
        if not lines:
            return []
        text, tokens = self._normalize("\n".join(lines))
        if text.count("\n") != len(lines) - 1:  # a line held its own "\n": go line by line
            return [self.tokenize_ids(line) for line in lines]
        table = self._native()
        if table is not None and (done := table.run(text, _WP_LINES, len(lines))) is not None:
            return _split_lines(*done)
        parts = text.split("\n")
        findall, get = tokens.findall, self._cache.__getitem__
        return [list(chain.from_iterable(map(get, findall(part)))) for part in parts]

    def tokenize(self, text: str) -> list[str]:
        """WordPiece strings, like ``FullTokenizer.tokenize``."""
        return self.convert_ids_to_tokens(self.tokenize_ids(text))

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.inv_vocab[i] for i in ids]
