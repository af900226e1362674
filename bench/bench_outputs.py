"""Throughput per core of the text jobs by output format: TFRecord next to Parquet and MDS, for
electra_zh_en (format=electra, format=bert) and causal_lm (BERT vocab, byte-level BPE).

    .venv/bin/python bench/bench_outputs.py [--repeat N] [--rounds 3]

MB/s is UTF-8 text megabytes (10^6) per CPU second of this process, over
corpus/sample_zh.txt + corpus/sample_en.txt as the fleet reads them, in one item;
the output size of each row is printed beside it.
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

from fleet_jobs.text.inputs import read_all  # noqa: E402
from fleet.job import ItemContext, Sink, load_job  # noqa: E402
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab  # noqa: E402


class MemorySink(Sink):
    def __init__(self):
        self.files: dict[str, io.BytesIO] = {}

    def open(self, suffix):
        f = self.files[suffix] = io.BytesIO()
        f.close = lambda: None  # keep the bytes readable after the writer closes it
        return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="concatenate the sample N times")
    ap.add_argument("--rounds", type=int, default=3, help="time each row this many times, keep the best")
    args = ap.parse_args()

    docs = []
    for lang in ("zh", "en"):
        with open(os.path.join(ROOT, "corpus", f"sample_{lang}.txt"), "rb") as f:
            docs += read_all(f.read(), f"sample_{lang}.txt")
    docs *= args.repeat
    size = sum(len(line.encode()) for doc in docs for line in doc)
    tmp = tempfile.mkdtemp(prefix="bench-outputs-")
    vocab = os.path.join(tmp, "vocab.txt")
    write_vocab(train_vocab((line for doc in docs for line in doc), 21128), vocab)
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        ("\n".join(d) for d in docs), vocab_size=32000, special_tokens=["<|endoftext|>"], show_progress=False
    )
    bpe_path = os.path.join(tmp, "tokenizer.json")
    bpe.save(bpe_path)

    rows = {
        "electra_zh_en format=electra": ("electra_zh_en", {"vocab_file": vocab}),
        "electra_zh_en format=bert": ("bert", {"vocab_file": vocab}),  # the bert job, format=bert before
        "causal_lm vocab.txt, 512": ("causal_lm", {"vocab_file": vocab, "max_seq_length": 512}),
        "causal_lm byte-level BPE, 512": ("causal_lm", {"tokenizer_file": bpe_path, "max_seq_length": 512}),
    }
    print(
        f"input: corpus/sample_zh.txt + corpus/sample_en.txt x{args.repeat} ({size / 1e6:.2f} MB of text, "
        f"one item); best of {args.rounds}; MB/s of text per CPU second; python {sys.version.split()[0]}\n"
    )
    width = max(map(len, rows)) + 2
    print(f"{'':{width}}{'tfrecord':>24}{'parquet':>24}{'mds':>24}")
    for label, (name, options) in rows.items():
        job = load_job(name)
        cells = []
        for output in ("tfrecord", "parquet", "mds"):
            config = job.parse_config({**options, "output": output})
            converter = job.document_converter(config, lambda p: open(p, "rb").read())
            best = float("inf")
            for _ in range(args.rounds):
                sink = MemorySink()
                c0 = time.process_time()
                converter.convert(iter(docs), ItemContext("bench", 1, "bench"), sink)
                best = min(best, time.process_time() - c0)
            out = sum(f.getbuffer().nbytes for f in sink.files.values())
            cells.append(f"{size / best / 1e6:7.2f} MB/s {out / 1e6:7.2f} MB")
        print(f"{label:{width}}" + "".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
