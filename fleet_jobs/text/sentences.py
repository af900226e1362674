"""Split a paragraph into sentences (the ``split_sentences`` option), Chinese and English alike.

BERT and ELECTRA build examples from lines: a 400-token paragraph as one "sentence"
is truncated (what does not fit in ``max_seq_length`` is dropped) and leaves the
sentence-pair split no place to cut. Wikipedia dumps, hub datasets and CirrusSearch
text come a paragraph per line, so this cuts each line into sentences first.

Rules (pure functions, no I/O, no model; one pass of one regular expression):

- Chinese: a sentence ends after a run of 。！？ or their kin ｡ (half-width full stop),
  ！ ？ (full-width) and ‼ ⁇ ⁈ ⁉, whatever follows. Not at ；(a clause, not a
  sentence: the pieces would be too short to matter) nor at …… (used inside sentences
  as often as at their end).
- English: ``.``, ``!``, ``?`` (runs of them, ``?!``) end a sentence when whitespace and
  then an upper-case letter, a digit (``!``/``?`` only), an opening quote or bracket,
  or a Chinese character follow; ``!``/``?`` also when a Chinese character follows at
  once, and a single ``.`` between two Chinese characters. So lower case or a digit
  after a full stop never starts a sentence (``e.g. the``, ``No. 5``, ``Fig. 3``), and a
  full stop with no space after it never ends one (``3.14``, ``U.S.A``, ``example.com``).
  A full stop does not end a sentence after a known abbreviation (``Mr.``, ``Dr.``,
  ``St.``, ``vs.``, ``Jan.`` ...), a dotted one (``U.S.``, ``e.g.``, ``Ph.D.``), a single
  letter (initials: ``J. R. R. Tolkien``), a list number opening the line (``1. Intro``)
  or an ellipsis (``...``, ``…``): each is kept with what follows.
- Closing quotes and brackets after the end mark stay with the sentence
  (``他说：“好。”`` and ``"Stop." Then`` end after the quote).

Every character except the whitespace at a cut is kept, in order: joined again, the
pieces give the line back. A line without an end mark comes back as it was.
"""

from __future__ import annotations

import re

CHINESE_ENDS = "。｡！？‼⁇⁈⁉"
ENGLISH_ENDS = ".!?"
CLOSERS = "\"'”’»›」』）)]】》〉〗〕}"
OPENERS = "\"'“‘«‹「『（(【《〈〖〔["

# Words after which a full stop is part of the word (lower-cased, without the dot). Those
# mostly followed by a number (No. 5, Fig. 3, pp. 7) need no entry: a digit after a full stop
# never starts a sentence. Company suffixes (Inc., Ltd.) end sentences too often to be here.
ABBREVIATIONS = frozenset(
    """
mr mrs ms mx dr prof sr jr st mt messrs mme mlle rev fr hon gov sen rep pres gen col lt maj capt sgt cmdr adm
vs cf al approx ca esp incl viz dept univ assn ave blvd rd
jan feb mar apr jun jul aug sep sept oct nov dec
""".split()
)

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
# A run of end marks, the closers after it, then the whitespace before the next sentence.
# One character class first: the regex engine scans for it fast (about 100 MB/s).
_CANDIDATE = re.compile(
    rf"(?P<mark>[{CHINESE_ENDS}{re.escape(ENGLISH_ENDS)}…]+)(?P<close>[{re.escape(CLOSERS)}]*)(?P<space>\s*)"
)
_NEXT_AFTER_SPACE = re.compile(rf"[A-Z\u00c0-\u00de{_CJK}{re.escape(OPENERS)}]|[0-9]")
_UPPER_OR_CJK = re.compile(rf"[A-Z\u00c0-\u00de{_CJK}]")
_CJK_CHAR = re.compile(rf"[{_CJK}]")
_DOTTED = re.compile(r"^(?:[^\W\d_]{1,3}\.)+[^\W\d_]{0,3}$")  # U.S, e.g, Ph.D, a.m (the last dot is the mark)
_CHINESE_END = re.compile(f"[{CHINESE_ENDS}]")
_ANY_END = re.compile(rf"[{CHINESE_ENDS}{re.escape(ENGLISH_ENDS)}…]")


def split_sentences(line: str) -> list[str]:
    """The sentences of one line (a paragraph), each without the whitespace around it."""
    text = line.strip()
    if not text or not _ANY_END.search(text):
        return [text] if text else []
    pieces = []
    start = 0
    for m in _CANDIDATE.finditer(text):
        end = m.end()
        if end >= len(text) or not _ends_here(text, m, start):
            continue
        pieces.append(text[start : m.start("space")])
        start = end
    pieces.append(text[start:])
    return pieces


def split_lines(lines: list[str]) -> list[str]:
    """A document's lines, each cut into its sentences (a document stays one document)."""
    out: list[str] = []
    for line in lines:
        out += split_sentences(line)
    return out


def _ends_here(text: str, m: re.Match, start: int) -> bool:
    mark = m.group("mark")
    following = text[m.end()]
    if _CHINESE_END.search(mark):
        return True
    if mark[0] == "…" or mark.startswith(".."):
        return False  # an ellipsis (…… before a Chinese end mark ends with it, above)
    spaced = bool(m.group("space"))
    if mark[0] in "!?" or (len(mark) > 1 and mark[-1] in "!?"):
        if not spaced:
            return bool(_CJK_CHAR.match(following))
        return bool(_NEXT_AFTER_SPACE.match(following))
    # A full stop: only before whitespace and a capital, an opener or a Chinese character,
    # or between two Chinese characters (a half-width stop in Chinese text: 认证.然后).
    if not spaced and _CJK_CHAR.match(following) and m.start() > start and _CJK_CHAR.match(text[m.start() - 1]):
        return len(mark) == 1
    if not spaced or not _UPPER_OR_CJK.match(following) and following not in OPENERS:
        return False
    if m.group("close"):
        return True  # 'He said "Stop." Then': the quote closes the sentence
    word = _word_before(text, m.start(), start)
    if not word:
        return True
    bare = word.lower()
    if bare in ABBREVIATIONS or _DOTTED.match(word):
        return False
    if len(word) == 1 and word.isalpha():
        return False  # an initial: J. R. R. Tolkien
    if word.isdigit() and text[start : m.start()].strip() == word:
        return False  # a list number opening the line: "1. Introduction"
    return True


def _word_before(text: str, end: int, start: int) -> str:
    """The word the mark ends, without the quotes and brackets that open it."""
    i = end
    while i > start and not text[i - 1].isspace():
        i -= 1
    return text[i:end].lstrip(OPENERS)
