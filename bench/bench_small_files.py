"""Many small files through `fleet local`: seconds, and the files the run writes.

    .venv/bin/python bench/bench_small_files.py [--files 20000] [--job electra_zh_en] [--workers 2]
                                                [--tree PATH]

Makes ``--files`` files of one line each (2 to 9 words, the same every time) in a temporary
folder, a WordPiece vocab for them, and times ``fleet local FOLDER OUT --job JOB --workers N
--set vocab_file=...`` as a whole process (plan, workers, summary, report: start to exit), wall
seconds and the CPU of the process tree; then counts what it wrote: the files in OUT (outputs,
sidecars, ``manifest.json``, ``summary.json``; not the run state in ``OUT/.fleet``), and the run's
items. ``--tree PATH`` runs another checkout's code instead of this one's (with this venv, and this
checkout's built C tokenizer beside it): e.g. the code before grouping,
``git worktree add /tmp/before main``, then ``--tree /tmp/before``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_convert import run_process  # noqa: E402

WORDS = ["alpha", "beta", "gamma", "delta", "épsilon", "数据", "模型", "训练", "zeta", "eta", "theta", "iota"]


def make_files(folder: str, n: int) -> int:
    """``n`` one-line files, f00000.txt...; their bytes."""
    rng = random.Random(0)
    os.makedirs(folder)
    total = 0
    for i in range(n):
        data = (f"file {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) + "\n").encode()
        with open(os.path.join(folder, f"f{i:05d}.txt"), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def make_vocab(path: str) -> str:
    from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab

    write_vocab(train_vocab([f"file {i}: " + " ".join(WORDS) for i in range(1000)], 400), path)
    return path


def with_native(tree: str) -> None:
    """This checkout's built C tokenizer beside another tree's wordpiece.c (loaded only if the same)."""
    for lib in glob.glob(os.path.join(ROOT, "fleet_jobs", "text", "tokenizers", "_ccore*")):
        target = os.path.join(tree, "fleet_jobs", "text", os.path.basename(lib))
        if not os.path.exists(target):
            shutil.copy2(lib, target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--job", default="electra_zh_en")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tree", default=ROOT, help="the checkout whose code runs (default: this one)")
    args = ap.parse_args()
    tree = os.path.abspath(args.tree)
    if tree != ROOT:
        with_native(tree)
    with tempfile.TemporaryDirectory(prefix="bench-small-files-") as tmp:
        corpus, out = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        size = make_files(corpus, args.files)
        vocab = make_vocab(os.path.join(tmp, "vocab.txt"))
        env = {**os.environ, "PYTHONPATH": tree, "TMPDIR": tmp}
        cmd = [
            sys.executable,
            "-m",
            "fleet.cli",
            "local",
            corpus,
            out,
            "--job",
            args.job,
            "--workers",
            str(args.workers),
            "--set",
            f"vocab_file={vocab}",
        ]
        r = run_process(cmd, cwd=tree, env=env)
        written = sorted(name for name in os.listdir(out) if name != ".fleet")
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    print(f"{args.files:,} one-line files ({size / 1e6:.2f} MB), {args.job}, --workers {args.workers}, code of {tree}:")
    print(
        f"  {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU (process tree), peak RSS {r['rss_mib']:.0f} MiB; "
        f"{summary['items']:,} items, {len(written):,} files written ({summary['done']:,} done, "
        f"{summary['failed']} failed, {int(summary.get('documents', 0)):,} documents)"
    )


if __name__ == "__main__":
    main()
