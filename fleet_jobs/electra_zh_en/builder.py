"""Pack token-id sentences into ELECTRA pre-training examples.

Same packing as google-research/electra's ``ExampleBuilder``, so models see
the data they were tuned on: sentences (lines) accumulate until the target
length is reached or the document ends; the first segment takes about half
(10% of the time all) of them; 5% of examples get a random shorter target.
Randomness comes only from the ``random.Random`` passed in, drawn in the
same order as ELECTRA, so one seed gives one output; or, with ``add_documents``
given one ``DocumentRandom`` per document, from the document's own stream
(where ELECTRA carries its random target length from one document into the
next, each document then starts with the full one). ``seeded_document_runs``
packs as ``add_documents`` with a ``DocumentRandom`` per document, from the
lines' token counts alone, giving
each example as runs into all the ids laid end to end (the job's path without packing:
no Python list per line or example).
"""

from __future__ import annotations

import hashlib
import random
import struct
from itertools import accumulate
from typing import Iterable, Iterator, NamedTuple


class Example(NamedTuple):
    """``[CLS] a [SEP] b [SEP]`` zero-padded; the lists convert with ``np.asarray``.

    The mask and segment ids follow from the two lengths, so they are made
    only when asked for (the TFRecord writer encodes them from the lengths).
    """

    input_ids: list[int]
    length: int  # non-padding positions, [CLS] and [SEP]s included
    first_length: int  # positions of "[CLS] a [SEP]" (segment id 0)

    @property
    def input_mask(self) -> list[int]:
        return [1] * self.length + [0] * (len(self.input_ids) - self.length)

    @property
    def segment_ids(self) -> list[int]:
        n0, n = self.first_length, self.length
        return [0] * n0 + [1] * (n - n0) + [0] * (len(self.input_ids) - n)


class DocumentRandom:
    """The draws of one document (``random()``, ``randint()``), from its run seed and its text.

    A ``random.Random`` per document would cost more to seed (5 µs) than a short document costs
    to convert; this is a blake2b stream instead: 8 uniform doubles per 64-byte digest (the
    first digest keyed by the seed over the text, each next one the hash of the last)."""

    __slots__ = ("_digest", "_values", "_next")
    _UNPACK = struct.Struct("<8Q").unpack

    def __init__(self, seed_key: bytes, text: bytes):
        self._digest = hashlib.blake2b(text, key=seed_key, digest_size=64).digest()
        self._values = self._UNPACK(self._digest)
        self._next = 0

    @classmethod
    def from_keyed(cls, keyed: "hashlib.blake2b", text: bytes) -> "DocumentRandom":
        """``DocumentRandom(seed_key, text)`` from ``blake2b(key=seed_key, digest_size=64)``, made
        once: a copy of it costs less than setting up the key again for every document."""
        self = cls.__new__(cls)
        h = keyed.copy()
        h.update(text)
        self._digest = h.digest()
        self._values = cls._UNPACK(self._digest)
        self._next = 0
        return self

    def random(self) -> float:
        i = self._next
        if i == 8:
            self._digest = hashlib.blake2b(self._digest, digest_size=64).digest()
            self._values = self._UNPACK(self._digest)
            i = 0
        self._next = i + 1
        return (self._values[i] >> 11) * 1.1102230246251565e-16  # 53 random bits / 2**53

    def randint(self, a: int, b: int) -> int:
        return a + int(self.random() * (b - a + 1))

    @staticmethod
    def seed_key(seed: int) -> bytes:
        return hashlib.sha256(f"electra-document:{seed}".encode()).digest()[:32]


class ExampleBuilder:
    def __init__(
        self, max_length: int, cls_id: int, sep_id: int, rng: random.Random, pad_id: int = 0, pad: bool = True
    ):
        if max_length < 5:
            raise ValueError(f"max_length must be at least 5, got {max_length}")
        self.max_length = max_length
        self.pad = pad  # False: input_ids stop at the last [SEP] (a writer that pads on its own)
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id
        self.rng = rng
        self._sentences: list[list[int]] = []
        self._length = 0
        self._target = max_length

    def add_sentence(self, ids: list[int]) -> Example | None:
        """Add one line's ids; returns an example when the target length is reached."""
        self._sentences.append(ids)
        self._length += len(ids)
        if self._length >= self._target:
            return self._create()
        return None

    def end_document(self) -> Example | None:
        """A document boundary: flush what is pending (nothing if it holds no token)."""
        if self._length:
            return self._create()
        self._sentences = []  # only empty sentences: drop them, as ELECTRA would carry them harmlessly
        return None

    def add_document(self, sentences: Iterable[list[int]]) -> list[Example]:
        out = self.add_sentences(sentences)
        last = self.end_document()
        if last is not None:
            out.append(last)
        return out

    def add_documents(
        self, sentences: list[list[int]], doc_ends: Iterable[int], rngs: Iterable[random.Random] | None = None
    ) -> list[Example]:
        """``add_document`` for many documents at once: ``sentences`` holds their lines in order,
        document d ends before ``sentences[doc_ends[d]]``. Short documents are many: one call.
        With ``rngs`` (one per document) each document draws from its own and starts with the
        full target length, so its examples depend on it alone, not on the documents before it."""
        out: list[Example] = []
        append, create = out.append, self._create
        rng_of = iter(rngs) if rngs is not None else None
        start = 0
        for end in doc_ends:
            if rng_of is not None:
                self.rng = next(rng_of)
                self._target = self.max_length
            for ids in sentences[start:end]:
                self._sentences.append(ids)
                self._length += len(ids)
                if self._length >= self._target:
                    append(create())
            if self._length:
                append(create())
            else:
                self._sentences = []  # only empty sentences: dropped
            start = end
        return out

    def add_sentences(self, sentences: Iterable[list[int]]) -> list[Example]:
        """Add lines without ending the document: with ``pack_documents`` the next document's
        lines fill the same example, so short documents do not leave examples half empty."""
        out = []
        for ids in sentences:
            self._sentences.append(ids)
            self._length += len(ids)
            if self._length >= self._target:
                out.append(self._create())
        return out

    def _create(self) -> Example:
        rng, max_length = self.rng, self.max_length
        padding = [self.pad_id] * max_length if self.pad else None
        example = _example(self._sentences, self._target, rng, max_length, self.cls_id, self.sep_id, padding)
        self._sentences = []
        self._length = 0
        self._target = rng.randint(5, max_length) if rng.random() < 0.05 else max_length
        return example


_new_example = tuple.__new__  # Example(...) without the keyword handling of a NamedTuple's __new__


def _one_segment(ids: list[int], max_length: int, cls_id: int, sep_id: int, padding: list[int] | None) -> Example:
    """``ExampleBuilder._create`` of a single line: all of it in the first segment, whatever is drawn."""
    input_ids = [cls_id, *ids[: max_length - 2], sep_id]
    n = len(input_ids)
    if padding is not None:
        input_ids += padding[n:]
    return _new_example(Example, (input_ids, n, n))


def _example(
    sentences: list[list[int]], target: int, rng, max_length: int, cls_id: int, sep_id: int, padding: list[int] | None
) -> Example:
    """``ExampleBuilder._create`` up to (not including) its draw of the next target length."""
    first_target = 100000 if rng.random() < 0.1 else (target - 3) // 2
    if len(sentences) == 1:  # one sentence: all of it goes to the first segment, no coin flip
        return _one_segment(sentences[0], max_length, cls_id, sep_id, padding)
    first: list[int] = []
    second: list[int] = []
    for sentence in sentences:
        if (
            not first
            or len(first) + len(sentence) < first_target
            or (not second and len(first) < first_target and rng.random() < 0.5)
        ):
            first += sentence
        else:
            second += sentence
    del first[max_length - 2 :]
    del second[max(0, max_length - len(first) - 3) :]
    input_ids = [cls_id, *first, sep_id]
    n_first = len(input_ids)
    if second:
        input_ids += second
        input_ids.append(sep_id)
    n = len(input_ids)
    if padding is not None:
        input_ids += padding[n:]
    return _new_example(Example, (input_ids, n, n_first))


def build_examples(
    documents: Iterable[Iterable[list[int]]], max_length: int, cls_id: int, sep_id: int, rng: random.Random
) -> Iterator[Example]:
    """Examples from documents given as sequences of per-line id lists."""
    builder = ExampleBuilder(max_length, cls_id, sep_id, rng)
    for document in documents:
        yield from builder.add_document(document)


CLS_RUN, SEP_RUN = -1, -2  # FlatExamples.run_starts of the [CLS] and of a [SEP]


class FlatExamples(NamedTuple):
    """Examples as runs into all lines' ids laid end to end (``tokenize_flat``'s array): example
    i's ids are its runs in order (``run_starts[k]``, ``run_lengths[k]``), a start of ``CLS_RUN``
    or ``SEP_RUN`` being that one token; ``lengths`` and ``first_lengths`` as in ``Example``."""

    run_starts: list[int]
    run_lengths: list[int]
    lengths: list[int]
    first_lengths: list[int]


def seeded_document_runs(
    line_lengths: list[int], doc_ends: Iterable[int], texts: Iterable[bytes], seed_key: bytes, max_length: int
) -> FlatExamples:
    """``ExampleBuilder(max_length, ..., pad=False).add_documents`` with ``DocumentRandom(seed_key,
    text)`` per document, from the lines' token counts alone: the packing needs only them and the
    draws, so the ids stay in one array and no list is made per line or example. The same
    examples (tests/test_builder.py holds the two together), in fewer steps: the keyed hash is
    set up once and copied per document, and a document's stream is made only when one of its
    draws can matter. None can for its last example (the stream ends there) when that is one
    line, or lines shorter together than half the target: all go to the first segment whatever
    is drawn (each prefix stays under either first-segment target)."""
    if max_length < 5:
        raise ValueError(f"max_length must be at least 5, got {max_length}")
    starts: list[int] = []
    lengths: list[int] = []
    ex_lengths: list[int] = []
    ex_firsts: list[int] = []
    add_start, add_length, add_n, add_first = starts.append, lengths.append, ex_lengths.append, ex_firsts.append
    keep = max_length - 2
    offsets = list(accumulate(line_lengths, initial=0))
    keyed = hashlib.blake2b(key=seed_key, digest_size=64)

    def one_segment(at: int, n: int) -> None:  # _one_segment of n ids from ``at``
        n = min(n, keep)
        starts.extend((CLS_RUN, at, SEP_RUN))
        lengths.extend((1, n, 1))
        add_n(n + 2)
        add_first(n + 2)

    def example(a: int, b: int, target: int, rng: DocumentRandom) -> None:  # _example of lines a..b-1
        first_target = 100000 if rng.random() < 0.1 else (target - 3) // 2
        if b - a == 1:
            one_segment(offsets[a], line_lengths[a])
            return
        first: list[int] = []  # runs: start, length, start, length...
        second: list[int] = []
        n_first = n_second = 0
        for j in range(a, b):
            size = line_lengths[j]
            if (
                not n_first
                or n_first + size < first_target
                or (not n_second and n_first < first_target and rng.random() < 0.5)
            ):
                runs = first
                n_first += size
            else:
                runs = second
                n_second += size
            if size:
                at = offsets[j]
                if runs and runs[-2] + runs[-1] == at:
                    runs[-1] += size
                else:
                    runs += (at, size)
        n_first = min(n_first, keep)
        n_second = min(n_second, max(0, max_length - n_first - 3))
        add_start(CLS_RUN)
        add_length(1)
        _add_runs(first, n_first, add_start, add_length)
        add_start(SEP_RUN)
        add_length(1)
        if n_second:
            _add_runs(second, n_second, add_start, add_length)
            add_start(SEP_RUN)
            add_length(1)
            add_n(n_first + n_second + 3)
        else:
            add_n(n_first + 2)
        add_first(n_first + 2)

    start = 0
    for end, text in zip(doc_ends, texts):
        if end - start == 1:  # a one-line document: one example if it has a token, its draws unused
            if line_lengths[start]:
                one_segment(offsets[start], line_lengths[start])
            start = end
            continue
        rng = None
        target = max_length
        pending = start  # the first line not yet in an example
        length = 0
        for i in range(start, end):
            length += line_lengths[i]
            if length >= target:
                if rng is None:
                    rng = DocumentRandom.from_keyed(keyed, text)
                example(pending, i + 1, target, rng)
                target = rng.randint(5, max_length) if rng.random() < 0.05 else max_length
                pending = i + 1
                length = 0
        if length:
            if end - pending == 1 or length < (target - 3) // 2:  # all in the first segment, no draw matters
                one_segment(offsets[pending], length)  # (the pending lines' ids are contiguous)
            else:
                if rng is None:
                    rng = DocumentRandom.from_keyed(keyed, text)
                example(pending, end, target, rng)
        start = end
    return FlatExamples(starts, lengths, ex_lengths, ex_firsts)


def _add_runs(runs: list[int], n: int, add_start, add_length) -> None:
    """The runs (start, length pairs) of a segment, cut to its first ``n`` ids."""
    for k in range(0, len(runs), 2):
        if n <= 0:
            return
        size = min(runs[k + 1], n)
        add_start(runs[k])
        add_length(size)
        n -= size
