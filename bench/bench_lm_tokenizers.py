"""causal_lm's speed per tokenizer kind, whole process, against the tokenizer library alone.

    .venv/bin/python bench/bench_lm_tokenizers.py [--repeat 10] [--rounds 2] [--max-seq-length 128]
        [--kinds json,sentencepiece,tiktoken] [--bytecode cached|compiled] [--profile] [--same-as REV] [--before REV]

Input: the short-document corpus (``bench/short_corpus.py``: the sample's lines in documents of
1-3 lines, 7,122 documents) repeated ``--repeat`` times into one file. Tokenizers, trained here on
the sample (a few seconds): a byte-level BPE ``tokenizer.json`` of 8,000 tokens (``tokenizers``),
a SentencePiece unigram ``.model`` of 8,000 pieces, and a tiktoken ranks file made from the same
byte-level BPE (its 256 bytes, then each merge's token in merge order) with cl100k_base's pattern.

Rows, each a fresh process, CPU = user + system seconds of it and its children (``os.wait4``),
least of ``--rounds``; MB = 10^6 bytes of UTF-8 text in the file's lines:

- ``fleet local FILE OUT --job causal_lm --workers 1 --set tokenizer_file=...`` (plan, worker,
  report: everything from start to exit), TFRecord output;
- the library alone, one thread, in batch mode: a script that reads the same file, makes the same
  documents (lines joined by ``\\n``) and encodes them 10,000 at a time, keeping the ids:
  ``Tokenizer.encode_batch`` (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false) and ``.ids``,
  ``SentencePieceProcessor.encode(list, num_threads=1)``, ``Encoding.encode_ordinary_batch(list,
  num_threads=1)``.

The ratio is library CPU / fleet CPU (goal >= 1.0x: the whole job costs no more than tokenizing
alone). ``--profile`` adds, per kind, the top of a cProfile of the converter in this process on
the same documents (where the time of a worker goes). ``--same-as REV`` also runs each kind's
``fleet local`` from REV (a commit with these tokenizers, exported by ``git archive``, run with
this venv) and says whether every output file is the same bytes; ``--before REV`` times REV's
``fleet local`` in the same rounds (before and after from one run, on one load).

Bytecode (``--bytecode``): ``cached`` (the default) runs every command once untimed first so
each process finds its modules' bytecode (``PYTHONPYCACHEPREFIX`` in the temporary folder), as a
``pip install`` leaves fleet and the libraries; ``compiled`` runs as this machine runs a checkout
(``PYTHONDONTWRITEBYTECODE=1``): fleet compiles its own modules in every process, about 0.1 s
the library's row does not pay (its bytecode came with its wheel).

Start-up: ``fleet local`` of each kind on a one-line file (the fixed cost of a process: imports,
plan, worker, report), and the ratio with it taken off both sides (the library's start-up is a
Python start and one import).
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported (here and in children): one core
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import base64
import cProfile
import hashlib
import io
import json
import pstats
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_convert  # noqa: E402
from short_corpus import short_sample  # noqa: E402

KINDS = ("json", "sentencepiece", "tiktoken")
VOCAB = 8000

LIBRARY = """
import os, sys
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
kind, corpus, tok = sys.argv[1:4]
with open(corpus, encoding="utf-8") as f:
    docs = [b.strip("\\n") for b in f.read().split("\\n\\n") if b.strip()]
if kind == "json":
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(tok)
    encode = lambda batch: [e.ids for e in t.encode_batch(batch, add_special_tokens=False)]
elif kind == "sentencepiece":
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=tok)
    encode = lambda batch: sp.encode(batch, out_type=int, num_threads=1)
else:
    import base64, tiktoken
    with open(tok, "rb") as f:
        ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in f if line.strip())}
    enc = tiktoken.Encoding("bench", pat_str=sys.argv[4], mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    encode = lambda batch: enc.encode_ordinary_batch(batch, num_threads=1)
n = 0
for i in range(0, len(docs), 10000):
    n += sum(map(len, encode(docs[i:i + 10000])))
print(n)
"""


def gpt2_byte_of_char() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode``, inverted: the character a byte-level BPE writes for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


def make_tokenizers(texts: list[str], folder: str) -> dict[str, str]:
    """{kind: path} of the three tokenizers, trained on ``texts``."""
    import sentencepiece
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False)
    paths = {
        kind: os.path.join(folder, name) for kind, name in zip(KINDS, ("tokenizer.json", "spm.model", "bpe.tiktoken"))
    }
    bpe.save(paths["json"])
    char_byte = gpt2_byte_of_char()
    ranks = {bytes([b]): b for b in range(256)}
    for merge in json.loads(bpe.to_str())["model"]["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        ranks.setdefault(bytes(char_byte[c] for c in left + right), len(ranks))
    with open(paths["tiktoken"], "wb") as f:
        f.write(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([line for t in texts for line in t.split("\n")]),
        model_writer=model,
        vocab_size=VOCAB,
        minloglevel=2,
        character_coverage=0.9995,
    )
    with open(paths["sentencepiece"], "wb") as f:
        f.write(model.getvalue())
    return paths


def options(kind: str, path: str, eod: int, max_seq_length: int) -> dict[str, str]:
    extra = {"tiktoken_special_tokens": f"<|endoftext|>={eod}"} if kind == "tiktoken" else {}
    return {"tokenizer_file": path, "max_seq_length": str(max_seq_length), **extra}


PYCACHE: str | None = None  # --bytecode cached: where every process's bytecode is kept (main sets it)


def run_process(cmd: list[str], cwd: str = ROOT) -> dict:
    """bench_convert's, with the code of ``cwd`` first on the path (a revision exported to compare)
    and, with ``--bytecode cached``, bytecode kept under PYCACHE (the first run of a command writes
    it: main runs each command once untimed)."""
    env = {**os.environ, "PYTHONPATH": cwd}
    if PYCACHE:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = PYCACHE
    return bench_convert.run_process(cmd, cwd, env)


def outputs_digest(folder: str) -> dict[str, str]:
    """sha256 of each output file of a run's folder."""
    return {
        name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
        for name in sorted(os.listdir(folder))
        if name.startswith("part-")
    }


def export(rev: str, folder: str) -> str:
    """REV's tree (``git archive``) in folder/rev-REV, once, with its C core built in place (an
    archive holds no library: without it REV would tokenize in Python, not as it runs)."""
    tree = os.path.join(folder, f"rev-{rev}")
    if not os.path.isdir(tree):
        os.makedirs(tree)
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True, capture_output=True
        )
    return tree


def same_as(
    rev: str, kinds: list[str], corpus: str, paths: dict[str, str], eod: int, max_seq_length: int, folder: str
) -> list[str]:
    """Whether REV's fleet local writes the same bytes as this checkout's, per kind."""
    tree = export(rev, folder)
    lines = []
    for kind in kinds:
        opts = [a for k, v in options(kind, paths[kind], eod, max_seq_length).items() for a in ("--set", f"{k}={v}")]
        digests = []
        for name, cwd in (("rev", tree), ("this", ROOT)):
            out = os.path.join(folder, f"same-{kind}-{name}")
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "fleet.cli",
                    "local",
                    corpus,
                    out,
                    "--job",
                    "causal_lm",
                    "--workers",
                    "1",
                    *opts,
                ],
                cwd=cwd,
                check=True,
                capture_output=True,
                env={**os.environ, "PYTHONPATH": cwd},
            )
            digests.append(outputs_digest(out))
        same = digests[0] == digests[1] and digests[0]
        lines.append(
            f"  {kind}: {len(digests[1])} output files, {'the same bytes as' if same else 'DIFFERENT from'} {rev}'s"
        )
    return lines


def profile(kind: str, opts: dict[str, str], corpus: str, top: int) -> list[str]:
    """The top of a cProfile of the converter on the corpus's documents, in this process."""
    from fleet.job import ItemContext
    from fleet_jobs.causal_lm import JOB
    from fleet_jobs.text.inputs import read_all

    with open(corpus, "rb") as f:
        documents = read_all(f.read(), "short.txt")
    converter = JOB.document_converter(JOB.parse_config(opts), lambda p: open(p, "rb").read())

    class Sink:
        def open(self, suffix):
            return io.BytesIO()

        def count(self, suffix, counts):
            pass

    prof = cProfile.Profile()
    prof.enable()
    converter.convert(iter(documents), ItemContext("bench", 1, "bench"), Sink())
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    body = out.getvalue()
    start = body.find("   ncalls")
    return [f"profile of the converter, {kind} (cProfile, by own time):", body[start:].rstrip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10, help="the short corpus this many times (10: about 12 MB)")
    ap.add_argument("--rounds", type=int, default=2, help="run each row this many times, keep the least CPU")
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--kinds", default=",".join(KINDS), help="which tokenizers, comma-separated")
    ap.add_argument(
        "--bytecode",
        choices=("cached", "compiled"),
        default="cached",
        help="cached: every process finds its modules' bytecode, as after pip install (each command "
        "runs once untimed first); compiled: as this machine runs a checkout (PYTHONDONTWRITEBYTECODE), "
        "fleet's own modules compiled in every process",
    )
    ap.add_argument("--profile", action="store_true", help="also profile the converter per kind")
    ap.add_argument("--top", type=int, default=14, help="profile rows per kind")
    ap.add_argument("--same-as", metavar="REV", help="also compare every output file with REV's")
    ap.add_argument(
        "--before",
        metavar="REV",
        help="also time REV's fleet local (git archive, this venv) in the same rounds: before and after in one run",
    )
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]

    from fleet_jobs.text.tokenizers.tiktoken_file import CL100K_PATTERN

    parts = short_sample()
    raw = parts["zh"] + parts["en"]
    tmp = tempfile.TemporaryDirectory(prefix="bench-lm-")
    global PYCACHE
    if args.bytecode == "cached":
        PYCACHE = os.path.join(tmp.name, "pycache")
    corpus = os.path.join(tmp.name, "short.txt")
    with open(corpus, "wb") as f:
        f.write(raw * args.repeat)
    with open(corpus, "rb") as f:
        data = f.read()
    mb = (len(data) - data.count(b"\n")) / 1e6
    texts = [block for block in raw.decode().split("\n\n") if block.strip()]
    paths = make_tokenizers(texts, tmp.name)
    with open(paths["tiktoken"], "rb") as f:
        eod = sum(1 for line in f if line.strip())

    tiny = os.path.join(tmp.name, "tiny.txt")
    with open(tiny, "w") as f:
        f.write("hello world\n\n")
    fleet = os.path.join(os.path.dirname(sys.executable), "fleet")
    results: dict[tuple[str, str], dict] = {}
    for round_ in range(args.rounds + (args.bytecode == "cached")):  # (a first round untimed: it writes bytecode)
        for kind in kinds:
            out = os.path.join(tmp.name, f"out-{kind}")
            opts = options(kind, paths[kind], eod, args.max_seq_length)
            sets = [a for k, v in opts.items() for a in ("--set", f"{k}={v}")]
            rows = {
                "fleet": [fleet, "local", corpus, out, "--job", "causal_lm", "--workers", "1", *sets],
                "library": [sys.executable, "-c", LIBRARY, kind, corpus, paths[kind], CL100K_PATTERN],
                "fleet start-up": [fleet, "local", tiny, out, "--job", "causal_lm", "--workers", "1", *sets],
                "library start-up": [sys.executable, "-c", LIBRARY, kind, tiny, paths[kind], CL100K_PATTERN],
            }
            if args.before:
                rows["before"] = rows["fleet"]  # (the same script: PYTHONPATH picks the checkout)
            for row, cmd in rows.items():
                shutil.rmtree(out, ignore_errors=True)
                r = run_process(cmd, export(args.before, tmp.name) if row == "before" else ROOT)
                if args.bytecode == "cached" and round_ == 0:
                    continue
                if (kind, row) not in results or r["cpu"] < results[kind, row]["cpu"]:
                    results[kind, row] = r
            shutil.rmtree(out, ignore_errors=True)

    print(
        f"short corpus x{args.repeat}: {mb:.2f} MB of text, {len(texts) * args.repeat:,} documents; "
        f"max_seq_length {args.max_seq_length}; least CPU of {args.rounds}; bytecode {args.bytecode}; "
        f"python {sys.version.split()[0]}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'tokenizer':16}{'fleet local (whole process)':>32}{'library alone, batch, 1 thread':>34}{'ratio':>8}"
        f"{'start-up: fleet, library':>28}{'ratio less start-up':>22}"
    )
    for kind in kinds:
        f, lib = results[kind, "fleet"], results[kind, "library"]
        f0, lib0 = results[kind, "fleet start-up"]["cpu"], results[kind, "library start-up"]["cpu"]
        cells = [f"{mb / r['cpu']:6.2f} MB/s ({r['cpu']:5.2f} s)" for r in (f, lib)]
        print(
            f"{kind:16}{cells[0]:>32}{cells[1]:>34}{lib['cpu'] / f['cpu']:7.2f}x"
            f"{f'{f0:.2f} s, {lib0:.2f} s':>28}{(lib['cpu'] - lib0) / (f['cpu'] - f0):21.2f}x"
        )
    print(
        "(MB/s = text MB / CPU s of the process tree; ratio = library CPU / fleet CPU, goal >= 1.0x; start-up: "
        "the same commands on a one-line file)"
    )
    if args.before:
        print(f"\nfleet local before ({args.before}) and now, same rounds:")
        for kind in kinds:
            b, f, lib = results[kind, "before"], results[kind, "fleet"], results[kind, "library"]
            print(
                f"{kind:16}before {mb / b['cpu']:6.2f} MB/s ({b['cpu']:5.2f} s, ratio {lib['cpu'] / b['cpu']:.2f}x), "
                f"now {mb / f['cpu']:6.2f} MB/s ({f['cpu']:5.2f} s, ratio {lib['cpu'] / f['cpu']:.2f}x): "
                f"{b['cpu'] / f['cpu']:.2f}x faster"
            )
    if args.same_as:
        print(f"\noutputs of this checkout against {args.same_as} (short corpus x{args.repeat}, fleet local):")
        print("\n".join(same_as(args.same_as, kinds, corpus, paths, eod, args.max_seq_length, tmp.name)))
    if args.profile:
        for kind in kinds:
            print()
            print("\n".join(profile(kind, options(kind, paths[kind], eod, args.max_seq_length), corpus, args.top)))


if __name__ == "__main__":
    main()
