"""causal_lm's speed per tokenizer kind, whole process, against a plain script of the same library.

    .venv/bin/python bench/bench_lm_tokenizers.py [--repeat 27] [--rounds 2] [--max-seq-length N]
        [--kinds json,sentencepiece,tiktoken,vocab] [--also KEY=VALUE ...] [--bytecode cached|compiled]
        [--profile] [--same-as REV] [--before REV]

Input: the short-document corpus (``bench/short_corpus.py``: the sample's lines in documents of
1-3 lines, 7,122 documents) repeated ``--repeat`` times into one file (27: 32 MB). Tokenizers,
trained here on the sample (a few seconds): a byte-level BPE ``tokenizer.json`` of 8,000 tokens
(``tokenizers``), a SentencePiece unigram ``.model`` of 8,000 pieces, a tiktoken ranks file made
from the same byte-level BPE (its 256 bytes, then each merge's token in merge order) with
cl100k_base's pattern, and a BERT WordPiece ``vocab.txt`` of 8,000 (``BertWordPieceTokenizer``).

Rows, each a fresh process, CPU = user + system seconds of it and its children (``os.wait4``),
least of ``--rounds``; MB = 10^6 bytes of UTF-8 text in the file's lines:

- ``fleet local FILE OUT --job causal_lm --workers 1 --set tokenizer_file=...`` (plan, worker,
  report: everything from start to exit) with causal_lm's defaults: 1024-token blocks, documents
  packed (``pack_documents=true``), TFRecord output; ``--also KEY=VALUE`` adds a row with one
  option changed (``pack_documents=false``: a padded block per document, the old default);
- a plain script of the library doing the same work, one thread: it reads the same file, makes
  the same documents (lines joined by ``\\n``), encodes them 10,000 at a time
  (``Tokenizer.encode_batch`` with RAYON_NUM_THREADS=1, ``SentencePieceProcessor.encode(list,
  num_threads=1)``, ``Encoding.encode_ordinary_batch(list, num_threads=1)``,
  ``BertWordPieceTokenizer.encode_batch``), appends the end-of-document id causal_lm appends,
  cuts the stream into blocks of the same size (the last padded) and writes them as int32.

The ratio is library CPU / fleet CPU (goal of issue 33 >= 1.2x: the whole job costs less than a
plain script of its tokenizer). Output / text is the bytes written over the bytes of text (goal
<= 1.5x). ``--profile`` adds, per kind, the top of a cProfile of the converter in this process on
the same documents (where the time of a worker goes). ``--same-as REV`` also runs each kind's
``fleet local`` from REV (a commit with these tokenizers, exported by ``git archive``, run with
this venv) and says whether every output file is the same bytes; ``--before REV`` times REV's
``fleet local`` in the same rounds (before and after from one run, on one load).

Bytecode (``--bytecode``): ``cached`` (the default) runs every command once untimed first so
each process finds its modules' bytecode (``PYTHONPYCACHEPREFIX`` in the temporary folder), as a
``pip install`` leaves fleet and the libraries; ``compiled`` runs as this machine runs a checkout
(``PYTHONDONTWRITEBYTECODE=1``): fleet compiles its own modules in every process, about 0.1 s
the library's row does not pay (its bytecode came with its wheel).

Start-up: both on a one-line file (the fixed cost of a process: imports, plan, worker, report),
and the ratio with it taken off both sides.
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

KINDS = ("json", "sentencepiece", "tiktoken", "vocab")
VOCAB = 8000

LIBRARY = """
import os, sys
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import numpy as np
kind, corpus, tok, pattern, eod, block, out = sys.argv[1:8]
eod, block = int(eod), int(block)
with open(corpus, encoding="utf-8") as f:
    docs = [b.strip("\\n") for b in f.read().split("\\n\\n") if b.strip()]
if kind == "json":
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(tok)
    encode = lambda batch: [e.ids for e in t.encode_batch(batch, add_special_tokens=False)]
elif kind == "vocab":
    from tokenizers import BertWordPieceTokenizer
    t = BertWordPieceTokenizer(tok, lowercase=True)
    encode = lambda batch: [e.ids for e in t.encode_batch(batch, add_special_tokens=False)]
elif kind == "sentencepiece":
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=tok)
    encode = lambda batch: sp.encode(batch, out_type=int, num_threads=1)
else:
    import base64, tiktoken
    with open(tok, "rb") as f:
        ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in f if line.strip())}
    enc = tiktoken.Encoding("bench", pat_str=pattern, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    encode = lambda batch: enc.encode_ordinary_batch(batch, num_threads=1)
stream = []
with open(out, "wb") as f:
    for i in range(0, len(docs), 10000):
        for ids in encode(docs[i:i + 10000]):
            stream += ids
            stream.append(eod)
        n = len(stream) // block * block
        np.asarray(stream[:n], np.int32).tofile(f)
        del stream[:n]
    if stream:
        np.asarray(stream + [eod] * (block - len(stream)), np.int32).tofile(f)
"""


def gpt2_byte_of_char() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode``, inverted: the character a byte-level BPE writes for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


def make_tokenizers(texts: list[str], folder: str) -> dict[str, str]:
    """{kind: path} of the three tokenizers, trained on ``texts``."""
    import sentencepiece
    from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False)
    paths = {
        kind: os.path.join(folder, name)
        for kind, name in zip(KINDS, ("tokenizer.json", "spm.model", "bpe.tiktoken", "vocab.txt"))
    }
    bpe.save(paths["json"])
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(texts, vocab_size=VOCAB, show_progress=False)
    wordpiece.save_model(folder)  # vocab.txt, [PAD] [UNK] [CLS] [SEP] [MASK] first
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


def options(kind: str, path: str, eod: int, max_seq_length: int | None) -> dict[str, str]:
    """causal_lm's options: the tokenizer and nothing else (its defaults) unless --max-seq-length."""
    opts = {"vocab_file": path} if kind == "vocab" else {"tokenizer_file": path}
    if kind == "tiktoken":
        opts["tiktoken_special_tokens"] = f"<|endoftext|>={eod}"
    if max_seq_length:
        opts["max_seq_length"] = str(max_seq_length)
    return opts


def eod_id(kind: str, path: str) -> int:
    """The id causal_lm ends each document with by default (docs/text-jobs.md), for the library's row."""
    if kind == "sentencepiece":
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=path).eos_id()
    if kind == "tiktoken":
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    from tokenizers import Tokenizer

    if kind == "vocab":
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f].index("[SEP]")
    return Tokenizer.from_file(path).token_to_id("<|endoftext|>")


def folder_bytes(path: str) -> int:
    """Bytes of a run's outputs: every part-* file of a folder, or the file itself."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n.startswith("part-"))


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
    rev: str, kinds: list[str], corpus: str, paths: dict[str, str], eod: int, max_seq_length: int | None, folder: str
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
    ap.add_argument("--repeat", type=int, default=27, help="the short corpus this many times (27: about 32 MB)")
    ap.add_argument("--rounds", type=int, default=2, help="run each row this many times, keep the least CPU")
    ap.add_argument(
        "--max-seq-length", type=int, help="tokens per block (default: causal_lm's own, 1024, on both sides)"
    )
    ap.add_argument("--kinds", default=",".join(KINDS), help="which tokenizers, comma-separated")
    ap.add_argument(
        "--bytecode",
        choices=("cached", "compiled"),
        default="cached",
        help="cached: every process finds its modules' bytecode, as after pip install (each command "
        "runs once untimed first); compiled: as this machine runs a checkout (PYTHONDONTWRITEBYTECODE), "
        "fleet's own modules compiled in every process",
    )
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also time fleet local with this causal_lm option set (a row per kind; repeatable), "
        "e.g. pack_documents=false or output=megatron",
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
    block = args.max_seq_length or 1024
    lib_out = os.path.join(tmp.name, "library.bin")
    results: dict[tuple[str, str], dict] = {}
    for round_ in range(args.rounds + (args.bytecode == "cached")):  # (a first round untimed: it writes bytecode)
        for kind in kinds:
            out = os.path.join(tmp.name, f"out-{kind}")
            opts = options(kind, paths[kind], eod, args.max_seq_length)
            sets = [a for k, v in opts.items() for a in ("--set", f"{k}={v}")]
            lib = [sys.executable, "-c", LIBRARY, kind]
            lib_args = [paths[kind], CL100K_PATTERN, str(eod_id(kind, paths[kind])), str(block), lib_out]
            rows = {
                "fleet": [fleet, "local", corpus, out, "--job", "causal_lm", "--workers", "1", *sets],
                "library": [*lib, corpus, *lib_args],
                "fleet start-up": [fleet, "local", tiny, out, "--job", "causal_lm", "--workers", "1", *sets],
                "library start-up": [*lib, tiny, *lib_args],
            }
            for also in args.also:
                rows[also] = [*rows["fleet"], "--set", also]
            if args.before:
                rows["before"] = rows["fleet"]  # (the same script: PYTHONPATH picks the checkout)
            for row, cmd in rows.items():
                shutil.rmtree(out, ignore_errors=True)
                r = run_process(cmd, export(args.before, tmp.name) if row == "before" else ROOT)
                if args.bytecode == "cached" and round_ == 0:
                    continue
                r["bytes"] = folder_bytes(lib_out if row.startswith("library") else out)
                if (kind, row) not in results or r["cpu"] < results[kind, row]["cpu"]:
                    results[kind, row] = r
            shutil.rmtree(out, ignore_errors=True)

    print(
        f"short corpus x{args.repeat}: {mb:.2f} MB of text, {len(texts) * args.repeat:,} documents; "
        f"{block}-token blocks; least CPU of {args.rounds}; bytecode {args.bytecode}; "
        f"python {sys.version.split()[0]}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'tokenizer':16}{'fleet local (whole process)':>32}{'library alone, batch, 1 thread':>34}{'ratio':>8}"
        f"{'start-up: fleet, library':>28}{'ratio less start-up':>22}{'output / text: fleet, library':>32}"
    )
    for kind in kinds:
        f, lib = results[kind, "fleet"], results[kind, "library"]
        f0, lib0 = results[kind, "fleet start-up"]["cpu"], results[kind, "library start-up"]["cpu"]
        cells = [f"{mb / r['cpu']:6.2f} MB/s ({r['cpu']:5.2f} s)" for r in (f, lib)]
        sizes = ", ".join(f"{r['bytes'] / 1e6 / mb:.2f}x" for r in (f, lib))
        print(
            f"{kind:16}{cells[0]:>32}{cells[1]:>34}{lib['cpu'] / f['cpu']:7.2f}x"
            f"{f'{f0:.2f} s, {lib0:.2f} s':>28}{(lib['cpu'] - lib0) / (f['cpu'] - f0):21.2f}x"
            f"{sizes:>32}"
        )
    print(
        "(MB/s = text MB / CPU s of the process tree; ratio = library CPU / fleet CPU, goal >= 1.2x; start-up: "
        "the same commands on a one-line file; output / text = bytes written / bytes of text, goal <= 1.5x)"
    )
    for also in args.also:
        print(f"\nfleet local with {also}, same rounds:")
        for kind in kinds:
            a, lib = results[kind, also], results[kind, "library"]
            print(
                f"{kind:16}{mb / a['cpu']:6.2f} MB/s ({a['cpu']:5.2f} s), ratio {lib['cpu'] / a['cpu']:.2f}x, "
                f"output / text {a['bytes'] / 1e6 / mb:.2f}x"
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
