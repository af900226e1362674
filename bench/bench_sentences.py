"""What split_sentences changes on a paragraph-per-line corpus: tokens per line and tokens truncated.

The sample corpus (corpus/, a line per sentence or short paragraph) is turned into a
paragraph-per-line corpus deterministically, as Wikipedia dumps and hub datasets come:
the lines of each document joined into one line ("document"), or every N lines of a
document joined ("N lines"). Lines are joined with a space, or with nothing between two
Chinese characters. Each corpus is then counted as it is and cut by split_sentences
(fleet_jobs/text/tools/survey.py: tokens per line, lines that do not fit in one example,
tokens the ELECTRA builder truncates), and the splitter's own speed is timed.

    .venv/bin/python bench/bench_sentences.py [--vocab vocab.txt] [--max-seq-length 128] [--group 8]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fleet_jobs.electra_zh_en.builder import ExampleBuilder  # noqa: E402
from fleet_jobs.text.sentences import split_sentences  # noqa: E402
from fleet_jobs.text.tools.survey import Side, Survey  # noqa: E402
from fleet_jobs.text.tokenizers.tokenization import BertTokenizer  # noqa: E402
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab  # noqa: E402

_CJK_END = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]$")
_CJK_START = re.compile(r"^[\u4e00-\u9fff]")


def documents() -> list[list[str]]:
    docs = []
    for name in ("sample_zh.txt", "sample_en.txt"):
        with open(os.path.join(ROOT, "corpus", name), encoding="utf-8") as f:
            docs += [[line for line in block.split("\n") if line.strip()] for block in f.read().split("\n\n")]
    return [d for d in docs if d]


def join(lines: list[str]) -> str:
    out = lines[0].strip()
    for line in lines[1:]:
        line = line.strip()
        out += ("" if _CJK_END.search(out) and _CJK_START.match(line) else " ") + line
    return out


def paragraphs(docs: list[list[str]], group: int) -> list[list[str]]:
    """Each document's lines joined in runs of ``group`` (0: the whole document in one line)."""
    if group == 0:
        return [[join(d)] for d in docs]
    return [[join(d[i : i + group]) for i in range(0, len(d), group)] for d in docs]


def row(name: str, side: Side, max_seq_length: int) -> str:
    p = side.percentiles()
    return (
        f"| {name} | {side.lines:,} | {p['p50']:.0f} / {p['p90']:.0f} / {p['mean']:.1f} | "
        f"{side.long_lines / side.lines:.1%} | {side.dropped / side.tokens:.1%} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", help="a vocab.txt (default: one trained on the sample corpus, 21128 pieces)")
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--group", type=int, default=8, help="lines per paragraph for the second corpus")
    args = ap.parse_args()
    docs = documents()
    vocab = args.vocab
    if vocab is None:
        vocab = os.path.join(tempfile.mkdtemp(), "vocab.txt")
        write_vocab(train_vocab((line for d in docs for line in d), 21128), vocab)
    tokenizer = BertTokenizer.from_file(vocab)
    seq = args.max_seq_length
    print(
        f"sample corpus: {len(docs)} documents, {sum(map(len, docs)):,} lines; max_seq_length {seq}; "
        f"ELECTRA builder; lines that do not fit: over {seq - 2} tokens"
    )
    print()
    print("| corpus | lines | tokens per line p50 / p90 / mean | lines that do not fit | tokens truncated |")
    print("| --- | --- | --- | --- | --- |")
    for label, corpus in (
        ("sample as it ships (a line per sentence or short paragraph)", docs),
        (f"paragraphs of {args.group} lines", paragraphs(docs, args.group)),
        ("a document per line", paragraphs(docs, 0)),
    ):
        survey = Survey(
            tokenizer,
            lambda: ExampleBuilder(seq, tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"], random.Random(0)),
            seq,
        )
        for d in corpus:
            survey.add(d)
        print(row(label, survey.as_read, seq))
        print(row(f"{label}, split_sentences", survey.split, seq))
    lines = [line for d in paragraphs(docs, args.group) for line in d]
    size = sum(len(line.encode()) for line in lines)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for line in lines:
            split_sentences(line)
        best = min(best, time.perf_counter() - t)
    print()
    print(
        f"split_sentences speed: {size / best / 1e6:.1f} MB/s of text on one core "
        f"(paragraphs of {args.group} lines, best of 3)"
    )


if __name__ == "__main__":
    main()
