"""The short-document corpus of the benchmarks: the sample cut into documents of 1-3 lines.

Real corpora are often short documents (web text, subtitles, QA pairs, forum posts); there the
cost per document and per example dominates, not the cost per byte. This corpus is the sample's
own lines (so the same vocab fits), regrouped into about 7,100 documents instead of 131:
deterministic (``random.Random(0)``), each language's lines in their order.

    .venv/bin/python bench/short_corpus.py OUT.txt [--repeat N]   # BERT's input format, blank lines between documents
"""

from __future__ import annotations

import argparse
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = {lang: os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("zh", "en")}


def short_documents(text: bytes, seed: int = 0) -> bytes:
    """``text`` (BERT's format) with its non-blank lines regrouped into documents of 1-3 lines."""
    lines = [line for line in text.split(b"\n") if line.strip()]
    rng, out, i = random.Random(seed), [], 0
    while i < len(lines):
        n = rng.randint(1, 3)
        out.append(b"\n".join(lines[i : i + n]) + b"\n\n")
        i += n
    return b"".join(out)


def short_sample() -> dict[str, bytes]:
    """{zh, en}: each sample file cut into short documents."""
    result = {}
    for lang, path in SAMPLES.items():
        with open(path, "rb") as f:
            result[lang] = short_documents(f.read())
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--repeat", type=int, default=1, help="each language's part this many times")
    args = ap.parse_args()
    parts = short_sample()
    with open(args.out, "wb") as f:
        for lang in ("zh", "en"):
            f.write(parts[lang] * args.repeat)


if __name__ == "__main__":
    main()
