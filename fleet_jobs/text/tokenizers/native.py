"""The C core of ``BertTokenizer`` (``wordpiece.c``), of SentencePiece's unigram encoder
(``unigram.c``, for ``fleet_jobs.causal_lm.unigram``) and of causal_lm's block records
(``records.c``, for ``fleet_jobs.causal_lm.records``: it lives with the TFRecord format, beside its
Python reference, in ``fleet/formats/tfrecord/``), built at install time, loaded with ctypes.

``tokenization.BertTokenizer`` normalizes text with whole-string operations (C speed already);
what is left is per basic token: a ``str`` per token from ``re.findall``, a dict lookup, numpy
over a ``map``. ``wordpiece.c`` does that part over the normalized text's code points. The
Python code stays as the fallback and as the reference: both give the same ids
(tests/test_native.py), so records never depend on which ran.

The library is built by the build backend (setup.py: an optional setuptools extension, plain C
without Python.h) into this folder as ``_ccore.abi3.so``: by ``pip install`` / ``pip wheel``,
and in place by ``pip install -e .``. Where no compiler worked at install time there is none,
and Python does the work. A library built from other sources than those (a
checkout edited since its last ``pip install -e .``) is not loaded: it carries their sha256. `fleet sync` uploads the library with the code, so VMs load the one built here.

``FLEET_NATIVE``: ``0`` always Python; ``1`` native or an error; unset: native when there is a
library that loads, else Python after one warning line on stderr per process.

    python -m fleet_jobs.text.tokenizers.native    # which path runs here: the library's path, or why Python (exit 1)
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import os
import sys
import threading
import weakref
from pathlib import Path
from typing import Mapping

import numpy as np

from fleet.formats import tfrecord

SOURCE = Path(__file__).with_name("wordpiece.c")
OTHER_SOURCES = ("unigram.c",)  # beside SOURCE
RECORDS_SOURCE = Path(tfrecord.__file__).with_name("records.c")  # the TFRecord format's C, beside its Python
# setup.py builds SOURCE, OTHER_SOURCES and RECORDS_SOURCE into one library, in this order.
NAME = (
    "_ccore"  # setup.py's Extension("fleet_jobs.text.tokenizers._ccore"): NAME + an extension suffix, beside this file
)
ABI_VERSION = 4

# The class bits of wordpiece.c.
CLS_WS, CLS_CJK, CLS_PUNCT, CLS_MARK = 1, 2, 4, 8
WP_LINES, WP_WORDS = 1, 2

REINSTALL = "reinstall fleet with a C compiler present (in a checkout: pip install -e .)"


class NativeError(RuntimeError):
    """The C library is missing or cannot be loaded; the message says why and what to do."""


def mode() -> str:
    """``FLEET_NATIVE``: "0" (Python only), "1" (native required) or "" (native when it loads)."""
    value = os.environ.get("FLEET_NATIVE", "").strip()
    if value not in ("", "0", "1"):
        raise NativeError(f"FLEET_NATIVE={value!r}: use 0 (Python), 1 (native, or fail) or leave it unset")
    return value


def library_path(folder: Path | None = None) -> Path:
    """The built library in ``folder`` (default: beside this file). Raises ``NativeError`` if none."""
    folder = folder or SOURCE.parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:  # (.cpython-3xx-...so, .abi3.so, .so)
        path = folder / f"{NAME}{suffix}"
        if path.is_file():
            return path
    raise NativeError(f"no {NAME}.abi3.so in {folder} (no C compiler when fleet was installed): {REINSTALL}")


class _Library:
    """The loaded library with its functions' signatures."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        if lib.wp_abi_version() != ABI_VERSION:
            raise NativeError(f"{path}: ABI {lib.wp_abi_version()}, expected {ABI_VERSION}: {REINSTALL}")
        lib.wp_source_sha256.restype = ctypes.c_char_p
        built_from = lib.wp_source_sha256().decode()
        sources = sources_sha256()
        if sources is not None and built_from != sources:
            raise NativeError(
                f"{path.name} was built from other sources than {', '.join(map(str, source_paths()))}: {REINSTALL}"
            )
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
        lib.wp_new.restype = p
        lib.wp_new.argtypes = [p, p, i64, p, p, p, i64, i32, i64, i64, i64]
        lib.wp_free.restype = None
        lib.wp_free.argtypes = [p]
        for f in (lib.wp_tokenize_u32, lib.wp_tokenize_u8):
            f.restype = i64
            f.argtypes = [p, p, i64, ctypes.c_int, p, p, i64, p, i64]
        lib.ug_new.restype = p
        lib.ug_new.argtypes = [
            p,
            p,
            p,
            i64,
            p,
            i32,
            i32,
            ctypes.c_float,
            ctypes.c_double,
            p,
            i64,
            p,
            i64,
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.ug_free.restype = None
        lib.ug_free.argtypes = [p]
        lib.ug_encode.restype = i64
        lib.ug_encode.argtypes = [p, p, p, i64, p]
        lib.ug_ids.restype = p
        lib.ug_ids.argtypes = [p]
        lib.ug_stats.restype = None
        lib.ug_stats.argtypes = [p, p]
        lib.rec_blocks.restype = i64
        lib.rec_blocks.argtypes = [p, ctypes.c_int, i64, i64, p, ctypes.c_int, i64, p, i64, p]
        lib.rec_crc32c.restype = ctypes.c_uint32
        lib.rec_crc32c.argtypes = [ctypes.c_uint32, p, i64]
        self.lib, self.path = lib, path


def source_paths() -> list[Path]:
    return [SOURCE, *(SOURCE.with_name(name) for name in OTHER_SOURCES), RECORDS_SOURCE]


def sources_sha256() -> str | None:
    """The sha256 of the C sources end to end (what setup.py builds into the library), or None
    where they are not all there."""
    paths = source_paths()
    if not all(p.is_file() for p in paths):
        return None
    return hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()


class Table:
    """One tokenizer's C tables (vocab hash tables and the code point classes), freed with it.
    Read-only once made: calls from several threads at once are safe (ctypes drops the GIL)."""

    def __init__(
        self,
        lib: _Library,
        classes: np.ndarray,
        vocab: Mapping[str, int],
        unk_id: int,
        max_chars: int,
        max_head: int,
        max_tail: int,
    ):
        # Every token as a head piece (exactly ``word[:end] in vocab``), and each "##" token's
        # rest as a continuation piece (exactly ``"##" + word[start:end] in vocab``).
        tails = [t for t in vocab if t.startswith("##")]
        keys = [*vocab, *(t[2:] for t in tails)]
        ids = np.fromiter([*vocab.values(), *(vocab[t] for t in tails)], np.int32, len(keys))
        tail = np.zeros(len(keys), np.uint8)
        tail[len(vocab) :] = 1
        offsets = np.zeros(len(keys) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, keys), np.int64, len(keys)), out=offsets[1:])
        pool = "".join(keys).encode("utf-32-le")  # (a surrogate raises UnicodeEncodeError: no table)
        classes = np.ascontiguousarray(classes, np.uint8)
        assert classes.shape == (0x110000,)
        ptr = lib.lib.wp_new(
            classes.ctypes.data,
            pool,
            len(pool) // 4,
            offsets.ctypes.data,
            ids.ctypes.data,
            tail.ctypes.data,
            len(keys),
            unk_id,
            max_chars,
            max_head,
            max_tail,
        )
        if not ptr:
            raise MemoryError("the C tokenizer's tables")
        self._ptr = ptr
        self._local = threading.local()  # this thread's output buffers
        self._u8, self._u32 = lib.lib.wp_tokenize_u8, lib.lib.wp_tokenize_u32
        weakref.finalize(self, lib.lib.wp_free, ptr)

    def run(self, text: str, mode: int = 0, n_lines: int = 0) -> tuple[np.ndarray, np.ndarray | None] | None:
        """Ids of normalized ``text`` and, with ``WP_LINES``, each of its ``n_lines`` lines' count
        of them (``text`` must hold ``n_lines - 1`` newlines). Both are views of this thread's
        buffers, valid until its next call: copy or convert them first. None when the text holds
        a surrogate (UTF-32 cannot say it): the caller goes the Python way."""
        n = len(text)
        if text.isascii():
            data, fn = text.encode("ascii"), self._u8
        else:
            try:
                data, fn = text.encode("utf-32-le"), self._u32
            except UnicodeEncodeError:
                return None
        return self._call(fn, data, n, mode, n_lines, None, 0)

    def run_marked(self, chars: np.ndarray, marks: np.ndarray, n_lines: int) -> tuple[np.ndarray, np.ndarray]:
        """``run(marked text, WP_LINES | WP_WORDS, n_lines)`` from the unmarked text's code points
        (uint32) and the sorted positions of the CJK characters that continue a word (int64):
        the ids are the same, without making the marked text."""
        chars = np.ascontiguousarray(chars, np.uint32)
        marks = np.ascontiguousarray(marks, np.int64)
        return self._call(
            self._u32,
            chars.ctypes.data,
            len(chars),
            WP_LINES | WP_WORDS,
            n_lines,
            marks.ctypes.data if len(marks) else None,
            len(marks),
        )

    def _call(self, fn, data, n: int, mode: int, n_lines: int, marks, n_marks: int):
        out, out_at, lengths, lengths_at = self._buffers(max(n, 1), n_lines)  # (each id takes >= 1 character)
        k = fn(self._ptr, data, n, mode, out_at, lengths_at, n_lines, marks, n_marks)
        return out[:k], (lengths[:n_lines] if mode & WP_LINES else None)

    _KEEP = 1 << 20  # largest buffers kept between calls (4 + 8 MB); a bigger call allocates its own

    def _buffers(self, n: int, n_lines: int) -> tuple[np.ndarray, int, np.ndarray, int]:
        """Output buffers of at least these sizes with their addresses (``.ctypes.data`` costs a
        microsecond a call: short documents make many calls)."""
        kept = getattr(self._local, "buffers", None)
        if kept is not None and len(kept[0]) >= n and len(kept[2]) >= n_lines:
            return kept
        out = np.empty(max(n, 4096) if n <= self._KEEP else n, np.int32)
        lengths = np.empty(max(n_lines, 1024) if n_lines <= self._KEEP else n_lines, np.int64)
        made = (out, out.ctypes.data, lengths, lengths.ctypes.data)
        if n <= self._KEEP and n_lines <= self._KEEP:
            self._local.buffers = made
        return made


_LOADED: _Library | NativeError | None = None  # this process's attempt (a failure is not retried)
_WARNED = False


def load() -> _Library:
    """The library (loaded once per process). Raises ``NativeError``."""
    global _LOADED
    if _LOADED is None:
        try:
            _LOADED = _Library(library_path())
        except NativeError as e:
            _LOADED = e
        except (OSError, AttributeError) as e:  # not a library for this machine, or not ours
            _LOADED = NativeError(f"cannot load the C tokenizer: {e}: {REINSTALL}")
    if isinstance(_LOADED, NativeError):
        raise _LOADED
    return _LOADED


def available() -> _Library | None:
    """The library when the native path is to be used, else None (after one warning per process,
    unless ``FLEET_NATIVE=0`` asked for Python). ``FLEET_NATIVE=1`` raises instead."""
    global _WARNED
    want = mode()
    if want == "0":
        return None
    try:
        return load()
    except NativeError as e:
        if want == "1":
            raise NativeError(f"FLEET_NATIVE=1 but the C tokenizer is unavailable: {e}") from None
        if not _WARNED:
            _WARNED = True
            print(f"fleet: {e}: tokenizing in Python, about 3x slower", file=sys.stderr, flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    """Say which path tokenizes here (VM start-up logs it): 0 and the library, or 1 and why not."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        print("usage: python -m fleet_jobs.text.tokenizers.native", file=sys.stderr)
        return 2
    try:
        print(load().path)
    except NativeError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
