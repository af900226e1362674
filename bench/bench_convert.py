"""Throughput of the electra_zh_en conversion per core (format=electra and format=bert), next to
Hugging Face ``tokenizers`` on the same text, on two corpora; whole-process figures of ``fleet
local``; its start-up and local scaling; and the peak RSS of a worker converting a big item.

    .venv/bin/python bench/bench_convert.py [--repeat N] [--whole-repeat M] [--vocab vocab.txt] [--rss-mb 64]

Two corpora, every figure for both: "long" is corpus/sample_zh.txt + corpus/sample_en.txt (131
man pages, long documents); "short" is the same lines cut into documents of 1-3 lines
(``bench/short_corpus.py``: 7,122 documents), where the cost per document and per example
dominates, as in web text, subtitles or QA pairs.

In-process rows: MB/s is UTF-8 text megabytes (10^6) per CPU second of this process (so a
multi-threaded library cannot look faster than one core); wall-clock MB/s is shown beside it.
Input: the corpus read as the fleet reads it (documents of non-blank lines), repeated N times.

Whole-process rows: each corpus repeated M times into one file, then, each in a fresh process,
``fleet local FILE OUT --workers 1`` (planning, the worker process, the report: everything from
start to exit) and a script that reads the file and tokenizes its lines with ``tokenizers``'
``BertWordPieceTokenizer.encode_batch`` in batches of 10,000 lines (one thread), the baseline the
goals are stated against. CPU = user + system seconds of the process and its children
(``os.wait4``); peak RSS = the largest ``ru_maxrss`` among them.

Start-up: ``fleet local`` on a one-line file (wall and CPU). Local scaling: ``fleet local
--workers 2`` against ``--workers 1`` on the short corpus in items of ``--scaling-item-mb``
(the same items, so the same records); on a shared 2-core machine this is what the load allows.

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
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fleet_jobs.text.inputs import read_all  # noqa: E402
from short_corpus import short_documents  # noqa: E402
from fleet.job import ItemContext, Sink  # noqa: E402
from fleet.core.discovery import load_configured  # noqa: E402
from fleet_jobs.text.tokenizers.tokenization import BertTokenizer  # noqa: E402

FORMATS = {  # row label -> job options (format=bert: the bert job, under its former name, as runs gave it)
    "format=electra": {"format": "electra"},
    "format=bert": {"format": "bert"},
}


def configured(options: dict):
    """(job, config) for electra_zh_en with ``options``, as a run's spec is read (discovery's rule)."""
    return load_configured("electra_zh_en", options)


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
    from fleet_jobs.text.inputs import iter_path_documents

    job, config = configured({"vocab_file": vocab_path, **options})
    converter = job.document_converter(config, read_file)
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
    print(
        json.dumps(
            {
                "text_mb": stats["text_bytes"] / 1e6,
                "cpu": cpu,
                "wall": wall,
                "examples": stats["examples"],
                "out_mb": out_bytes / 1e6,
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "hwm_mib": hwm,
            }
        )
    )


TOKENIZERS_BASELINE = """
import os, sys
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import BertWordPieceTokenizer
tok = BertWordPieceTokenizer(sys.argv[2], lowercase=True)
with open(sys.argv[1], encoding="utf-8") as f:
    lines = [line for line in f.read().split("\\n") if line.strip()]
for i in range(0, len(lines), 10000):
    tok.encode_batch(lines[i:i + 10000], add_special_tokens=False)
"""


def run_process(cmd: list[str], cwd: str = ROOT, env: dict | None = None) -> dict:
    """Run cmd to its end: CPU seconds (user + system, its waited-for children included), wall
    seconds and the largest peak RSS among the processes (MiB). The other benches time theirs here."""
    w0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - w0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return {"cpu": usage.ru_utime + usage.ru_stime, "wall": wall, "rss_mib": usage.ru_maxrss / 1024}


def fleet_local(
    inputs: list[str], out: str, vocab: str, workers: int, options: dict, item_mb: float | None = None
) -> dict:
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "fleet"),
        "local",
        *inputs,
        out,
        "--workers",
        str(workers),
        "--set",
        f"vocab_file={vocab}",
        *[a for k, v in options.items() for a in ("--set", f"{k}={v}")],
    ]
    if item_mb:
        cmd += ["--item-mb", str(item_mb)]
    r = run_process(cmd)
    with open(os.path.join(out, "summary.json")) as f:
        r["summary"] = json.load(f)
    return r


def whole_process(files: dict[str, str], vocab: str, max_seq_length: int, folder: str, rounds: int) -> list[str]:
    """fleet local --workers 1 per format and the tokenizers baseline, on each corpus file."""
    lines = [
        "whole process, one worker (fleet local --workers 1: plan, worker, report), CPU of the process tree; "
        f"least CPU of {rounds}:"
    ]
    head = f"  {'':44}" + "".join(f"{k:>34}" for k in files)
    lines.append(head)
    results: dict[tuple[str, str], dict] = {}
    rows = [("tokenizers encode_batch (10,000 lines a batch)", None), *FORMATS.items()]
    for _ in range(rounds):
        for label, options in rows:
            for name, path in files.items():
                if options is None:
                    r = run_process([sys.executable, "-c", TOKENIZERS_BASELINE, path, vocab])
                else:
                    out = os.path.join(folder, f"whole-{name}-{label.split('=')[-1]}")
                    shutil.rmtree(out, ignore_errors=True)
                    r = fleet_local([path], out, vocab, 1, {"max_seq_length": max_seq_length, **options})
                    shutil.rmtree(out, ignore_errors=True)
                key = (label, name)
                if key not in results or r["cpu"] < results[key]["cpu"]:
                    results[key] = r
    sizes = {name: text_mb(path) for name, path in files.items()}
    for label, _ in rows:
        cells = [
            f"{sizes[n] / results[label, n]['cpu']:6.2f} MB/s ({results[label, n]['rss_mib']:4.0f} MiB)" for n in files
        ]
        lines.append(f"  {label:44}" + "".join(f"{c:>34}" for c in cells))
    base = rows[0][0]
    for label, _ in rows[1:]:
        ratios = [results[base, n]["cpu"] / results[label, n]["cpu"] for n in files]
        lines.append(f"  {label + ' vs tokenizers':44}" + "".join(f"{f'{r:.2f}x':>34}" for r in ratios))
    lines.append("  (MB/s per core = text MB / CPU s; in brackets the peak RSS of the largest process)")
    return lines


def text_mb(path: str) -> float:
    """MB of UTF-8 text in the file's lines (newlines not counted), as fleet's text_bytes."""
    with open(path, "rb") as f:
        data = f.read()
    return (len(data) - data.count(b"\n")) / 1e6


def startup_and_scaling(short_file: str, vocab: str, folder: str, item_mb: float, rounds: int) -> list[str]:
    tiny = os.path.join(folder, "tiny.txt")
    with open(tiny, "w") as f:
        f.write("hello world\n\n")
    best = None
    for _ in range(max(3, rounds)):
        out = os.path.join(folder, "startup")
        shutil.rmtree(out, ignore_errors=True)
        r = fleet_local([tiny], out, vocab, 1, {})
        best = r if best is None or r["wall"] < best["wall"] else best
    lines = [
        f"fixed start-up of fleet local --workers 1 (a one-line input, best of {max(3, rounds)}): "
        f"{best['wall']:.2f} s wall, {best['cpu']:.2f} s CPU, peak RSS {best['rss_mib']:.0f} MiB"
    ]
    walls = {}
    for workers in (1, 2, 1, 2)[: 2 * max(1, min(2, rounds))]:
        out = os.path.join(folder, f"scaling-{workers}")
        shutil.rmtree(out, ignore_errors=True)
        r = fleet_local([short_file], out, vocab, workers, {}, item_mb=item_mb)
        items = r["summary"]["items"]
        shutil.rmtree(out, ignore_errors=True)
        walls[workers] = min(walls.get(workers, float("inf")), r["wall"])
    load = os.getloadavg()[0]
    lines.append(
        f"local scaling, short corpus in {items} items of {item_mb} MB, format=electra, whole command wall: "
        f"--workers 1 {walls[1]:.2f} s, --workers 2 {walls[2]:.2f} s: {walls[1] / walls[2]:.2f}x "
        f"({os.cpu_count()} CPUs, load average {load:.2f}: other work shares these cores)"
    )
    return lines


RSS_ROWS = [*FORMATS.items(), ("format=bert, dupe_factor=3", {"format": "bert", "dupe_factor": 3})]  # MB/s: of input


def peak_rss(raw: dict[str, bytes], vocab_path: str, mb: float, max_seq_length: int, folder: str) -> list[str]:
    """Run the big-item conversions, each in a fresh process; their report lines."""
    big = os.path.join(folder, "big.txt")
    one = raw["zh"].rstrip(b"\n") + b"\n\n" + raw["en"].rstrip(b"\n") + b"\n\n"
    copies = max(1, round(mb * 1e6 / len(one)))
    with open(big, "wb") as f:
        for _ in range(copies):
            f.write(one)
    lines = [
        f"peak RSS of a fresh process converting one item of {os.path.getsize(big) / 1e6:.1f} MB "
        f"(the sample {copies}x), streamed from a file to a file (this process: "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB when they started):"
    ]
    for label, options in RSS_ROWS:
        proc = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--rss-child",
                big,
                vocab_path,
                json.dumps({"max_seq_length": max_seq_length, **options}),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(proc.stdout)
        hwm = f", VmHWM {r['hwm_mib']:.0f}" if r["hwm_mib"] else ""
        lines.append(
            f"  {label:28} ru_maxrss {r['maxrss_mib']:4.0f} MiB{hwm}; {r['text_mb'] / r['cpu']:5.2f} MB/s "
            f"per core ({r['text_mb'] / r['wall']:.2f} wall), {r['examples']:,} examples, "
            f"{r['out_mb']:.0f} MB out"
        )
    os.unlink(big)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="in-process rows: each corpus N times")
    ap.add_argument("--rounds", type=int, default=3, help="time each row this many times, keep the best")
    ap.add_argument(
        "--whole-repeat",
        type=int,
        default=27,
        help="whole-process rows: each corpus M times (0: skip; 27: about 32 MB, the issue's size)",
    )
    ap.add_argument("--scaling-item-mb", type=float, default=1.0, help="item size of the local scaling runs")
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
    short_raw = short_documents(raw["zh"]) + short_documents(raw["en"])
    tmp = tempfile.TemporaryDirectory(prefix="bench-")  # removed at exit
    vocab_path = args.vocab
    if not vocab_path:  # in another process, so this one stays small until the peak RSS rows ran
        vocab_path = os.path.join(tmp.name, "vocab.txt")
        subprocess.run(
            [sys.executable, "-m", "fleet_jobs.text", "vocab", *samples, "--size", "21128", "--out", vocab_path],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    rss_lines = peak_rss(raw, vocab_path, args.rss_mb, args.max_seq_length, tmp.name) if args.rss_mb > 0 else []
    whole_lines: list[str] = []
    if args.whole_repeat > 0:  # also before this process grows (its children's RSS)
        files = {"long": os.path.join(tmp.name, "long.txt"), "short": os.path.join(tmp.name, "short.txt")}
        with open(files["long"], "wb") as f:
            f.write((raw["zh"].rstrip(b"\n") + b"\n\n" + raw["en"].rstrip(b"\n") + b"\n\n") * args.whole_repeat)
        with open(files["short"], "wb") as f:
            f.write(short_raw * args.whole_repeat)
        whole_lines = whole_process(files, vocab_path, args.max_seq_length, tmp.name, max(1, args.rounds - 1))
        whole_lines += startup_and_scaling(files["short"], vocab_path, tmp.name, args.scaling_item_mb, args.rounds)

    from tokenizers import BertWordPieceTokenizer

    corpora = {f"long {lang}": read_all(raw[lang], f"sample_{lang}.txt") * args.repeat for lang in ("zh", "en")}
    corpora["long"] = corpora["long zh"] + corpora["long en"]
    corpora["short"] = read_all(short_raw, "short.txt") * args.repeat

    def make(options):
        job, config = configured({"vocab_file": vocab_path, "max_seq_length": args.max_seq_length, **options})
        return job, job.document_converter(config, read_file)

    converters = {label: make(options) for label, options in FORMATS.items()}
    tok = BertTokenizer.from_file(vocab_path)
    import rjieba

    ref = BertWordPieceTokenizer(vocab_path, lowercase=True)
    ref._tokenizer.model.max_input_chars_per_word = 200  # BERT's limit, as ours

    def rows(docs):
        lines = [line for doc in docs for line in doc]
        ctx = ItemContext("bench", 1, "bench")

        def cold(label):  # a new tokenizer: its token -> ids cache starts empty
            def run():
                _, config = configured(
                    {"vocab_file": vocab_path, "max_seq_length": args.max_seq_length, **FORMATS[label]}
                )
                converter = type(converters[label][1])(config, BertTokenizer.from_file(vocab_path))
                c0, w0 = time.process_time(), time.perf_counter()
                converter.convert(docs, ctx, MemorySink())
                return time.process_time() - c0, time.perf_counter() - w0

            return run

        table = {
            "fleet: tokenize (tokenize_lines per document)": lambda: [tok.tokenize_lines(d) for d in docs],
            "fleet: tokenize (tokenize_flat, all lines)": lambda: tok.tokenize_flat(lines),
            "fleet: tokenize + rjieba words (whole-word masking)": lambda: tok.tokenize_flat(lines, True, rjieba.cut),
        }
        for label, (_, converter) in converters.items():
            table[f"fleet: {label}, full conversion (text -> TFRecord bytes)"] = lambda c=converter: c.convert(
                docs, ctx, MemorySink()
            )
            table[f"fleet: {label}, full conversion, cold cache, one pass"] = cold(label)
        table["tokenizers: encode, one call per line"] = lambda: [
            ref.encode(x, add_special_tokens=False) for x in lines
        ]
        table[BASELINE] = lambda: [
            ref.encode_batch(lines[i : i + 10000], add_special_tokens=False) for i in range(0, len(lines), 10000)
        ]
        return table

    sizes = {k: sum(len(line.encode()) for doc in docs for line in doc) for k, docs in corpora.items()}
    n_docs = {k: len(docs) for k, docs in corpora.items()}
    print(
        f"input: long = corpus/sample_zh.txt + corpus/sample_en.txt ({n_docs['long']:,} documents), short = the same "
        f"lines in documents of 1-3 lines ({n_docs['short']:,} documents), each repeated {args.repeat}x "
        f"({sizes['long'] / 1e6:.2f} MB and {sizes['short'] / 1e6:.2f} MB of UTF-8 text); "
        f"max_seq_length {args.max_seq_length}; best of {args.rounds} (warm caches) unless said; "
        f"python {sys.version.split()[0]}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
        f"tokenizer core: {tokenizer_core()}"
    )
    print("MB/s per core = text MB / CPU seconds of this process (wall-clock MB/s in brackets)\n")
    names = list(rows([]))
    width = max(map(len, names))
    print(f"{'':{width}}  " + "".join(f"{k:>18}" for k in corpora))
    results = {k: rows(docs) for k, docs in corpora.items()}
    speed: dict[tuple[str, str], float] = {}
    for name in names:
        cells = []
        for k in corpora:
            if "cold" in name:
                cpu, wall = results[k][name]()
            else:
                cpu, wall = timed(results[k][name], args.rounds)
            cells.append(f"{sizes[k] / cpu / 1e6:7.2f} ({sizes[k] / wall / 1e6:6.2f})")
            speed[name, k] = sizes[k] / cpu / 1e6
        print(f"{name:{width}}  " + "".join(f"{c:>18}" for c in cells))

    for k in ("long", "short"):
        ref_speed = speed[BASELINE, k]
        print(f"\n{k} (zh+en), this run, relative to tokenizers (encode_batch, 10,000 lines a batch):")
        for label in FORMATS:
            s = speed[f"fleet: {label}, full conversion (text -> TFRecord bytes)", k]
            print(
                f"  {label}: {s:.2f} MB/s per core, {s / ref_speed:.2f}x the {ref_speed:.2f} MB/s of tokenizers "
                f"(which only tokenizes)"
            )
        for label, (job, converter) in converters.items():
            sink = MemorySink()
            stats = converter.convert(corpora[k], ItemContext("bench", 1, "bench"), sink)
            out = sum(f.getbuffer().nbytes for f in sink.files.values())
            extra = "".join(f", {key} {v:.3f}" for key, v in job.summarize(stats).items())
            print(f"  {label}: {stats['examples']} examples{extra}, {out / 1e6:.2f} MB of TFRecords")

    for block in (whole_lines, rss_lines):
        if block:
            print()
            print("\n".join(block))


BASELINE = "tokenizers: encode_batch, 10,000 lines a batch"


def tokenizer_core() -> str:
    """Which path fleet's tokenizer takes here: the C core or Python (``FLEET_NATIVE``)."""
    from fleet_jobs.text.tokenizers import native

    try:
        if native.mode() == "0":
            return "Python (FLEET_NATIVE=0)"
        return f"C ({native.load().path})"
    except native.NativeError as e:
        return f"Python ({e})"


if __name__ == "__main__":
    main()
