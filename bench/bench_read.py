"""How fast the input layer reads clean input, alone (no tokenizer, no job), in each line format,
for this checkout and optionally an earlier commit, in one run.

    .venv/bin/python bench/bench_read.py [--rev REV] [--repeat 27] [--rounds 3]

The corpus is bench_convert's "short" one (the sample's lines cut into documents of 1-3 lines,
``--repeat`` times; 27: about 33 MB), written as plain text, JSON Lines and WikiExtractor
shards. Each tree iterates ``fleet_jobs.text.inputs.iter_documents`` (``fleet.inputs`` before) over
each file in a child process (its code first on sys.path); the figure is MB of file per CPU
second, best of ``--rounds``, and the script says whether both trees read the same documents
and tallies. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from short_corpus import short_documents  # noqa: E402

FORMATS = {"text": "short.txt", "jsonl": "short.jsonl", "wikiextractor": "short.wiki"}

_CHILD = r"""
import hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])
try:
    from fleet_jobs.text.inputs.formats import Tally, iter_documents
except ImportError:  # a tree from before the text layer held the formats
    from fleet.inputs.formats import Tally, iter_documents
fmt, path, rounds = sys.argv[2], sys.argv[3], int(sys.argv[4])
best, h = None, None
for _ in range(rounds):
    tally, h = Tally(), hashlib.sha256()
    with open(path, "rb") as f:
        t = time.process_time()
        for doc in iter_documents(f, fmt, "none", path, tally=tally):
            h.update("\n".join(doc).encode("utf-8", "surrogatepass") + b"\0")
        took = time.process_time() - t
    best = took if best is None else min(best, took)
print(json.dumps({"seconds": best, "digest": h.hexdigest()[:12], "documents": tally.documents, "bad": tally.bad}))
"""


def write_inputs(folder: str, repeat: int) -> None:
    text = b"".join(open(p, "rb").read() for p in sorted(glob.glob(os.path.join(ROOT, "corpus", "*.txt"))))
    short = short_documents(text) * repeat
    with open(os.path.join(folder, FORMATS["text"]), "wb") as f:
        f.write(short)
    docs = [d for d in short.decode("utf-8").split("\n\n") if d.strip()]
    with open(os.path.join(folder, FORMATS["jsonl"]), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs)
    with open(os.path.join(folder, FORMATS["wikiextractor"]), "w", encoding="utf-8") as f:
        f.writelines(f'<doc id="{i}" url="u" title="T{i}">\nT{i}\n\n{d}\n</doc>\n' for i, d in enumerate(docs))


def measure(tree: str, fmt: str, path: str, rounds: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, tree, fmt, path, str(rounds)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="an earlier commit to read with too (exported with git archive)")
    ap.add_argument("--repeat", type=int, default=27, help="the short corpus this many times (27: about 33 MB)")
    ap.add_argument("--rounds", type=int, default=3, help="reads of each file, the least CPU is kept")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-read-") as tmp:
        write_inputs(tmp, args.repeat)
        trees = [("this checkout", ROOT)]
        if args.rev:
            old = os.path.join(tmp, "old")
            os.mkdir(old)
            archive = subprocess.run(["git", "-C", ROOT, "archive", args.rev], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
            trees.insert(0, (args.rev, old))
        print(
            f"iter_documents over the short corpus x{args.repeat}, least CPU of {args.rounds}; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
        )
        for fmt, name in FORMATS.items():
            path = os.path.join(tmp, name)
            mb = os.path.getsize(path) / 1e6
            rows = [(label, measure(tree, fmt, path, args.rounds)) for label, tree in trees]
            figures = ", ".join(f"{label} {mb / r['seconds']:6.1f} MB/s" for label, r in rows)
            same = (
                ""
                if len(rows) == 1
                else "; same documents"
                if len({r["digest"] for _, r in rows}) == 1
                else "; DIFFERENT documents"
            )
            ratio = f": {rows[0][1]['seconds'] / rows[-1][1]['seconds']:.2f}x" if len(rows) > 1 else ""
            print(f"  {fmt:14} {mb:6.1f} MB, {rows[-1][1]['documents']:,} documents: {figures}{ratio}{same}")


if __name__ == "__main__":
    main()
