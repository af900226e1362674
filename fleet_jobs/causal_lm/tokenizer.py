"""Documents -> token ids, with a BERT ``vocab.txt``, a ``tokenizers`` ``tokenizer.json``, a
SentencePiece ``.model`` or a tiktoken ranks file.

A document's text is its lines joined by ``\\n``, so a byte-level BPE sees the line
breaks it was trained with; BERT's WordPiece treats them as spaces anyway. Each document is
framed as the tokenizer frames a text: a ``tokenizer.json`` as its post-processor does
(``tokenizer(text)``: Llama's ``<s>`` before, BERT's ``[CLS]``/``[SEP]`` around; read off probes,
``post_processor_frame``), SentencePiece and tiktoken as their ``encode`` does (nothing), a BERT
``vocab.txt`` with nothing; then the ``eod`` option adds the end-of-document id (``auto``: when
the framing put nothing after the text).
Text that spells a special token (``<|endoftext|>`` in a web page) is encoded as text by
SentencePiece and tiktoken (``encode_ordinary``), so an end-of-document id in the output is
always one the job put there; a ``tokenizer.json`` matches its added tokens in text, as its
``encode`` does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from fleet.job import ConfigError
from fleet_jobs.text.groups import line_groups

from .blocks import DocumentIds, flatten
from .unigram import unigram_encoder
from .word_cache import word_cache

EOD_CANDIDATES = (
    "<|endoftext|>",
    "</s>",
    "<eos>",
    "<|end_of_text|>",
    "[SEP]",
)  # eod_token="" takes the first in the vocab
PAD_CANDIDATES = ("[PAD]", "<pad>", "<|padding|>")  # else padding uses the end-of-document id
# A BERT vocab tokenizes a document this many characters of lines at a time, into int32 arrays: as
# Python lists of ints a part of 4 Mi Chinese characters took about 150 MB.
LINE_GROUP_CHARS = 1 << 18


@dataclass(frozen=True)
class DocumentTokenizer:
    encode: Callable[[Sequence[list[str]]], Sequence[DocumentIds]]  # documents (lists of lines) -> ids each
    eod_id: int
    pad_id: int
    vocab_size: int
    # The same ids end to end (int32) and each document's count, where a tokenizer makes them so
    # (the byte-level BPE word cache); ``encode_flat`` below gives them for every tokenizer.
    flat: Optional[Callable[[Sequence[list[str]]], tuple[np.ndarray, np.ndarray]]] = None
    # What the tokenizer itself puts around every text (a tokenizer.json's post-processor: Llama's
    # <s> before, BERT's [CLS] before and [SEP] after); the ids above are without it.
    head: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()

    def ends(self, eod: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(before, after) each document's ids under the ``eod`` option: ``auto`` adds the
        end-of-document id after the tokenizer's own framing when that adds nothing after the
        text, ``always`` adds it in any case, ``never`` does not."""
        add = eod == "always" or (eod == "auto" and not self.tail)
        return self.head, self.tail + ((self.eod_id,) if add else ())

    def encode_flat(self, documents: Sequence[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        """(the documents' ids end to end as int32, each document's number of ids)."""
        if self.flat is not None:
            return self.flat(documents)
        return flatten(self.encode(documents))


def _special(
    vocab: dict[str, int], name: str, option: str, wanted: str, candidates: Sequence[str], source: str
) -> int | None:
    if wanted:
        if wanted not in vocab:
            raise ConfigError(f"option {option}: {wanted!r} is not in {source}")
        return vocab[wanted]
    for token in candidates:
        if token in vocab:
            return vocab[token]
    return None


def from_bert(tokenizer, source: str, eod_token: str, pad_token: str) -> DocumentTokenizer:
    """BERT's WordPiece (``fleet_jobs.text.tokenizers.tokenization.BertTokenizer``): [SEP] ends a document by default."""
    vocab = tokenizer.vocab
    eod = _special(vocab, "eod", "eod_token", eod_token, ("[SEP]",), source)
    assert eod is not None  # [SEP] is in every BERT vocab (tokenization.REQUIRED_TOKENS)
    pad = _special(vocab, "pad", "pad_token", pad_token, PAD_CANDIDATES, source)
    tokenize_flat = tokenizer.tokenize_flat

    def ids(lines: list[str]) -> np.ndarray:
        if sum(map(len, lines)) <= LINE_GROUP_CHARS:
            return tokenize_flat(lines)[0]
        return np.concatenate([tokenize_flat(group)[0] for group in line_groups(lines, LINE_GROUP_CHARS)])

    def encode(documents: Sequence[list[str]]) -> list[np.ndarray]:
        return [ids(lines) for lines in documents]

    # (the vocab's lines, not its distinct tokens: a repeated token leaves its first id unused)
    return DocumentTokenizer(encode, eod, eod if pad is None else pad, max(vocab.values()) + 1)


def from_json(tokenizer, source: str, eod_token: str, pad_token: str) -> DocumentTokenizer:
    """A ``tokenizers.Tokenizer``; ``encode_batch`` tokenizes the documents on all cores, in order."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    eod = _special(vocab, "eod", "eod_token", eod_token, EOD_CANDIDATES, source)
    if eod is None:
        raise ConfigError(
            f"{source}: no end-of-document token ({', '.join(EOD_CANDIDATES)}); name one with eod_token=..."
        )
    pad = _special(vocab, "pad", "pad_token", pad_token, PAD_CANDIDATES, source)

    # The same ids without offsets (tokenizers >= 0.20): an Encoding of a 4 Mi-character part
    # took 860 MB at its peak with them, 718 without.
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    def encode(documents: Sequence[list[str]]) -> list[list[int]]:
        encodings = encode_batch(["\n".join(lines) for lines in documents], add_special_tokens=False)
        return [e.ids for e in encodings]

    # The word cache, made by the first batch (a plan-time check never tokenizes): ``regex`` and the
    # model's JSON read again take ~60 ms of CPU. A byte-level BPE it reproduces exactly: most words
    # looked up; any other: the library's encode, as encode_flat has it without a flat.
    cache = functools.cache(lambda: word_cache(tokenizer))

    def flat(documents: Sequence[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        words = cache()
        if words is None:
            return flatten(encode(documents))
        return words.encode(["\n".join(lines) for lines in documents])

    head, tail = post_processor_frame(tokenizer, source)
    return DocumentTokenizer(
        encode,
        eod,
        eod if pad is None else pad,
        tokenizer.get_vocab_size(with_added_tokens=True),
        flat,
        head,
        tail,
    )


FRAME_PROBES = ("a", "Hello world.", "x\ny 1")


def post_processor_frame(tokenizer, source: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids a ``tokenizer.json``'s post-processor puts before and after a text's own, as
    ``tokenizer(text)`` (``add_special_tokens=True``) gives them: read off a few probes, which must
    all be framed alike (a post-processor that changes a text's own ids is refused, in one line)."""
    frames = set()
    for text in FRAME_PROBES:
        own = tokenizer.encode(text, add_special_tokens=False).ids
        full = tokenizer.encode(text, add_special_tokens=True).ids
        at = next((i for i in range(len(full) - len(own) + 1) if full[i : i + len(own)] == own), None)
        if at is None:
            raise ConfigError(
                f"{source}: its post-processor changes a text's own ids ({text!r}: {own} -> {full}); "
                "fleet frames documents with ids it adds before and after them only"
            )
        frames.add((tuple(full[:at]), tuple(full[at + len(own) :])))
    if len(frames) != 1:
        raise ConfigError(f"{source}: its post-processor frames texts differently ({sorted(frames)})")
    return frames.pop()


def from_sentencepiece(sp, source: str, eod_token: str, pad_token: str) -> DocumentTokenizer:
    """A ``sentencepiece.SentencePieceProcessor``: its ``</s>`` (``eos_id``) ends a document by default,
    its ``<pad>`` (``pad_id``), if it has one, pads."""
    pieces = {sp.id_to_piece(i): i for i in (sp.eos_id(), sp.pad_id()) if i >= 0}
    for token in (eod_token, pad_token, *EOD_CANDIDATES, *PAD_CANDIDATES):
        i = sp.piece_to_id(token) if token else -1
        if i >= 0 and sp.id_to_piece(i) == token:  # (an unknown piece maps to <unk>'s id)
            pieces.setdefault(token, i)
    eos = [sp.id_to_piece(sp.eos_id())] if sp.eos_id() >= 0 else []
    eod = _special(pieces, "eod", "eod_token", eod_token, (*eos, *EOD_CANDIDATES), source)
    if eod is None:
        raise ConfigError(
            f"{source}: no end-of-document token (the model has no eos piece); "
            "name one of its pieces with eod_token=..."
        )
    pads = [sp.id_to_piece(sp.pad_id())] if sp.pad_id() >= 0 else []
    pad = _special(pieces, "pad", "pad_token", pad_token, (*pads, *PAD_CANDIDATES), source)

    def encode(documents: Sequence[list[str]]) -> list[list[int]]:
        return sp.encode(["\n".join(lines) for lines in documents], out_type=int, num_threads=1)

    # Made by the first batch (a plan-time check never tokenizes): its C tables take ~25 ms. A unigram
    # model it reproduces exactly: normalized and encoded in C; else the library.
    fast = functools.cache(lambda: unigram_encoder(sp))

    def flat(documents: Sequence[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        texts = ["\n".join(lines) for lines in documents]
        encoder = fast()
        if encoder is None:
            return flatten(sp.encode(texts, out_type=int, num_threads=1))
        return encoder(texts)

    return DocumentTokenizer(encode, eod, eod if pad is None else pad, sp.get_piece_size(), flat)


def from_tiktoken(enc, source: str, eod_token: str, pad_token: str) -> DocumentTokenizer:
    """A ``tiktoken.Encoding``: ``eod_token`` (a special token, or any single token), else the first
    of ``EOD_CANDIDATES`` among its special tokens."""

    def single(token: str) -> int | None:
        try:
            return enc.encode_single_token(token)
        except KeyError:
            return None

    tokens = {
        t: i for t in (eod_token, pad_token, *EOD_CANDIDATES, *PAD_CANDIDATES) if t and (i := single(t)) is not None
    }
    eod = _special(
        tokens, "eod", "eod_token", eod_token, [t for t in EOD_CANDIDATES if t in enc.special_tokens_set], source
    )
    if eod is None:
        raise ConfigError(
            f"{source}: no end-of-document token among its special tokens; name one with "
            "tiktoken_special_tokens=<|endoftext|>=ID (and eod_token=... if it is not "
            f"{', '.join(EOD_CANDIDATES)})"
        )
    pad = _special(
        tokens, "pad", "pad_token", pad_token, [t for t in PAD_CANDIDATES if t in enc.special_tokens_set], source
    )
    encode_ordinary = enc.encode_ordinary

    def encode(documents: Sequence[list[str]]) -> list[list[int]]:
        return [encode_ordinary("\n".join(lines)) for lines in documents]

    return DocumentTokenizer(encode, eod, eod if pad is None else pad, enc.n_vocab)
