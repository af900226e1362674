"""Small tokenizers trained on a test's documents (lists of lines), saved where a job option can name them."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from typing import Callable

from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab


def bpe_json(documents, folder: str, vocab_size: int) -> str:
    """A byte-level BPE (GPT-2's kind) with <|endoftext|>, as a tokenizer.json."""
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        ("\n".join(d) for d in documents), vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False
    )
    path = os.path.join(folder, "tokenizer.json")
    tokenizer.save(path)
    return path


def wordpiece_vocab(documents, folder: str, size: int) -> str:
    """A BERT vocab.txt."""
    path = os.path.join(folder, "vocab.txt")
    write_vocab(train_vocab((line for d in documents for line in d), size), path)
    return path


def built_once(tmp_path_factory, name: str, key: bytes, build: Callable[[Path], None]) -> Path:
    """A folder that ``build`` fills once per session, shared by the xdist workers (each module's
    fixtures run on whichever worker gets its tests, so both may ask): named by ``key`` (what the
    content depends on), under the session's temporary folder, built under a file lock by the first
    worker to ask while the other waits. A marker written last says it is complete."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above the workers' own
    folder = base / f"{name}-{hashlib.sha256(key).hexdigest()[:16]}"
    done = folder / ".built"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            folder.mkdir(parents=True, exist_ok=True)
            build(folder)
            done.touch()
    return folder
