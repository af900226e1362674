"""A SentencePiece unigram model's exact ids, most words from a cache (``fleet_jobs/text/tokenizers/unigram.c``).

The library (``SentencePieceProcessor.encode``) normalizes a document with the model's
precompiled character map, then runs one Viterbi over all of it. The C core does both the
library's way, operation for operation, but the Viterbi word by word, looking most words up:
unigram.c's header says why that is exact, float rounding included.

Exact, or not used: ``unigram_encoder(sp)`` gives an encoder only for the library version whose
arithmetic it follows (``SENTENCEPIECE``: the lock's; another one changed it before) and for a
model whose every path breaks before each escaped space, and whose pieces the C core scores as
the library does:

- a unigram model (not BPE, word or char);
- no user-defined pieces (the library scores them apart, and its normalizer leaves them alone);
- whitespace escaped (as "▁") and as a prefix (not ``treat_whitespace_as_suffix``);
- "▁" is a piece, and no piece holds "▁" past its first character.

Anything else, no C core, or text Python cannot spell in UTF-8 (a lone surrogate): the library
encodes.
tests/test_lm_speedups.py checks ids against ``SentencePieceProcessor.encode`` on random text.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Callable, Optional, Sequence

import numpy as np

from fleet_jobs.text.tokenizers import native

from .blocks import flatten

SENTENCEPIECE = ("0.2.3",)  # the versions whose EncodeOptimized and Normalize unigram.c follows
SPACE = "\u2581"  # SentencePiece's escaped space
UNK_PENALTY = np.float32(10.0)  # unigram_model.cc kUnkPenalty: an unknown character scores min_score - 10
MAX_WORDS = (
    1 << 19
)  # distinct words kept (past it, or 32 MB of them, the cache starts over): bounded memory on web-scale text
# ModelProto's enums (sentencepiece_model.proto)
UNIGRAM = 1
NORMAL, UNKNOWN, USER_DEFINED = 1, 2, 4


def model_proto(sp):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sp.serialized_model_proto())
    return proto


def why_not(proto, version: str) -> Optional[str]:
    """Why the C encoder would not be exact for this model under this sentencepiece, or None."""
    if version not in SENTENCEPIECE:
        return f"sentencepiece {version} (the C encoder follows {', '.join(SENTENCEPIECE)})"
    if proto.trainer_spec.model_type != UNIGRAM:
        return "not a unigram model"
    if proto.trainer_spec.treat_whitespace_as_suffix:
        return "whitespace as a suffix"
    if not proto.normalizer_spec.escape_whitespaces:
        return "whitespace not escaped"
    types = [p.type for p in proto.pieces]
    if USER_DEFINED in types:
        return "user-defined pieces"
    if UNKNOWN not in types:
        return "no unknown piece"
    normal = [p.piece for p in proto.pieces if p.type == NORMAL]
    if SPACE not in normal:
        return f"{SPACE!r} is not a piece"
    if any(SPACE in piece[1:] for piece in normal):
        return f"a piece holds {SPACE!r} past its first character"
    return None


class UnigramEncoder:
    """``encode(texts) -> (ids end to end as int32, each text's count of ids)``: the ids of
    ``sp.encode(texts, out_type=int)``. One call at a time (a lock): the C core's cache is written."""

    def __init__(self, sp, proto, lib):
        pieces = proto.pieces
        normal = [i for i, p in enumerate(pieces) if p.type == NORMAL]
        encoded = [pieces[i].piece.encode() for i in normal]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
        ids = np.asarray(normal, np.int32)
        scores = np.asarray([p.score for p in pieces], np.float32)  # (the model's floats, exactly)
        min_score = scores[ids].min() if len(ids) else np.float32(np.finfo(np.float32).max)
        unk_score = np.float32(min_score - UNK_PENALTY)  # (float arithmetic, as the library's)
        smax = max(float(np.abs(scores[ids]).max()) if len(ids) else 0.0, abs(float(unk_score)))
        byte_ids = None
        if proto.trainer_spec.byte_fallback:  # (a missing byte piece is <unk>, as PieceToId says)
            byte_ids = np.asarray([sp.piece_to_id(f"<0x{b:02X}>") for b in range(256)], np.int32)
        unk_id = next(i for i, p in enumerate(pieces) if p.type == UNKNOWN)
        pool = b"".join(encoded)
        spec = proto.normalizer_spec
        charsmap = spec.precompiled_charsmap
        ptr = lib.lib.ug_new(
            pool,
            offsets.ctypes.data,
            ids.ctypes.data,
            len(ids),
            scores.ctypes.data,
            len(scores),
            unk_id,
            float(unk_score),
            smax,
            None if byte_ids is None else byte_ids.ctypes.data,
            MAX_WORDS,
            charsmap,
            len(charsmap),
            int(spec.remove_extra_whitespaces),
            int(spec.add_dummy_prefix),
        )
        if not ptr:
            raise ValueError("the model's precompiled_charsmap is malformed (or no memory for its tables)")
        self._ptr, self._lib = ptr, lib.lib
        self._sp = sp
        self._lock = threading.Lock()
        weakref.finalize(self, lib.lib.ug_free, ptr)

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        try:
            data = [text.encode() for text in texts]
        except UnicodeEncodeError:  # (a lone surrogate: the library says what it does with it)
            return flatten(self._sp.encode(list(texts), out_type=int, num_threads=1))
        ends = np.cumsum(np.fromiter(map(len, data), np.int64, len(data)))
        counts = np.zeros(len(data), np.int64)
        with self._lock:
            k = self._lib.ug_encode(self._ptr, b"".join(data), ends.ctypes.data, len(data), counts.ctypes.data)
            if k < 0:
                raise MemoryError("the C unigram encoder's buffers")
            ids = (
                np.ctypeslib.as_array((ctypes.c_int32 * k).from_address(self._lib.ug_ids(self._ptr))).copy()
                if k
                else np.zeros(0, np.int32)
            )
        return ids, counts

    def stats(self) -> dict[str, int]:
        """Words looked up, words added to the cache, words computed again (ties or deep in a
        long document)."""
        out = np.zeros(3, np.int64)
        with self._lock:
            self._lib.ug_stats(self._ptr, out.ctypes.data)
        return dict(zip(("hits", "added", "computed"), map(int, out)))


def unigram_encoder(sp) -> Optional[Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]]:
    """``UnigramEncoder(sp).encode`` where it is exact and the C core loads, else None."""
    import sentencepiece

    lib = native.available()
    if lib is None:
        return None
    proto = model_proto(sp)
    if why_not(proto, sentencepiece.__version__) is not None:
        return None
    return UnigramEncoder(sp, proto, lib).encode
