"""Peak memory of one worker converting a single big document, in each input format.

    .venv/bin/python bench/bench_memory.py [--mb 1000] [--formats electra,bert,causal_lm]
        [--inputs txt,zst,jsonl,parquet] [--tree DIR] [--vocab vocab.txt] [--keep DIR]

Issue 17 (d): a worker's memory is bounded by a constant, not by the document or the item. The
goal is a peak RSS of at most 300 MB per worker, whatever the document's size.

Input: ONE document of ``--mb`` MB (10^6 bytes; default 1000) of real zh+en text with no blank
line inside: the lines of corpus/sample_zh.txt and corpus/sample_en.txt drawn at random (seeded),
each with a counter in it, so that no two lines repeat. It is written streaming to disk as plain
text (``doc.txt``), zstd (``doc.txt.zst``), one JSON Lines record (``doc.jsonl``) and one Parquet
row (``doc.parquet``, with pyarrow's defaults as hub datasets are written: snappy, and the value in a
dictionary page; made in a child process, since pyarrow must hold the value whole to write it). This process never holds the document. One more input, ``parts``
(not in the default ``--inputs``), is the same text with a blank line after each 4 Mi characters
of lines: the documents a streaming reader hands the job, so its row is what the job side costs
with the reading bounded.

Each row runs ``fleet local FILE OUT --workers 1 --item-mb 64 --set vocab_file=V --set
format=F`` (``--job causal_lm`` for causal_lm; ``--item-mb`` and ``--set KEY=VALUE`` change the
command) in a fresh process tree and prints:

- ``worker``: the peak RSS (``VmHWM``) of the worker process, read by the worker itself at exit
  (a ``sitecustomize`` put on ``PYTHONPATH`` writes it): the figure the goal is about;
- ``tree``: the largest ``ru_maxrss`` in the process tree (``os.wait4``), the ``fleet local``
  parent and its report included (an upper bound; Linux also carries a parent's peak into a
  child's ``ru_maxrss`` across fork and exec);
- whether the run converted the document: its exit code, examples and ``bad_records``; a
  run that skipped the document as bad costs little memory and says nothing about (d);
- ``out``: the first hex digits of a sha256 over the output files, to compare trees' records.

A worker figure is marked ``ok`` (at most 300 MB), ``>`` (above) or ``!`` (the run failed).

``--tree DIR`` runs another checkout (e.g. ``git worktree add /tmp/old main``) as ``python -m
fleet.cli.commands`` from DIR, with this venv, for before/after figures. The figures are MiB (2^20).
Nothing is asserted: this prints figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INPUTS = ("txt", "zst", "jsonl", "parquet", "parts")
FORMATS = ("electra", "bert", "causal_lm")
GOAL_MIB = 300 * 1e6 / (1 << 20)  # 300 MB
MAX_DOCUMENT_CHARS = 4 << 20  # fleet_jobs.text.inputs.MAX_DOCUMENT_CHARS (not imported: --tree may be another checkout)

# Imported first by every Python process of the tree (PYTHONPATH): at exit each writes its own
# peak RSS, and whether it is a worker process, into FLEET_BENCH_HWM_DIR.
_SITECUSTOMIZE = """
import atexit, os

def _fleet_bench_hwm():
    import json, multiprocessing, sys
    try:
        with open("/proc/self/status") as f:
            hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return
    # A worker: fleet.core.processes' `python -c` (or, in a tree from before, a multiprocessing child).
    worker = (sys.argv[0] == "-c" and "fleet.core.spawner" in sys.modules) or multiprocessing.parent_process() is not None
    with open(os.path.join(os.environ["FLEET_BENCH_HWM_DIR"], f"{os.getpid()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "worker": worker, "hwm_kib": hwm, "argv": sys.argv[:3]}, f)

if os.environ.get("FLEET_BENCH_HWM_DIR"):
    atexit.register(_fleet_bench_hwm)
"""


def corpus_lines() -> list[str]:
    lines = []
    for lang in ("zh", "en"):
        with open(os.path.join(ROOT, "corpus", f"sample_{lang}.txt"), encoding="utf-8") as f:
            lines += [line.rstrip("\n") for line in f if line.strip()]
    return lines


def text_chunks(mb: float, seed: int = 17):
    """The document's text, about ``mb`` MB in all, in chunks of whole lines (each ending "\\n",
    the last one too); no line repeats (a counter goes into each), none is blank."""
    pool = corpus_lines()
    rng = random.Random(seed)
    target, size, number = int(mb * 1e6), 0, 0
    while size < target:
        chunk = []
        for _ in range(2000):
            line = rng.choice(pool)
            words = line.split(" ")
            words.insert(rng.randrange(len(words) + 1), f"n{number}")  # varying content
            number += 1
            chunk.append(" ".join(words))
        data = "\n".join(chunk) + "\n"
        size += len(data.encode())
        yield data


def make_inputs(folder: str, mb: float, kinds: tuple[str, ...], have: tuple[str, ...] = ()) -> dict[str, str]:
    """The document as each input kind, written streaming (but those in ``have``); {kind: path}."""
    import zstandard

    paths = {
        kind: os.path.join(folder, name)
        for kind, name in (
            ("txt", "doc.txt"),
            ("zst", "doc.txt.zst"),
            ("jsonl", "doc.jsonl"),
            ("parquet", "doc.parquet"),
            ("parts", "parts.txt"),
        )
    }
    txt = paths["txt"]
    if "txt" not in have:
        with open(txt, "w", encoding="utf-8") as f:
            for chunk in text_chunks(mb):
                f.write(chunk)
    kinds = tuple(k for k in kinds if k not in have)
    if "zst" in kinds:
        with open(txt, "rb") as src, open(paths["zst"], "wb") as dst:
            zstandard.ZstdCompressor(level=3).copy_stream(src, dst)
    if "jsonl" in kinds:
        with open(txt, encoding="utf-8") as src, open(paths["jsonl"], "w", encoding="utf-8") as dst:
            dst.write('{"id": "1", "text": "')
            while block := src.read(1 << 20):
                dst.write(json.dumps(block, ensure_ascii=False)[1:-1])
            dst.write('"}\n')
    if "parts" in kinds:
        with open(txt, encoding="utf-8") as src, open(paths["parts"], "w", encoding="utf-8") as dst:
            size = 0
            for line in src:
                if size + len(line) - 1 > MAX_DOCUMENT_CHARS:
                    dst.write("\n")
                    size = 0
                dst.write(line)
                size += len(line) - 1
    if "parquet" in kinds:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--make-parquet", txt, paths["parquet"]], check=True)
    return paths


def make_parquet(txt: str, out: str) -> None:
    """One row whose text column is the whole file (read through a memory map, not copied)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pa.memory_map(txt) as source:
        data = source.read_buffer()
        kind = pa.string() if data.size < (1 << 31) else pa.large_string()
        offsets = pa.py_buffer(np.array([0, data.size], np.int32 if kind == pa.string() else np.int64))
        text = pa.Array.from_buffers(kind, 1, [None, offsets, data])
        table = pa.table({"id": pa.array(["1"]), "text": text})
        pq.write_table(table, out)


def train_vocab(folder: str) -> str:
    """One of 8000 tokens trained on corpus/, kept in the folder (training is not deterministic:
    a new vocab would give other records)."""
    path = os.path.join(folder, "vocab.txt")
    if os.path.exists(path):
        return path
    samples = [os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("zh", "en")]
    subprocess.run(
        [sys.executable, "-m", "fleet_jobs.text", "vocab", *samples, "--size", "8000", "--out", path],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return path


def run_row(
    tree: str, path: str, fmt: str, vocab: str, folder: str, item_mb: float = 64, options: tuple[str, ...] = ()
) -> dict:
    """``fleet local`` on one input with one format: peaks (MiB), exit code, wall seconds, summary."""
    out = os.path.join(folder, "out")
    shutil.rmtree(out, ignore_errors=True)
    hooks = tempfile.mkdtemp(prefix="hooks-", dir=folder)
    with open(os.path.join(hooks, "sitecustomize.py"), "w") as f:
        f.write(_SITECUSTOMIZE)
    hwm_dir = tempfile.mkdtemp(prefix="hwm-", dir=folder)
    job = ["--job", "causal_lm"] if fmt == "causal_lm" else ["--set", f"format={fmt}"]
    cmd = [
        sys.executable,
        "-m",
        "fleet.cli",
        "local",
        path,
        out,
        "--workers",
        "1",
        "--item-mb",
        str(item_mb),
        "--set",
        f"vocab_file={vocab}",
        *job,
        *(a for option in options for a in ("--set", option)),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([hooks, tree]), FLEET_BENCH_HWM_DIR=hwm_dir)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    peaks = []
    for name in os.listdir(hwm_dir):
        with open(os.path.join(hwm_dir, name)) as f:
            peaks.append(json.load(f))
    workers = [p["hwm_kib"] / 1024 for p in peaks if p["worker"]]
    summary, digest = {}, hashlib.sha256()
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if name.startswith("part-"):
            with open(os.path.join(out, name), "rb") as f:
                digest.update(name.encode() + hashlib.file_digest(f, "sha256").digest())
    if os.path.exists(os.path.join(out, "summary.json")):
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(hooks, ignore_errors=True)
    shutil.rmtree(hwm_dir, ignore_errors=True)
    return {
        "worker_mib": max(workers) if workers else None,
        "tree_mib": usage.ru_maxrss / 1024,
        "exit": os.waitstatus_to_exitcode(status),
        "wall": wall,
        "summary": summary,
        "error": err.strip().splitlines()[-1] if err.strip() else "",
        "out": digest.hexdigest()[:10],
    }


def describe(r: dict) -> str:
    totals = r["summary"].get("totals", r["summary"])
    worker = f"{r['worker_mib']:6.0f}" if r["worker_mib"] is not None else "     ?"
    mark = (
        "" if r["worker_mib"] is None else " !  " if r["exit"] else (" ok " if r["worker_mib"] <= GOAL_MIB else " >  ")
    )  # !: the run failed, the figure says nothing
    facts = [f"exit {r['exit']}", f"{totals.get('examples', 0):,} examples", f"out {r['out']}"]
    for key in ("bad_records", "documents_cut"):
        if totals.get(key):
            facts.append(f"{key} {totals[key]}")
    if r["exit"] and r["error"]:
        facts.append(r["error"][:100])
    return f"worker {worker} MiB{mark}| tree {r['tree_mib']:6.0f} MiB | {r['wall']:6.1f} s | {', '.join(facts)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1000, help="size of the document, MB (10^6 bytes)")
    ap.add_argument("--formats", default="electra", help=f"comma-separated, of {', '.join(FORMATS)}")
    ap.add_argument("--inputs", default=",".join(INPUTS), help=f"comma-separated, of {', '.join(INPUTS)}")
    ap.add_argument("--tree", default=ROOT, help="checkout to run (default: this one)")
    ap.add_argument("--vocab", help="vocab.txt (default: one of 8000 trained on corpus/)")
    ap.add_argument("--item-mb", type=float, default=64, help="fleet local --item-mb")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a job option, to every row")
    ap.add_argument("--keep", help="make the inputs in (or reuse them from) this folder and keep them")
    ap.add_argument("--make-parquet", nargs=2, metavar=("TXT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make_parquet:
        make_parquet(*args.make_parquet)
        return
    kinds = tuple(k for k in args.inputs.split(",") if k)
    formats = tuple(f for f in args.formats.split(",") if f)
    for k in kinds:
        if k not in INPUTS:
            ap.error(f"--inputs: unknown {k!r}")
    for f in formats:
        if f not in FORMATS:
            ap.error(f"--formats: unknown {f!r}")
    tmp = tempfile.TemporaryDirectory(prefix="bench-memory-")
    folder = args.keep or tmp.name
    os.makedirs(folder, exist_ok=True)
    stamp = os.path.join(folder, "inputs.json")
    made = {}
    if os.path.exists(stamp):
        with open(stamp) as f:
            made = json.load(f)
    have = tuple(made.get("have", ())) if made.get("mb") == args.mb else ()
    paths = make_inputs(folder, args.mb, ("txt", *kinds), have)
    with open(stamp, "w") as f:
        json.dump({"mb": args.mb, "have": sorted({"txt", *have, *kinds})}, f)
    vocab = args.vocab or train_vocab(folder)
    tree = os.path.abspath(args.tree)
    revision = subprocess.run(
        ["git", "-C", tree, "log", "-1", "--format=%h %s"], capture_output=True, text=True
    ).stdout.strip()[:80]
    print(
        f"one document of {args.mb:g} MB ({os.path.getsize(os.path.join(folder, 'doc.txt')) / 1e6:.0f} MB as "
        f"text), no blank line inside; tree {tree} ({revision or 'not a git checkout'}); "
        f"fleet local --workers 1 --item-mb {args.item_mb:g}{''.join(' --set ' + o for o in args.set)}; goal: worker <= {GOAL_MIB:.0f} MiB (300 MB); "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    for fmt in formats:
        for kind in kinds:
            r = run_row(tree, paths[kind], fmt, vocab, folder, args.item_mb, tuple(args.set))
            print(f"  {fmt:9} {kind:8} {describe(r)}", flush=True)


if __name__ == "__main__":
    main()
