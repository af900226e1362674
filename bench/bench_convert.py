"""Throughput of the electra_zh_en conversion, per core, next to Hugging Face ``tokenizers``.

    .venv/bin/python bench/bench_convert.py [--repeat N] [--vocab vocab.txt]

MB/s is UTF-8 text megabytes (10^6) per CPU second of this process (so a
multi-threaded library cannot look faster than one core); wall-clock MB/s is
shown beside it. Input: corpus/sample_zh.txt and corpus/sample_en.txt, read as
the fleet reads them (documents of non-blank lines), repeated N times.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one core
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import io
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fleet.inputs import read_all  # noqa: E402
from fleet.job import ItemContext, Sink  # noqa: E402
from jobs.electra_zh_en import JOB, ElectraConverter  # noqa: E402
from jobs.electra_zh_en.tokenization import BertTokenizer  # noqa: E402


class MemorySink(Sink):
    def __init__(self):
        self.files: dict[str, io.BytesIO] = {}

    def open(self, suffix):
        f = self.files[suffix] = _KeepOpen()
        return f


class _KeepOpen(io.BytesIO):
    def close(self):  # keep the bytes readable after the converter's ``with``
        pass


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def timed(fn, rounds):
    """Best (cpu, wall) seconds over rounds."""
    best = None
    for _ in range(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        c, w = time.process_time() - c0, time.perf_counter() - w0
        best = (c, w) if best is None or c < best[0] else best
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="concatenate the sample N times")
    ap.add_argument("--rounds", type=int, default=3, help="time each row this many times, keep the best")
    ap.add_argument("--vocab", help="vocab.txt (default: train one of 21128 on the sample)")
    ap.add_argument("--max-seq-length", type=int, default=128)
    args = ap.parse_args()

    from tokenizers import BertWordPieceTokenizer

    corpora = {}
    for lang in ("zh", "en"):
        with open(os.path.join(ROOT, "corpus", f"sample_{lang}.txt"), "rb") as f:
            corpora[lang] = read_all(f.read(), f"sample_{lang}.txt") * args.repeat
    corpora["zh+en"] = corpora["zh"] + corpora["en"]

    tmp = tempfile.TemporaryDirectory(prefix="bench-")  # removed at exit
    vocab_path = args.vocab
    if not vocab_path:
        from jobs.electra_zh_en.vocab import train_vocab, write_vocab

        vocab_path = os.path.join(tmp.name, "vocab.txt")
        write_vocab(train_vocab((line for doc in corpora["zh+en"] for line in doc), 21128), vocab_path)

    config = JOB.parse_config({"vocab_file": vocab_path, "max_seq_length": args.max_seq_length})
    converter = JOB.converter(config, read_file)
    tok = BertTokenizer.from_file(vocab_path)
    ref = BertWordPieceTokenizer(vocab_path, lowercase=True)
    ref._tokenizer.model.max_input_chars_per_word = 200  # BERT's limit, as ours

    def rows(docs):
        lines = [line for doc in docs for line in doc]
        ctx = ItemContext("bench", 1, "bench")

        def cold():  # a new tokenizer: its token -> ids cache starts empty
            cold_converter = ElectraConverter(config, BertTokenizer.from_file(vocab_path))
            c0, w0 = time.process_time(), time.perf_counter()
            cold_converter.convert(docs, ctx, MemorySink())
            return time.process_time() - c0, time.perf_counter() - w0

        return {
            "fleet: tokenize (tokenize_lines per document)": lambda: [tok.tokenize_lines(d) for d in docs],
            "fleet: full conversion (text -> TFRecord bytes)": lambda: converter.convert(docs, ctx, MemorySink()),
            "fleet: full conversion, cold cache, one pass": cold,
            "tokenizers: encode, one call per line": lambda: [ref.encode(x, add_special_tokens=False) for x in lines],
            "tokenizers: encode_batch per document, 1 thread": lambda: [
                ref.encode_batch(d, add_special_tokens=False) for d in docs
            ],
        }

    sizes = {k: sum(len(line.encode()) for doc in docs for line in doc) for k, docs in corpora.items()}
    print(f"input: corpus/sample_zh.txt + corpus/sample_en.txt, repeated {args.repeat}x "
          f"({sizes['zh'] / 1e6:.2f} MB zh + {sizes['en'] / 1e6:.2f} MB en of UTF-8 text); "
          f"max_seq_length {args.max_seq_length}; best of {args.rounds} (warm caches) unless said; "
          f"python {sys.version.split()[0]}")
    print("MB/s per core = text MB / CPU seconds of this process (wall-clock MB/s in brackets)\n")
    names = list(rows([]))
    width = max(map(len, names))
    print(f"{'':{width}}  " + "".join(f"{k:>18}" for k in corpora))
    results = {k: rows(docs) for k, docs in corpora.items()}
    for name in names:
        cells = []
        for k in corpora:
            if "cold" in name:
                cpu, wall = results[k][name]()
            else:
                cpu, wall = timed(results[k][name], args.rounds)
            cells.append(f"{sizes[k] / cpu / 1e6:7.2f} ({sizes[k] / wall / 1e6:6.2f})")
        print(f"{name:{width}}  " + "".join(f"{c:>18}" for c in cells))

    sink = MemorySink()
    stats = converter.convert(corpora["zh+en"], ItemContext("bench", 1, "bench"), sink)
    out = sink.files[".tfrecord"].getbuffer().nbytes
    print(f"\nzh+en: {stats['examples']} examples, fill ratio {JOB.summarize(stats)['fill_ratio']:.3f}, "
          f"{out / 1e6:.2f} MB of TFRecords")


if __name__ == "__main__":
    main()
