"""Whole-process speed of this checkout next to an earlier commit, in one run: ``fleet local FILE
OUT --workers 1`` from start to exit on the long and the short corpus, each tree in turn.

    .venv/bin/python bench/bench_before_after.py REV [--repeat 27] [--rounds 2] [--vocab vocab.txt]
        [--formats electra,bert,causal_lm]

REV (a commit, tag or branch of this repository) is exported with ``git archive`` into a
temporary folder and run with this venv's Python (so the same dependencies), from that folder,
as ``python -m fleet.cli local``; this checkout runs the same way. Corpora as in
bench_convert.py ("long": the sample, documents of man pages; "short": its lines cut into
documents of 1-3 lines), each repeated ``--repeat`` times into one file (27: about 32 MB).
CPU = user + system seconds of the process tree (``os.wait4``), least of ``--rounds``; MB =
10^6 bytes of UTF-8 text in the file's lines. Both trees get the same vocab, and the script
says whether their outputs are the same bytes. Rows (``--formats``): ``electra`` and ``bert``
are ``--set format=electra`` / ``format=bert``, electra_zh_en's formats before the bert job had
its own name (read now by discovery's former-name rule: fleet.core.discovery.FORMER_NAMES);
``bert-job`` runs REV with ``--set format=bert`` and this checkout with ``--job bert`` (the job
that format=bert became), so its records are compared with those of the former format;
``causal_lm`` and ``causal_lm_parquet`` the causal_lm job with the same vocab (TFRecord,
Parquet output), ``causal_lm_megatron`` and ``causal_lm_tokens`` its token-sequence outputs;
``electra_parquet`` and ``electra_gzip`` electra's Parquet and GZIP TFRecord outputs (every
record format, for a change that moves a format's code).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from short_corpus import short_documents  # noqa: E402


ROWS = {  # the job options of each row (--formats)
    "electra": ["--set", "format=electra"],
    "bert": ["--set", "format=bert"],
    "bert-job": ["--job", "bert"],  # REV: --set format=bert (see job_args)
    "causal_lm": ["--job", "causal_lm"],
    "causal_lm_parquet": ["--job", "causal_lm", "--set", "output=parquet"],
    "causal_lm_megatron": ["--job", "causal_lm", "--set", "output=megatron"],
    "causal_lm_tokens": ["--job", "causal_lm", "--set", "output=tokens"],
    "electra_parquet": ["--set", "format=electra", "--set", "output=parquet"],
    "electra_gzip": ["--set", "format=electra", "--set", "compression=GZIP"],
}


def job_args(fmt: str, this_checkout: bool) -> list[str]:
    """``fleet local``'s job arguments for a row: bert-job is ``--job bert`` in this checkout only."""
    if fmt == "bert-job" and not this_checkout:
        return ["--set", "format=bert"]
    return ROWS[fmt]


def text_mb(path: str) -> float:
    with open(path, "rb") as f:
        data = f.read()
    return (len(data) - data.count(b"\n")) / 1e6


def run(tree: str, args: list[str]) -> float:
    """CPU seconds of ``python -m fleet.cli ARGS`` run from ``tree`` (its code first on sys.path)."""
    env = dict(os.environ, PYTHONPATH=tree)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", *args], cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"failed in {tree}: fleet {' '.join(args)}\n{err[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def digest(folder: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.startswith("part-"):
            with open(os.path.join(folder, name), "rb") as f:
                h.update(name.encode() + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the earlier commit to compare with")
    ap.add_argument("--repeat", type=int, default=27, help="each corpus this many times (27: about 32 MB)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each row, the least CPU is kept")
    ap.add_argument("--vocab", help="vocab.txt (default: train one of 21128 on the sample)")
    ap.add_argument(
        "--formats",
        default="electra,bert,bert-job,causal_lm",
        help="rows, comma-separated: electra, bert, bert-job, causal_lm, causal_lm_parquet",
    )
    args = ap.parse_args()
    unknown = [f for f in args.formats.split(",") if f not in ROWS]
    if unknown:
        ap.error(f"--formats {unknown[0]!r}: known rows are {', '.join(ROWS)}")
    with tempfile.TemporaryDirectory(prefix="bench-ba-") as tmp:
        before = os.path.join(tmp, "before")
        os.mkdir(before)
        archive = subprocess.run(["git", "-C", ROOT, "archive", args.rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        samples = [os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("zh", "en")]
        raw = [open(p, "rb").read() for p in samples]
        files = {"long": os.path.join(tmp, "long.txt"), "short": os.path.join(tmp, "short.txt")}
        with open(files["long"], "wb") as f:
            f.write(b"".join(r.rstrip(b"\n") + b"\n\n" for r in raw) * args.repeat)
        with open(files["short"], "wb") as f:
            f.write(b"".join(map(short_documents, raw)) * args.repeat)
        vocab = args.vocab
        if not vocab:
            vocab = os.path.join(tmp, "vocab.txt")
            subprocess.run(
                [sys.executable, "-m", "fleet_jobs.text", "vocab", *samples, "--size", "21128", "--out", vocab],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
        trees = {args.rev: before, "this checkout": ROOT}
        cpu: dict[tuple, float] = {}
        same: dict[tuple, bool] = {}
        for _ in range(args.rounds):
            for fmt in args.formats.split(","):
                for name, path in files.items():
                    digests = set()
                    for label, tree in trees.items():
                        out = os.path.join(tmp, "out")
                        shutil.rmtree(out, ignore_errors=True)
                        c = run(
                            tree,
                            [
                                "local",
                                path,
                                out,
                                "--workers",
                                "1",
                                "--set",
                                f"vocab_file={vocab}",
                                *job_args(fmt, tree is ROOT),
                            ],
                        )
                        digests.add(digest(out))
                        key = (fmt, name, label)
                        cpu[key] = min(cpu.get(key, float("inf")), c)
                    same[fmt, name] = len(digests) == 1
        print(
            f"fleet local --workers 1, whole process, least CPU of {args.rounds}; each corpus {args.repeat}x; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
        )
        for fmt in args.formats.split(","):
            for name, path in files.items():
                mb = text_mb(path)
                b, a = cpu[fmt, name, args.rev], cpu[fmt, name, "this checkout"]
                print(
                    f"  {fmt:18} {name:5} {mb:5.1f} MB: {args.rev} {b:6.2f} s ({mb / b:5.2f} MB/s), "
                    f"this checkout {a:6.2f} s ({mb / a:5.2f} MB/s): {b / a:.2f}x; records "
                    f"{'the same bytes' if same[fmt, name] else 'DIFFER'}"
                )


if __name__ == "__main__":
    main()
