"""Near-duplicate detection (``--dedup near``) as pure functions: words, shingles, MinHash
signatures, LSH band keys, sketches and the similarity estimate. Nothing here reads or writes
a file; ``fleet_jobs.text.stages.graph`` moves what these make through the bucket.

What a document becomes, step by step:

1. **Words** (``words``): the text in NFKC, case-folded; a word is a run of letters and digits
   (``[^\\W_]+``), every run of digits written ``0``; each CJK ideograph, kana or Hangul
   syllable is a word of its own (those scripts put no spaces between words, as BERT's
   tokenizer treats them). Punctuation, symbols and whitespace only separate words.
2. **Shingles** (``shingles``): the set of word n-grams (``ngram``, 5 by default), each hashed to
   32 bits: a word is a 64-bit polynomial of its code points (the same on every machine, unlike
   Python's ``hash``; computed for all the words of a text at once in numpy), an n-gram a 64-bit
   mix of its words' hashes, folded to 32 bits. A document with fewer than ``ngram``
   words (but one at least) is one shingle of all its words, so two short documents are near
   duplicates only when their words are equal; a document with no word has no shingle and is
   never a near duplicate (both are counted).
3. **Signature** (``signature``): ``bands * rows`` MinHash values, value i the minimum over the
   shingles of ``(a_i * s + b_i) mod 2**64 >> 32`` (multiply-add-shift: an odd 64-bit ``a_i``;
   no modulo, so numpy does it in three wrapping operations). The a_i, b_i come from a fixed
   seed, so every worker and every run draws the same ones.
4. **Band keys** (``band_keys``): band b is rows b*rows .. (b+1)*rows of the signature; its key
   is a 64-bit mix of b and those values. Two documents that share a key are candidates.
5. **Sketch** (``sketch``): the low byte of every signature value (b-bit minwise hashing, Li &
   Koenig 2010, b = 8): what a candidate pair is checked with, 1 byte a value instead of 4.
   Two documents with Jaccard similarity J have equal bytes with probability J + (1 - J)/256,
   so ``min_equal`` turns a threshold on J into a number of equal bytes.

What differs from datatrove's MinHash (FineWeb's settings: 5-grams, 14 bands x 8 rows), and why:
datatrove hashes each shingle with SHA-1 in Python and takes every band collision as a
duplicate; here shingles are hashed from their words' CRCs in numpy, and a band collision is a
duplicate only when the pair's estimated similarity over the whole signature is at the
threshold, so ``threshold`` means what it says whatever the bands.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

import numpy as np

DEFAULT_NGRAM, DEFAULT_BANDS, DEFAULT_ROWS, DEFAULT_THRESHOLD = 5, 14, 8, 0.8
MAX_HASHES = 1024  # bands * rows at most: a sketch of 1 KB a band record
_SEED = 0x5EED_F1EE7  # the permutations' seed: part of the format (changing it changes every key)
_CHUNK = 4096  # shingles hashed at a time (bounds the temporary matrix: 4096 x hashes x 8 bytes)
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f"
_WORD = re.compile(f"[{_CJK}]|[^\\W_{_CJK}]+")
_DIGITS = re.compile(r"\d+")
_MIX = np.uint64(0x9E3779B97F4A7C15)
_FOLD = np.uint64(0xBF58476D1CE4E5B9)


@dataclass(frozen=True)
class NearParams:
    """``--dedup near``'s parameters, as the job's options give them (checked by ``check``)."""

    threshold: float = DEFAULT_THRESHOLD
    ngram: int = DEFAULT_NGRAM
    bands: int = DEFAULT_BANDS
    rows: int = DEFAULT_ROWS

    @property
    def hashes(self) -> int:
        return self.bands * self.rows

    def check(self) -> None:
        """ValueError naming the option that is out of range."""
        if not 0 < self.threshold <= 1:
            raise ValueError(f"near_threshold {self.threshold}: give a number in (0, 1]")
        if self.ngram < 1:
            raise ValueError(f"near_ngram {self.ngram}: give 1 or more words")
        if self.bands < 1 or self.rows < 1 or self.hashes > MAX_HASHES:
            raise ValueError(
                f"near_bands {self.bands}x{self.rows}: bands and rows 1 or more, "
                f"and bands x rows (the signature's hashes) at most {MAX_HASHES}"
            )


def parse_bands(text: str) -> tuple[int, int]:
    """``"14x8"`` -> (14, 8); ValueError on anything else."""
    bands, sep, rows = text.strip().lower().partition("x")
    if not sep or not bands.strip().isdigit() or not rows.strip().isdigit():
        raise ValueError(f"near_bands {text!r}: give bands x rows, e.g. 14x8")
    return int(bands), int(rows)


def words(text: str) -> list[str]:
    """The document's words as near-dedup compares them (step 1 of the module's docstring)."""
    return _DIGITS.sub("0", " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))).split()


def shingles(text: str, ngram: int) -> np.ndarray:
    """The set of the text's shingles (uint32, sorted, unique): step 2 of the module's docstring.
    Computed over the text's code points in numpy (``word_hashes``); ``word_shingles(words(text))``
    gives the same set word by word, and the tests hold the two equal."""
    return mix_shingles(word_hashes(text), ngram)


def word_shingles(ws: list[str], ngram: int) -> np.ndarray:
    """``shingles`` of the words ``words`` gave, word by word (the reference: slow)."""
    return mix_shingles(np.array([word_hash(w) for w in ws], np.uint64), ngram)


def word_hash(word: str) -> int:
    """A word's 64-bit hash: the polynomial sum(code point k * P**k) mod 2**64 (``word_hashes``
    computes the same for every word of a text at once, from prefix sums)."""
    return sum(ord(c) * pow(_P, k, 1 << 64) for k, c in enumerate(word)) % (1 << 64)


def mix_shingles(h: np.ndarray, ngram: int) -> np.ndarray:
    """The shingles of a text's word hashes (in order): each n-gram's hashes mixed, folded to 32 bits."""
    if not len(h):
        return np.zeros(0, np.uint32)
    return np.unique((_fold(_ngrams(h, min(ngram, len(h)))) >> np.uint64(32)).astype(np.uint32))


def _ngrams(h: np.ndarray, n: int) -> np.ndarray:
    """Each run of ``n`` consecutive word hashes mixed into 64 bits, in order: position i weighs in
    through the multiply (a shingle before ``_fold``)."""
    with np.errstate(over="ignore"):
        mixed = np.zeros(len(h) - n + 1, np.uint64)
        for i in range(n):
            mixed = (mixed + h[i : i + len(mixed)]) * _MIX
    return mixed


def _fold(mixed: np.ndarray) -> np.ndarray:
    """The mixed n-grams' final avalanche (its top 32 bits are the shingle), in place."""
    with np.errstate(over="ignore"):
        mixed ^= mixed >> np.uint64(31)
        mixed *= _FOLD
        mixed ^= mixed >> np.uint64(29)
    return mixed


_P = 0x100000001B3 * 2 + 1  # the word hash's base (odd: invertible mod 2**64)
_SEP, _ALNUM, _OWN, _DIGIT = 0, 1, 2, 3  # code point classes: separator, word, a word alone, digit
_CLASSES: np.ndarray | None = None
_POWERS: list[np.ndarray] = []  # [P**k, P**-k] for k below their length, mod 2**64


def _classes() -> np.ndarray:
    """The class of every code point below 0x40000 (above: a separator), as ``words`` reads them:
    built once, on a near-dedup run's first document (0.15 s)."""
    global _CLASSES
    if _CLASSES is None:
        every = "".join(map(chr, range(0x40000)))
        table = np.zeros(0x40000, np.uint8)
        for cls, pattern in ((_ALNUM, r"[^\W_]"), (_DIGIT, r"\d"), (_OWN, f"[{_CJK}]")):
            at = [m.start() for m in re.finditer(pattern, every)]
            table[np.array(at, np.int64)] = cls
        _CLASSES = table
    return _CLASSES


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    if not _POWERS or len(_POWERS[0]) < n:
        size = max(n, 1 << 16, 2 * len(_POWERS[0]) if _POWERS else 0)
        with np.errstate(over="ignore"):
            up = np.full(size, _P, np.uint64)
            down = np.full(size, pow(_P, -1, 1 << 64), np.uint64)
            up[0] = down[0] = 1
            _POWERS[:] = [np.cumprod(up, dtype=np.uint64), np.cumprod(down, dtype=np.uint64)]
    return _POWERS[0], _POWERS[1]


def word_hashes(text: str) -> np.ndarray:
    """``word_hash`` of each of ``words(text)``, in order, without making the words: the text's
    code points classed (``_classes``), digit runs folded to one ``0``, then each word's
    polynomial from prefix sums of code point x P**position (``_batch_word_hashes`` of one text)."""
    return _batch_word_hashes([text])[0]


def _permutations(hashes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.Generator(np.random.PCG64(_SEED))
    a = rng.integers(1, 1 << 63, hashes, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd
    b = rng.integers(0, 1 << 63, hashes, dtype=np.uint64)
    return a, b


_PERMUTATIONS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def signature(shingle_set: np.ndarray, hashes: int) -> np.ndarray:
    """The MinHash signature (uint32, ``hashes`` values) of a non-empty shingle set: step 3."""
    if hashes not in _PERMUTATIONS:
        _PERMUTATIONS[hashes] = _permutations(hashes)
    a, b = _PERMUTATIONS[hashes]
    low = np.full(hashes, np.iinfo(np.uint64).max, np.uint64)
    s64 = shingle_set.astype(np.uint64)
    with np.errstate(over="ignore"):
        for at in range(0, len(s64), _CHUNK):
            values = np.multiply.outer(s64[at : at + _CHUNK], a)
            values += b
            np.minimum(low, values.min(axis=0), out=low)  # the top 32 bits' minimum is the minimum's
    return (low >> np.uint64(32)).astype(np.uint32)


def signatures(texts: list[str], ngram: int, hashes: int) -> tuple[list[np.ndarray | None], list[int]]:
    """``signature(shingles(text, ngram), hashes)`` of each text (None for a text with no word),
    and each text's number of words: the same values, computed for a batch of texts in a few
    array operations (one text at a time, numpy's cost per call is most of a short document's)."""
    if hashes not in _PERMUTATIONS:
        _PERMUTATIONS[hashes] = _permutations(hashes)
    a, b = _PERMUTATIONS[hashes]
    h, doc = _batch_word_hashes(texts)
    words = np.bincount(doc, minlength=len(texts))
    first = np.concatenate(([0], np.cumsum(words)))
    keys_parts = []
    n = ngram
    if len(h) >= n:
        mixed = _ngrams(h, n)
        whole = doc[: len(mixed)] == doc[n - 1 :]  # the n-gram lies in one text
        keys_parts.append((doc[: len(mixed)][whole], mixed[whole]))
    for d in np.flatnonzero((words > 0) & (words < n)):  # a short text: one shingle of all its words
        keys_parts.append((np.array([d], np.int64), _ngrams(h[first[d] : first[d + 1]], int(words[d]))))
    sigs: list[np.ndarray | None] = [None] * len(texts)
    if not keys_parts:
        return sigs, words.tolist()
    docs = np.concatenate([k[0] for k in keys_parts]).astype(np.uint64)
    mixed = _fold(np.concatenate([k[1] for k in keys_parts]))
    keyed = np.unique((docs << np.uint64(32)) | (mixed >> np.uint64(32)))  # by text, then shingle: each set
    owner = (keyed >> np.uint64(32)).astype(np.int64)
    values32 = keyed & np.uint64(0xFFFFFFFF)
    bounds = np.flatnonzero(np.concatenate(([True], owner[1:] != owner[:-1], [True])))
    # Rows of whole texts, about _CHUNK shingles at a time (a long text alone, cut as signature cuts it).
    at = 0
    while at < len(bounds) - 1:
        end = at + 1
        while end < len(bounds) - 1 and bounds[end + 1] - bounds[at] <= _CHUNK:
            end += 1
        lo, hi = int(bounds[at]), int(bounds[end])
        if end == at + 1 and hi - lo > _CHUNK:
            sigs[int(owner[lo])] = signature(values32[lo:hi].astype(np.uint32), hashes)
        else:
            with np.errstate(over="ignore"):
                values = np.multiply.outer(values32[lo:hi], a)
                values += b
            starts = bounds[at:end] - lo
            lows = np.minimum.reduceat(values, starts, axis=0) >> np.uint64(32)
            for row, start in zip(lows.astype(np.uint32), bounds[at:end]):
                sigs[int(owner[start])] = row
        at = end
    return sigs, words.tolist()


def _batch_word_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``word_hashes`` of every text, end to end, and the text each word is in: the texts joined by
    a NUL (a separator, and a starter that NFKC composes with nothing: their normal forms joined)."""
    joined = "\0".join(t.replace("\0", " ") if "\0" in t else t for t in texts)  # a NUL in a text separates words alike
    cp = np.frombuffer(
        unicodedata.normalize("NFKC", joined).casefold().encode("utf-32-le", "surrogatepass"), np.uint32
    ).astype(np.int64)
    text_of = np.cumsum(cp == 0)
    table = _classes()
    cls = np.where(cp < len(table), table[np.minimum(cp, len(table) - 1)], _SEP)
    digit = cls == _DIGIT
    keep = cls != _SEP
    keep[1:] &= ~(digit[1:] & digit[:-1])
    chars = np.where(digit, ord("0"), cp)[keep].astype(np.uint64)
    if not len(chars):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    before = np.concatenate(([True], cls[:-1] == _SEP))[keep]
    own = cls[keep] == _OWN
    starts = np.flatnonzero(before | own | np.concatenate(([False], own[:-1])))
    ends = np.append(starts[1:], len(chars))
    up, down = _powers(len(chars) + 1)
    with np.errstate(over="ignore"):
        prefix = np.concatenate((np.zeros(1, np.uint64), np.cumsum(chars * up[: len(chars)], dtype=np.uint64)))
        hashes = (prefix[ends] - prefix[starts]) * down[starts]
    return hashes, text_of[keep][starts]


def band_keys(sig: np.ndarray, bands: int, rows: int) -> list[int]:
    """Each band's 64-bit key (step 4): equal keys in band b = equal rows in band b."""
    return [int(k) for k in band_key_rows(sig.reshape(1, -1), bands, rows)[0]]


def band_key_rows(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``band_keys`` of each row of ``sigs`` (texts x bands*rows), as a (texts x bands) uint64
    array: band b's values mixed in order into a state seeded by b (multiply and xor-shift
    rounds, SplitMix64's finalizer at the end), so equal rows in one band give equal keys and
    the same rows in two bands do not."""
    values = np.ascontiguousarray(sigs, np.uint32).reshape(len(sigs), bands, rows).astype(np.uint64)
    with np.errstate(over="ignore"):
        state = np.broadcast_to((np.arange(bands, dtype=np.uint64) + np.uint64(1)) * _FOLD, (len(sigs), bands)).copy()
        for r in range(rows):
            state = (state ^ values[:, :, r]) * _MIX
            state ^= state >> np.uint64(29)
        state ^= state >> np.uint64(30)
        state *= _FOLD
        state ^= state >> np.uint64(27)
        state *= np.uint64(0x94D049BB133111EB)
        state ^= state >> np.uint64(31)
    return state


def sketch(sig: np.ndarray) -> bytes:
    """The low byte of each signature value (step 5)."""
    return (sig & 0xFF).astype(np.uint8).tobytes()


def min_equal(threshold: float, hashes: int) -> int:
    """Equal sketch bytes (of ``hashes``) at which the estimated similarity reaches ``threshold``:
    E[equal] = hashes * (J + (1 - J) / 256), solved for J = threshold, rounded up."""
    expected = hashes * (threshold + (1 - threshold) / 256)
    return max(1, int(np.ceil(expected - 1e-9)))


def estimated_similarity(a: bytes, b: bytes) -> float:
    """The Jaccard similarity two sketches estimate (for reports; the stages compare counts)."""
    n = len(a)
    equal = int(np.count_nonzero(np.frombuffer(a, np.uint8) == np.frombuffer(b, np.uint8)))
    return max(0.0, (equal / n - 1 / 256) / (1 - 1 / 256))


def jaccard(x: np.ndarray, y: np.ndarray) -> float:
    """The exact Jaccard similarity of two shingle sets (what the estimate estimates: tests, bench)."""
    if not len(x) and not len(y):
        return 1.0
    inter = len(np.intersect1d(x, y, assume_unique=True))
    return inter / (len(x) + len(y) - inter)
