"""The C core of ``BertTokenizer`` (``wordpiece.c``): built on first use, loaded with ctypes.

``tokenization.BertTokenizer`` normalizes text with whole-string operations (C speed already);
what is left is per basic token: a ``str`` per token from ``re.findall``, a dict lookup, numpy
over a ``map``. ``wordpiece.c`` does that part over the normalized text's code points. The
Python code stays as the fallback and as the reference: both give the same ids
(tests/test_native.py), so records never depend on which ran.

The library is compiled with the system C compiler (``$CC``, else ``cc``, else ``gcc``) the
first time a process needs it, into ``$FLEET_NATIVE_CACHE`` (default
``$XDG_CACHE_HOME/fleet/native`` or ``~/.cache/fleet/native``) under a name keyed by the
source, the flags and the machine, so a changed source builds again and a cached one loads
in a millisecond. Several processes may build at once: each builds to a temporary name and
renames it into place.

``FLEET_NATIVE``: ``0`` always Python; ``1`` native or an error; unset: native when it builds,
else Python after one warning line on stderr per process.

    python -m jobs.text.native build    # build now (VM start-up), print the library's path
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import sys
import threading
import weakref
from pathlib import Path
from typing import Mapping

import numpy as np

SOURCE = Path(__file__).with_name("wordpiece.c")
FLAGS = ("-O2", "-shared", "-fPIC", "-std=c99")
ABI_VERSION = 2

# The class bits of wordpiece.c.
CLS_WS, CLS_CJK, CLS_PUNCT, CLS_MARK = 1, 2, 4, 8
WP_LINES, WP_WORDS = 1, 2


class NativeError(RuntimeError):
    """The C library cannot be built or loaded; the message says why and what to do."""


def mode() -> str:
    """``FLEET_NATIVE``: "0" (Python only), "1" (native required) or "" (native when it builds)."""
    value = os.environ.get("FLEET_NATIVE", "").strip()
    if value not in ("", "0", "1"):
        raise NativeError(f"FLEET_NATIVE={value!r}: use 0 (Python), 1 (native, or fail) or leave it unset")
    return value


def cache_dir() -> Path:
    if os.environ.get("FLEET_NATIVE_CACHE"):
        return Path(os.environ["FLEET_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleet" / "native"


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC`` (may hold arguments), else ``cc``, else ``gcc``."""
    import shutil

    cc = os.environ.get("CC", "").split()
    if cc:
        return cc if shutil.which(cc[0]) else None
    for name in ("cc", "gcc"):
        if shutil.which(name):
            return [name]
    return None


def library_path() -> Path:
    """Where the library for this source, these flags and this machine lives (built or not)."""
    key = hashlib.sha256(SOURCE.read_bytes() + repr((FLAGS, platform.machine())).encode()).hexdigest()[:20]
    return cache_dir() / f"wordpiece-{key}.so"


def build() -> Path:
    """The library's path, compiling it first if it is not in the cache. Raises ``NativeError``."""
    try:
        path = library_path()
    except OSError as e:
        raise NativeError(f"cannot read {SOURCE}: {e.strerror}") from None
    if path.exists():
        return path
    import subprocess  # (only to build: loading a built library stays a millisecond)
    import tempfile

    cc = compiler()
    if cc is None:
        named = f"CC={os.environ['CC']!r} is not" if os.environ.get("CC", "").strip() else "no C compiler (cc/gcc)"
        raise NativeError(f"{named} found; install gcc")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".so", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise NativeError(f"cannot write to {path.parent}: {e.strerror} (set FLEET_NATIVE_CACHE)") from None
    try:
        try:
            done = subprocess.run([*cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True,
                                  timeout=300, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NativeError(f"{' '.join(cc)} could not run: {e}") from None
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise NativeError(f"{' '.join(cc)} failed on {SOURCE.name}: {said}")
        try:  # before it goes into place: a cached library that does not load would stay there
            _Library(Path(tmp))
        except (OSError, NativeError) as e:
            raise NativeError(f"{' '.join(cc)} made a library that does not load: {e}") from None
        os.chmod(tmp, 0o755)  # mkstemp made it 0600: other users (the VM's workers) load it too
        os.replace(tmp, path)  # atomic: a process building at the same time replaces it with the same
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


class _Library:
    """The loaded library with its functions' signatures."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        if lib.wp_abi_version() != ABI_VERSION:
            raise NativeError(f"{path}: ABI {lib.wp_abi_version()}, expected {ABI_VERSION}")
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
        lib.wp_new.restype = p
        lib.wp_new.argtypes = [p, p, i64, p, p, p, i64, i32, i64, i64, i64]
        lib.wp_free.restype = None
        lib.wp_free.argtypes = [p]
        for f in (lib.wp_tokenize_u32, lib.wp_tokenize_u8):
            f.restype = i64
            f.argtypes = [p, p, i64, ctypes.c_int, p, p, i64, p, i64]
        self.lib, self.path = lib, path


class Table:
    """One tokenizer's C tables (vocab hash tables and the code point classes), freed with it.
    Read-only once made: calls from several threads at once are safe (ctypes drops the GIL)."""

    def __init__(self, lib: _Library, classes: np.ndarray, vocab: Mapping[str, int], unk_id: int,
                 max_chars: int, max_head: int, max_tail: int):
        # Every token as a head piece (exactly ``word[:end] in vocab``), and each "##" token's
        # rest as a continuation piece (exactly ``"##" + word[start:end] in vocab``).
        tails = [t for t in vocab if t.startswith("##")]
        keys = [*vocab, *(t[2:] for t in tails)]
        ids = np.fromiter([*vocab.values(), *(vocab[t] for t in tails)], np.int32, len(keys))
        tail = np.zeros(len(keys), np.uint8)
        tail[len(vocab):] = 1
        offsets = np.zeros(len(keys) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, keys), np.int64, len(keys)), out=offsets[1:])
        pool = "".join(keys).encode("utf-32-le")  # (a surrogate raises UnicodeEncodeError: no table)
        classes = np.ascontiguousarray(classes, np.uint8)
        assert classes.shape == (0x110000,)
        ptr = lib.lib.wp_new(classes.ctypes.data, pool, len(pool) // 4, offsets.ctypes.data, ids.ctypes.data,
                             tail.ctypes.data, len(keys), unk_id, max_chars, max_head, max_tail)
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
        return self._call(self._u32, chars.ctypes.data, len(chars), WP_LINES | WP_WORDS, n_lines,
                          marks.ctypes.data if len(marks) else None, len(marks))

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
    """The library, built if needed (once per process). Raises ``NativeError``."""
    global _LOADED
    if _LOADED is None:
        try:
            _LOADED = _Library(build())
        except NativeError as e:
            _LOADED = e
        except OSError as e:  # a cached file that does not load (truncated, another arch)
            _LOADED = NativeError(f"cannot load the C tokenizer: {e}")
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
    args = sys.argv[1:] if argv is None else argv
    if args != ["build"]:
        print("usage: python -m jobs.text.native build", file=sys.stderr)
        return 2
    try:
        print(load().path)
    except NativeError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
