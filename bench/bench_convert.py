"""Throughput of the electra_zh_en conversion per core (format=electra and format=bert), next to
Hugging Face ``tokenizers`` on the same text, and the peak RSS of a worker converting a big item.

    .venv/bin/python bench/bench_convert.py [--repeat N] [--vocab vocab.txt] [--rss-mb 64]

MB/s is UTF-8 text megabytes (10^6) per CPU second of this process (so a
multi-threaded library cannot look faster than one core); wall-clock MB/s is
shown beside it. Input: corpus/sample_zh.txt and corpus/sample_en.txt, read as
the fleet reads them (documents of non-blank lines), repeated N times.

Peak RSS: a fresh process per row converts the sample repeated to about
``--rss-mb`` MB (one item as big as ``fleet plan`` makes them), streaming the
documents from a file as a worker does and writing the records to a file,
then reports its ``ru_maxrss``. Linux carries a parent's peak into a child's
``ru_maxrss`` across fork and exec, so these processes are started first,
while this one is still small; the child's own ``VmHWM`` is printed beside it.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one core
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fleet.inputs import read_all  # noqa: E402
from fleet.job import ItemContext, Sink  # noqa: E402
from jobs.electra_zh_en import JOB  # noqa: E402
from jobs.text.tokenization import BertTokenizer  # noqa: E402

FORMATS = {  # row label -> job options
    "format=electra": {"format": "electra"},
    "format=bert": {"format": "bert"},
}


class MemorySink(Sink):
    def __init__(self):
        self.files: dict[str, io.BytesIO] = {}

    def open(self, suffix):
        f = self.files[suffix] = _KeepOpen()
        return f


class _KeepOpen(io.BytesIO):
    def close(self):  # keep the bytes readable after the converter's ``with``
        pass


class FileSink(Sink):
    def __init__(self, folder: str):
        self.folder = folder

    def open(self, suffix):
        return open(os.path.join(self.folder, "out" + suffix), "wb")


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


def rss_child(path: str, vocab_path: str, options: dict) -> None:
    """In a fresh process: convert one big item, print MB/s and peak RSS as JSON."""
    from fleet.inputs import iter_path_documents

    config = JOB.parse_config({"vocab_file": vocab_path, **options})
    converter = JOB.converter(config, read_file)
    with tempfile.TemporaryDirectory(prefix="bench-rss-") as out:
        c0, w0 = time.process_time(), time.perf_counter()
        stats = converter.convert(iter_path_documents([path]), ItemContext("big", 7, path), FileSink(out))
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        out_bytes = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    hwm = None
    try:
        with open("/proc/self/status") as f:
            hwm = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        pass
    print(json.dumps({"text_mb": stats["text_bytes"] / 1e6, "cpu": cpu, "wall": wall, "examples": stats["examples"],
                      "out_mb": out_bytes / 1e6,
                      "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "hwm_mib": hwm}))


RSS_ROWS = [*FORMATS.items(), ("format=bert, dupe_factor=3", {"format": "bert", "dupe_factor": 3})]  # MB/s: of input


def peak_rss(raw: dict[str, bytes], vocab_path: str, mb: float, max_seq_length: int, folder: str) -> list[str]:
    """Run the big-item conversions, each in a fresh process; their report lines."""
    big = os.path.join(folder, "big.txt")
    one = raw["zh"].rstrip(b"\n") + b"\n\n" + raw["en"].rstrip(b"\n") + b"\n\n"
    copies = max(1, round(mb * 1e6 / len(one)))
    with open(big, "wb") as f:
        for _ in range(copies):
            f.write(one)
    lines = [f"peak RSS of a fresh process converting one item of {os.path.getsize(big) / 1e6:.1f} MB "
             f"(the sample {copies}x), streamed from a file to a file (this process: "
             f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB when they started):"]
    for label, options in RSS_ROWS:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--rss-child", big, vocab_path,
                               json.dumps({"max_seq_length": max_seq_length, **options})],
                              capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout)
        hwm = f", VmHWM {r['hwm_mib']:.0f}" if r["hwm_mib"] else ""
        lines.append(f"  {label:28} ru_maxrss {r['maxrss_mib']:4.0f} MiB{hwm}; {r['text_mb'] / r['cpu']:5.2f} MB/s "
                     f"per core ({r['text_mb'] / r['wall']:.2f} wall), {r['examples']:,} examples, "
                     f"{r['out_mb']:.0f} MB out")
    os.unlink(big)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="concatenate the sample N times")
    ap.add_argument("--rounds", type=int, default=3, help="time each row this many times, keep the best")
    ap.add_argument("--vocab", help="vocab.txt (default: train one of 21128 on the sample)")
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--rss-mb", type=float, default=64, help="size of the big item for peak RSS (0: skip)")
    ap.add_argument("--rss-child", nargs=3, metavar=("PATH", "VOCAB", "OPTIONS_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args.rss_child[0], args.rss_child[1], json.loads(args.rss_child[2]))
        return

    raw = {}
    samples = [os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("zh", "en")]
    for lang, path in zip(("zh", "en"), samples):
        with open(path, "rb") as f:
            raw[lang] = f.read()
    tmp = tempfile.TemporaryDirectory(prefix="bench-")  # removed at exit
    vocab_path = args.vocab
    if not vocab_path:  # in another process, so this one stays small until the peak RSS rows ran
        vocab_path = os.path.join(tmp.name, "vocab.txt")
        subprocess.run([sys.executable, "-m", "jobs.electra_zh_en", "vocab", *samples, "--size", "21128",
                        "--out", vocab_path], cwd=ROOT, check=True, capture_output=True)
    rss_lines = peak_rss(raw, vocab_path, args.rss_mb, args.max_seq_length, tmp.name) if args.rss_mb > 0 else []

    from tokenizers import BertWordPieceTokenizer

    corpora = {lang: read_all(raw[lang], f"sample_{lang}.txt") * args.repeat for lang in ("zh", "en")}
    corpora["zh+en"] = corpora["zh"] + corpora["en"]

    def make(options):
        config = JOB.parse_config({"vocab_file": vocab_path, "max_seq_length": args.max_seq_length, **options})
        return config, JOB.converter(config, read_file)

    converters = {label: make(options) for label, options in FORMATS.items()}
    tok = BertTokenizer.from_file(vocab_path)
    import rjieba

    ref = BertWordPieceTokenizer(vocab_path, lowercase=True)
    ref._tokenizer.model.max_input_chars_per_word = 200  # BERT's limit, as ours

    def rows(docs):
        lines = [line for doc in docs for line in doc]
        ctx = ItemContext("bench", 1, "bench")

        def cold(options):  # a new tokenizer: its token -> ids cache starts empty
            def run():
                config = JOB.parse_config({"vocab_file": vocab_path, "max_seq_length": args.max_seq_length, **options})
                converter = type(converters["format=" + config.format][1])(config, BertTokenizer.from_file(vocab_path))
                c0, w0 = time.process_time(), time.perf_counter()
                converter.convert(docs, ctx, MemorySink())
                return time.process_time() - c0, time.perf_counter() - w0
            return run

        table = {
            "fleet: tokenize (tokenize_lines per document)": lambda: [tok.tokenize_lines(d) for d in docs],
            "fleet: tokenize + rjieba words (whole-word masking)": lambda: [
                tok.tokenize_lines_words(d, rjieba.cut) for d in docs],
        }
        for label, (_, converter) in converters.items():
            table[f"fleet: {label}, full conversion (text -> TFRecord bytes)"] = (
                lambda c=converter: c.convert(docs, ctx, MemorySink()))
            table[f"fleet: {label}, full conversion, cold cache, one pass"] = cold(FORMATS[label])
        table["tokenizers: encode, one call per line"] = lambda: [
            ref.encode(x, add_special_tokens=False) for x in lines]
        table["tokenizers: encode_batch per document, 1 thread"] = lambda: [
            ref.encode_batch(d, add_special_tokens=False) for d in docs]
        return table

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
    speed: dict[str, float] = {}
    for name in names:
        cells = []
        for k in corpora:
            if "cold" in name:
                cpu, wall = results[k][name]()
            else:
                cpu, wall = timed(results[k][name], args.rounds)
            cells.append(f"{sizes[k] / cpu / 1e6:7.2f} ({sizes[k] / wall / 1e6:6.2f})")
            if k == "zh+en":
                speed[name] = sizes[k] / cpu / 1e6
        print(f"{name:{width}}  " + "".join(f"{c:>18}" for c in cells))

    ref_speed = speed["tokenizers: encode, one call per line"]
    print("\nzh+en, this run, relative to tokenizers (encode per line):")
    for label in FORMATS:
        s = speed[f"fleet: {label}, full conversion (text -> TFRecord bytes)"]
        print(f"  {label}: {s:.2f} MB/s per core, {s / ref_speed:.2f}x the {ref_speed:.2f} MB/s of tokenizers "
              f"(which only tokenizes)")
    for label, (config, converter) in converters.items():
        sink = MemorySink()
        stats = converter.convert(corpora["zh+en"], ItemContext("bench", 1, "bench"), sink)
        out = sum(f.getbuffer().nbytes for f in sink.files.values())
        extra = "".join(f", {k} {v:.3f}" for k, v in JOB.summarize(stats).items())
        print(f"  {label}: {stats['examples']} examples{extra}, {out / 1e6:.2f} MB of TFRecords")

    if rss_lines:
        print()
        print("\n".join(rss_lines))


if __name__ == "__main__":
    main()
