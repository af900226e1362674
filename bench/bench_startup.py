"""The fixed CPU of a `fleet local` run: the whole process tree on a one-line file.

    .venv/bin/python bench/bench_startup.py [--rounds 5] [--before REV]

Rows, each ``fleet local ONE_LINE OUT --workers 1 ...`` (plan, one worker process, summary,
report: everything from start to exit), CPU = user + system seconds of the process and its
children (``bench_convert.run_process``), least of ``--rounds``:

- ``electra_zh_en`` with a WordPiece vocab trained on the sample corpus (the README's first
  command: ``python -m fleet_jobs.text vocab corpus/``);
- ``causal_lm`` with a SentencePiece ``.model`` and a byte-level BPE ``tokenizer.json``
  (``bench_lm_tokenizers.make_tokenizers``, trained on the short corpus);
- ``python -c pass`` and ``python -c "import sentencepiece"`` (the floor: an interpreter's start,
  and the library alone's start-up as ``bench_lm_tokenizers`` counts it);
- ``import numpy``, and the electra_zh_en and causal_lm jobs' modules (numpy with them): what any
  run of the job loads, the floor under its row whatever fleet does around it.

The code runs from copies in a temporary folder (this checkout's files as they are now and,
with ``--before REV``, REV's from ``git archive``; each with this checkout's built
``_ccore`` library, which loads only beside the same ``wordpiece.c``), with this venv, in
the same rounds, so both sides pay the same for bytecode. Two columns:

- ``compiled``: as this machine runs fleet (``PYTHONDONTWRITEBYTECODE=1``, no ``__pycache__``
  beside fleet's own modules): every process compiles the fleet and job modules it imports;
- ``cached``: bytecode cached (``PYTHONPYCACHEPREFIX`` in the temporary folder, filled by one
  untimed run of each command first), as after ``pip install`` or a first run that may write it.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_convert  # noqa: E402
from bench_lm_tokenizers import export, make_tokenizers  # noqa: E402
from short_corpus import short_sample  # noqa: E402

MODES = ("compiled", "cached")


def copy_checkout(folder: str) -> str:
    """This checkout's files as they are now (tracked, and new ones git does not ignore)."""
    tree = os.path.join(folder, "now")
    names = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, names):
        src = os.path.join(ROOT, name)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(tree, name)), exist_ok=True)
            shutil.copy2(src, os.path.join(tree, name))
    return tree


def with_native(tree: str) -> str:
    """The built C tokenizer beside the tree's own wordpiece.c (fleet_jobs.text.tokenizers.native loads it only
    if that source is the one it was built from; otherwise both sides tokenize in Python)."""
    for lib in glob.glob(os.path.join(ROOT, "fleet_jobs", "text", "tokenizers", "_ccore*")):
        shutil.copy2(lib, os.path.join(tree, "fleet_jobs", "text", "tokenizers"))
    return tree


def environment(tree: str, mode: str, prefix: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if mode == "compiled":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = prefix
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="run each row this many times, keep the least CPU")
    ap.add_argument(
        "--before", metavar="REV", help="also time REV's fleet local (git archive, this venv) in the same rounds"
    )
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="bench-startup-")
    folder = tmp.name
    parts = short_sample()
    texts = [block for block in (parts["zh"] + parts["en"]).decode().split("\n\n") if block.strip()]
    tokenizers = make_tokenizers(texts, folder)
    vocab = os.path.join(folder, "vocab.txt")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet_jobs.text",
            "vocab",
            os.path.join(ROOT, "corpus"),
            "--size",
            "21128",
            "--out",
            vocab,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    line = os.path.join(folder, "line.txt")
    with open(line, "w") as f:
        f.write("hello world, 你好世界\n")
    trees = {"now": with_native(copy_checkout(folder))}
    if args.before:
        trees = {"before": with_native(export(args.before, folder)), **trees}
    prefix = os.path.join(folder, "pycache")
    fleet = os.path.join(os.path.dirname(sys.executable), "fleet")
    out = os.path.join(folder, "out")
    local = [fleet, "local", line, out, "--workers", "1"]
    rows = {
        "electra_zh_en (vocab.txt)": local + ["--set", f"vocab_file={vocab}"],
        "causal_lm (SentencePiece)": local
        + ["--job", "causal_lm", "--set", f"tokenizer_file={tokenizers['sentencepiece']}"],
        "causal_lm (tokenizer.json)": local + ["--job", "causal_lm", "--set", f"tokenizer_file={tokenizers['json']}"],
    }
    # What any run of the job imports, whatever fleet does around it (one BLAS thread, as the
    # `fleet` command sets before numpy loads): the floor under the rows above.
    blas = "import os; os.environ.setdefault('OPENBLAS_NUM_THREADS', '1'); "
    floor = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import sentencepiece'": [sys.executable, "-c", "import sentencepiece"],
        "import numpy": [sys.executable, "-c", blas + "import numpy"],
        "import numpy + the electra_zh_en job": [sys.executable, "-c", blas + "import fleet_jobs.electra_zh_en.job"],
        "import numpy + the causal_lm job": [sys.executable, "-c", blas + "import fleet_jobs.causal_lm.job"],
    }

    def run(cmd: list[str], tree: str, mode: str) -> dict:
        shutil.rmtree(out, ignore_errors=True)
        return bench_convert.run_process(cmd, tree, environment(tree, mode, prefix))

    for tree in trees.values():  # fill the bytecode cache for the "cached" runs
        for cmd in [*rows.values(), *floor.values()]:
            run(cmd, tree, "cached")
    best: dict[tuple, float] = {}
    for _ in range(args.rounds):
        for mode in MODES:
            for label, cmd in [*rows.items(), *floor.items()]:
                for name, tree in trees.items():
                    if label in floor and name != "now":
                        continue
                    cpu = run(cmd, tree, mode)["cpu"]
                    key = (label, name, mode)
                    best[key] = min(best.get(key, cpu), cpu)
    shutil.rmtree(out, ignore_errors=True)

    print(
        f"fleet local --workers 1 on a one-line file: CPU s of the process tree (user + system), least of "
        f"{args.rounds}; python {sys.version.split()[0]}; {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    names = list(trees)
    head = f"{'':34}" + "".join(f"{f'{mode}: ' + ', '.join(names):>28}" for mode in MODES)
    print(head)
    for label in [*rows, *floor]:
        cells = []
        for mode in MODES:
            values = [best[label, name, mode] for name in names if (label, name, mode) in best]
            text = ", ".join(f"{v:.3f}" for v in values)
            if len(values) == 2:
                text += f" ({values[0] / values[1]:.2f}x)"
            cells.append(f"{text:>28}")
        print(f"{label:34}" + "".join(cells))
    if args.before:
        print(f"(before: {args.before}; now: this checkout's files; (Nx) = before / now)")


if __name__ == "__main__":
    main()
