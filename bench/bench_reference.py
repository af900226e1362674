"""Per-core throughput of google-research/bert's and google-research/electra's pre-training data
scripts next to fleet's ``format=bert`` and ``format=electra``, in one run on the same text.

    git clone https://github.com/google-research/bert    /path/to/bert
    git clone https://github.com/google-research/electra /path/to/electra
    .venv/bin/python bench/bench_reference.py --bert-dir /path/to/bert --electra-dir /path/to/electra \\
        [--repeat 5] [--rounds 1] [--vocab vocab.txt]

(``pip install six`` if the venv lacks it: both references' tokenization.py import it.)

The references are not part of fleet and nothing of theirs is copied here: their own files are run,
unmodified, as subprocesses, with these flags (their defaults otherwise):

- bert: ``create_pretraining_data.py --input_file F --output_file O --vocab_file V --do_lower_case=True
  --max_seq_length=128 --max_predictions_per_seq=20 --masked_lm_prob=0.15 --dupe_factor=1``
  (so ``do_whole_word_mask`` False, ``short_seq_prob`` 0.1, ``random_seed`` 12345). It is TF1 code
  (``tf.flags``, ``tf.app.run``, ``tf.gfile``, ``tf.logging``, ``tf.python_io``), so under TF 2 it is
  started by ``TF1_LAUNCHER`` below (``python -c``): that puts ``tensorflow.compat.v1`` in
  ``sys.modules["tensorflow"]`` and then runs the file with ``runpy``.
- electra: ``build_pretraining_dataset.py --corpus-dir D --vocab-file V --output-dir O
  --max-seq-length 128 --num-processes 1 --blanks-separate-docs True --do-lower-case`` (it imports
  ``tensorflow.compat.v1`` itself and runs as is; it writes its usual 1000 output files).
- fleet: the whole ``fleet local FILE OUT --workers 1`` process (plan, the worker process, the
  summary and report, as a user runs it; CPU of the process tree), with ``--job bert``
  (whole-word masking with rjieba, fleet's default), ``--job bert --set whole_word_masking=false``
  (per-piece masking, as BERT's default) and ``--job electra_zh_en``; the same max_seq_length,
  masked_lm_prob, max_predictions_per_seq and dupe_factor as above. Its examples and bytes are
  read from the run's ``summary.json`` and ``part-*`` files.

All read one file: corpus/sample_zh.txt repeated N times then corpus/sample_en.txt N times (BERT's
input format: a line of text per line, blank lines between documents), and, as a second corpus
("short", run after the first unless ``--corpus`` says otherwise), the same with each sample's
lines cut into documents of 1-3 lines (``bench/short_corpus.py``); all use the same vocab
(``--vocab``, or one of 21128 trained on the sample with ``python -m fleet_jobs.text vocab``).
That training is not deterministic (a few tokens differ from one to the next), and BERT's count of
instances, so its work, moves by several per cent with its random path (seed or vocab): to compare
runs, give them one ``--vocab``.

MB = 10^6 bytes of UTF-8 text in the input's lines (fleet's ``text_bytes``; newlines not counted,
as in bench_convert.py), the same figure for every row. CPU seconds are the user + system time
of the child process (``os.wait4``: the child's own rusage, what ``getrusage(RUSAGE_CHILDREN)``
grows by), start-up included: Python, the imports (TensorFlow alone is some 3 s of CPU), the
vocab. "excl. start-up" subtracts the CPU seconds of the same command on a one-line input file
(``fleet local`` refuses an input with no text).
Each row runs ``--rounds`` times (rounds interleaved), the run with the least CPU is kept.
Peak RSS is the child's ``ru_maxrss``; this process imports nothing big before the runs, as Linux
carries a parent's peak into its children's.

At the end (in another process, as it imports TensorFlow) the records are checked: the first
``--check-records`` of each reference's output and of fleet's (converting the first documents)
are parsed with ``tf.io.parse_single_example`` and the feature specs of BERT's run_pretraining.py
and ELECTRA's pretrain_data.py, and their feature names, kinds and lengths compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

from short_corpus import short_documents  # noqa: E402

# Runs a TF1-era script under TF 2 from the outside: ``python -c TF1_LAUNCHER script.py args...``.
TF1_LAUNCHER = (
    "import os, runpy, sys\n"
    "import tensorflow.compat.v1 as tf\n"
    "sys.modules['tensorflow'] = tf  # tf.flags, tf.app, tf.gfile, tf.logging, tf.python_io\n"
    "script = sys.argv[1]\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.path.insert(0, os.path.dirname(os.path.abspath(script)))\n"
    "runpy.run_path(script, run_name='__main__')\n"
)

MAX_SEQ_LENGTH = 128
CORPORA = ("long", "short")
CORPUS_TEXT = {
    "long": "the sample corpus (131 man pages: long documents)",
    "short": "the same lines in documents of 1-3 lines (bench/short_corpus.py)",
}
MAX_PREDICTIONS = 20
MASKED_LM_PROB = 0.15

BERT_ROW = "bert create_pretraining_data.py"
ELECTRA_ROW = "electra build_pretraining_dataset.py"
FLEET_BERT = "fleet --job bert (whole-word, rjieba)"
FLEET_BERT_PIECES = "fleet --job bert, whole_word_masking=false"
FLEET_ELECTRA = "fleet --job electra_zh_en"
FLEET_OPTIONS = {  # format: what the records check converts in-process (bench_convert.configured)
    FLEET_BERT: {"format": "bert"},
    FLEET_BERT_PIECES: {"format": "bert", "whole_word_masking": False},
    FLEET_ELECTRA: {"format": "electra"},
}
BERT_SPECIFIC = {"masked_lm_prob": MASKED_LM_PROB, "max_predictions_per_seq": MAX_PREDICTIONS, "dupe_factor": 1}
SPEEDUPS = [(FLEET_BERT, BERT_ROW), (FLEET_BERT_PIECES, BERT_ROW), (FLEET_ELECTRA, ELECTRA_ROW)]


def run(cmd: list[str], log: str, cwd: str | None = None) -> dict:
    """Run cmd to the end; its CPU seconds (user + system), wall seconds, peak RSS and stdout."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")  # every run compiles alike; no __pycache__ in checkouts
    with open(log + ".out", "wb") as out, open(log + ".err", "wb") as err:
        w0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - w0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        with open(log + ".err", "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace")
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    with open(log + ".out", "rb") as f:
        stdout = f.read().decode(errors="replace")
    return {"cpu": usage.ru_utime + usage.ru_stime, "wall": wall, "rss_mib": usage.ru_maxrss / 1024, "stdout": stdout}


def commands(args, vocab: str, text_file: str, corpus_dir: str, out: str) -> dict[str, list[str]]:
    """Row label -> command converting text_file (electra: the folder corpus_dir holding it) into out."""
    py = sys.executable
    cmds = {
        BERT_ROW: [
            py,
            "-c",
            TF1_LAUNCHER,
            os.path.join(args.bert_dir, "create_pretraining_data.py"),
            f"--input_file={text_file}",
            f"--output_file={os.path.join(out, 'bert.tfrecord')}",
            f"--vocab_file={vocab}",
            "--do_lower_case=True",
            f"--max_seq_length={MAX_SEQ_LENGTH}",
            f"--max_predictions_per_seq={MAX_PREDICTIONS}",
            f"--masked_lm_prob={MASKED_LM_PROB}",
            "--dupe_factor=1",
        ],
        ELECTRA_ROW: [
            py,
            os.path.join(args.electra_dir, "build_pretraining_dataset.py"),
            "--corpus-dir",
            corpus_dir,
            "--vocab-file",
            vocab,
            "--output-dir",
            os.path.join(out, "electra"),
            "--max-seq-length",
            str(MAX_SEQ_LENGTH),
            "--num-processes",
            "1",
            "--blanks-separate-docs",
            "True",
            "--do-lower-case",
        ],
    }
    fleet = os.path.join(os.path.dirname(py), "fleet")
    for label, options in FLEET_OPTIONS.items():
        job = "bert" if options["format"] == "bert" else "electra_zh_en"
        more = {k: v for k, v in options.items() if k != "format"}
        sets = {
            "vocab_file": vocab,
            "max_seq_length": MAX_SEQ_LENGTH,
            **more,
            **(BERT_SPECIFIC if job == "bert" else {}),
        }
        cmds[label] = [fleet, "local", text_file, fleet_out(out, label), "--job", job, "--workers", "1"]
        cmds[label] += [a for k, v in sets.items() for a in ("--set", f"{k}={str(v).lower() if v is False else v}")]
    return cmds


def fleet_out(out: str, label: str) -> str:
    """The output folder of a fleet row."""
    return os.path.join(out, "fleet-" + "".join(c if c.isalnum() else "-" for c in label))


def check_child(outputs_json: str, text_file: str, vocab: str, n: str) -> None:
    """In a fresh process (TensorFlow's import is big and noisy): parse records of each reference's
    output and of fleet's, print the comparison."""
    print("\n".join(count_and_check(json.loads(outputs_json), text_file, vocab, int(n))))


def count_and_check(outputs: dict[str, list[str]], text_file: str, vocab: str, n: int) -> list[str]:
    """Records of each reference's output next to fleet's; report lines."""
    sys.path.insert(0, BENCH)
    import bench_convert
    import tensorflow as tf

    def int_spec(length):
        return tf.io.FixedLenFeature([length], tf.int64)

    # The parsers the records are for: run_pretraining.py's input_fn and ELECTRA's pretrain_data.py.
    specs = {
        "bert": {
            "input_ids": int_spec(MAX_SEQ_LENGTH),
            "input_mask": int_spec(MAX_SEQ_LENGTH),
            "segment_ids": int_spec(MAX_SEQ_LENGTH),
            "masked_lm_positions": int_spec(MAX_PREDICTIONS),
            "masked_lm_ids": int_spec(MAX_PREDICTIONS),
            "masked_lm_weights": tf.io.FixedLenFeature([MAX_PREDICTIONS], tf.float32),
            "next_sentence_labels": int_spec(1),
        },
        "electra": {
            "input_ids": int_spec(MAX_SEQ_LENGTH),
            "input_mask": int_spec(MAX_SEQ_LENGTH),
            "segment_ids": int_spec(MAX_SEQ_LENGTH),
        },
    }

    def signature(records):
        """{name: kind[len]} seen in these records, e.g. input_ids: int64_list[128]."""
        seen: dict[str, set[str]] = {}
        for rec in records:
            for name, feat in tf.train.Example.FromString(rec).features.feature.items():
                kind = feat.WhichOneof("kind")
                seen.setdefault(name, set()).add(f"{kind}[{len(getattr(feat, kind).value)}]")
        return {k: "|".join(sorted(v)) for k, v in sorted(seen.items())}

    def parses(records, spec):
        for rec in records:
            parsed = tf.io.parse_single_example(rec, spec)
            assert all(parsed[k].shape == spec[k].shape for k in spec)
        return len(records)

    # fleet's records: the same conversion as the timed rows, of the first documents, into memory.
    with open(text_file, "rb") as f:
        docs = bench_convert.read_all(f.read(), "input.txt")[:40]
    fleet_records = {}
    for label, options in FLEET_OPTIONS.items():
        job, config = bench_convert.configured(
            {
                "vocab_file": vocab,
                "max_seq_length": MAX_SEQ_LENGTH,
                **options,
                **(BERT_SPECIFIC if options["format"] == "bert" else {}),
            }
        )
        sink = bench_convert.MemorySink()
        job.document_converter(config, bench_convert.read_file).convert(
            docs, bench_convert.ItemContext("check", 1, "check"), sink
        )
        data = b"".join(f.getvalue() for f in sink.files.values())
        path = os.path.join(os.path.dirname(text_file), f"fleet-{options['format']}-check.tfrecord")
        with open(path, "wb") as f:
            f.write(data)
        fleet_records[label] = [r.numpy() for r in tf.data.TFRecordDataset([path]).take(n)]

    lines = []
    for ref, fleet_label, fmt in ((BERT_ROW, FLEET_BERT, "bert"), (ELECTRA_ROW, FLEET_ELECTRA, "electra")):
        files = [f for f in outputs[ref] if os.path.getsize(f) > 0]
        ref_records = [r.numpy() for r in tf.data.TFRecordDataset(files).take(n)]
        a, b = signature(ref_records), signature(fleet_records[fleet_label])
        ok_ref = parses(ref_records, specs[fmt])
        ok_fleet = parses(fleet_records[fleet_label], specs[fmt])
        same = "the same" if a == b else "DIFFERENT"
        parser = "run_pretraining.py" if fmt == "bert" else "pretrain_data.py"
        lines.append(
            f"  {ref} vs {fleet_label}: features {same} "
            f"(first {len(ref_records)} and {len(fleet_records[fleet_label])} records); "
            f"tf.io.parse_single_example with {parser}'s spec: {ok_ref} + {ok_fleet} parsed"
        )
        for name in sorted(set(a) | set(b)):
            lines.append(f"    {name:22} {a.get(name, '-'):22} {b.get(name, '-')}")
    return lines


def count_records(files: list[str]) -> tuple[int, float]:
    """Records and bytes of TFRecord files, from their framing (8-byte length, 4-byte CRC, data, CRC)."""
    n = size = 0
    for path in files:
        size += os.path.getsize(path)
        with open(path, "rb") as f:
            while header := f.read(12):
                length = int.from_bytes(header[:8], "little")
                f.seek(length + 4, os.SEEK_CUR)
                n += 1
    return n, size / 1e6


def measure(args, corpus: str, samples: list[str], vocab: str, vocab_size: int, folder: str):
    """Every row on one corpus; prints its table. Returns the speed-ups and what the check reads."""
    os.makedirs(folder)
    # The input: one file in a folder of its own (ELECTRA reads folders), and a one-line one for start-up.
    corpus_dir, empty_dir = os.path.join(folder, "corpus"), os.path.join(folder, "empty")
    for d in (corpus_dir, empty_dir):
        os.makedirs(d)
    text_file, empty_file = os.path.join(corpus_dir, "input.txt"), os.path.join(empty_dir, "input.txt")
    with open(text_file, "wb") as out:
        for path in samples:
            with open(path, "rb") as f:
                one = f.read().rstrip(b"\n") + b"\n\n"
            out.write((short_documents(one) if corpus == "short" else one) * args.repeat)
    with open(empty_file, "wb") as f:
        f.write(b"hello world\n")
    out_dir, empty_out = os.path.join(folder, "out"), os.path.join(folder, "out-empty")
    os.makedirs(out_dir)
    os.makedirs(empty_out)
    cmds = commands(args, vocab, text_file, corpus_dir, out_dir)
    empty_cmds = commands(args, vocab, empty_file, empty_dir, empty_out)

    def commit(d):
        try:
            r = subprocess.run(
                ["git", "-C", d, "log", "-1", "--format=%h %cs"], check=False, capture_output=True, text=True
            )
        except OSError:
            return "commit unknown"
        return r.stdout.strip() if r.returncode == 0 else "not a git checkout"

    load0 = os.getloadavg()
    print(
        f"input: corpus/sample_zh.txt {args.repeat}x + corpus/sample_en.txt {args.repeat}x in one file"
        f"{', cut into documents of 1-3 lines' if corpus == 'short' else ''} "
        f"({os.path.getsize(text_file) / 1e6:.2f} MB file); "
        f"vocab {vocab_size} tokens ({'given' if args.vocab else 'trained on the sample, --size 21128'}); "
        f"max_seq_length {MAX_SEQ_LENGTH}, do_lower_case, dupe_factor 1"
    )
    print(
        f"bert {commit(args.bert_dir)} (under the TF1 launcher), electra {commit(args.electra_dir)} (as is); "
        f"python {sys.version.split()[0]}; {os.cpu_count()} CPUs; load average {load0[0]:.2f} at start; "
        f"{'least CPU of ' + str(args.rounds) + ' rounds' if args.rounds > 1 else 'one round'}"
    )

    best: dict[str, dict] = {}
    startup: dict[str, dict] = {}
    t0 = time.perf_counter()
    for rnd in range(args.rounds):
        for i, (label, cmd) in enumerate(cmds.items()):
            for o in (out_dir, empty_out):  # a fleet output folder that exists would be a resume
                shutil.rmtree(fleet_out(o, label), ignore_errors=True)
            r = run(cmd, os.path.join(folder, f"log-{i}-{rnd}"))
            if label not in best or r["cpu"] < best[label]["cpu"]:
                best[label] = r
            e = run(empty_cmds[label], os.path.join(folder, f"log-{i}-{rnd}-empty"))
            if label not in startup or e["cpu"] < startup[label]["cpu"]:
                startup[label] = e
    elapsed = time.perf_counter() - t0
    load1 = os.getloadavg()

    outputs = {
        BERT_ROW: [os.path.join(out_dir, "bert.tfrecord")],
        ELECTRA_ROW: sorted(os.path.join(out_dir, "electra", f) for f in os.listdir(os.path.join(out_dir, "electra"))),
    }
    examples = {label: count_records(files) for label, files in outputs.items()}
    text_mbs = set()
    for label in FLEET_OPTIONS:
        folder = fleet_out(out_dir, label)
        with open(os.path.join(folder, "summary.json")) as f:
            summary = json.load(f)
        parts = [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith("part-")]
        examples[label] = (summary["examples"], sum(map(os.path.getsize, parts)) / 1e6)
        text_mbs.add(summary["text_bytes"] / 1e6)
    assert len(text_mbs) == 1, text_mbs
    text_mb = text_mbs.pop()  # fleet's text_bytes, the same figure for every row

    print(
        f"\nMB = {text_mb:.3f} MB of UTF-8 text in the input's lines; MB/s per core = MB / CPU seconds of the "
        f"child process (user + system); wall MB/s beside it\n"
    )
    width = max(map(len, cmds))
    head = (
        f"{'':{width}}  {'MB/s/core':>9} {'wall MB/s':>9} {'CPU s':>7} {'wall s':>7}  {'start-up CPU s':>14} "
        f"{'MB/s/core excl. start-up':>24}  {'peak RSS':>9}  {'examples':>8} {'MB out':>7}"
    )
    print(head)
    speed, speed_net, speed_wall = {}, {}, {}
    for label in cmds:
        r, s = best[label], startup[label]
        net = r["cpu"] - s["cpu"]
        speed[label], speed_wall[label] = text_mb / r["cpu"], text_mb / r["wall"]
        speed_net[label] = text_mb / net if net > 0 else float("inf")
        n, mb = examples[label]
        print(
            f"{label:{width}}  {speed[label]:9.3f} {speed_wall[label]:9.3f} {r['cpu']:7.2f} {r['wall']:7.2f}  "
            f"{s['cpu']:14.2f} {speed_net[label]:24.3f}  "
            f"{r['rss_mib']:5.0f} MiB  {n:8,} {mb:7.2f}"
        )
    print(f"\n(all rows ran in {elapsed:.0f} s wall; load average {load1[0]:.2f} at the end)")
    print("\nspeed-up of fleet over the references, this run (per core; excl. start-up; wall):")
    for fleet_label, ref in SPEEDUPS:
        print(
            f"  {fleet_label:{width}} vs {ref}: {speed[fleet_label] / speed[ref]:5.1f}x; "
            f"{speed_net[fleet_label] / speed_net[ref]:5.1f}x; {speed_wall[fleet_label] / speed_wall[ref]:5.1f}x"
        )
    ratios = {(f, r): (speed[f] / speed[r], speed_net[f] / speed_net[r]) for f, r in SPEEDUPS}
    return ratios, (outputs, text_file, out_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bert-dir", help="a checkout of https://github.com/google-research/bert")
    ap.add_argument("--electra-dir", help="a checkout of https://github.com/google-research/electra")
    ap.add_argument("--repeat", type=int, default=5, help="each sample file this many times (default 5)")
    ap.add_argument(
        "--corpus",
        choices=("long", "short", "both"),
        default="both",
        help="long: the sample; short: its lines in documents of 1-3 lines; both (default)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="run every row this many times, keep the least CPU")
    ap.add_argument("--vocab", help="vocab.txt (default: train one of 21128 on the sample)")
    ap.add_argument("--check-records", type=int, default=200, help="records of each output to parse and compare")
    ap.add_argument("--check-child", nargs=4, metavar=("OUTPUTS_JSON", "PATH", "VOCAB", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.check_child:
        check_child(*args.check_child)
        return
    if not args.bert_dir or not args.electra_dir:
        ap.error("--bert-dir and --electra-dir are required (see the docstring: git clone ...)")
    for d, f in ((args.bert_dir, "create_pretraining_data.py"), (args.electra_dir, "build_pretraining_dataset.py")):
        if not os.path.isfile(os.path.join(d, f)):
            ap.error(f"{d}: no {f} there")
    args.bert_dir, args.electra_dir = os.path.abspath(args.bert_dir), os.path.abspath(args.electra_dir)

    tmp = tempfile.TemporaryDirectory(prefix="bench-ref-")
    samples = [os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("zh", "en")]
    vocab = os.path.abspath(args.vocab) if args.vocab else os.path.join(tmp.name, "vocab.txt")
    if not args.vocab:
        subprocess.run(
            [sys.executable, "-m", "fleet_jobs.text", "vocab", *samples, "--size", "21128", "--out", vocab],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    with open(vocab, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)

    speedups: dict[str, dict[tuple[str, str], tuple[float, float]]] = {}
    checked = None
    for corpus in CORPORA if args.corpus == "both" else (args.corpus,):
        print(f"\n=== {corpus}: {CORPUS_TEXT[corpus]} ===")
        speedups[corpus], files = measure(args, corpus, samples, vocab, vocab_size, os.path.join(tmp.name, corpus))
        checked = checked or files
    if len(speedups) > 1:
        print("\nspeed-up of fleet over the references on both corpora, this run (per core; excl. start-up):")
        for fleet_label, ref in SPEEDUPS:
            cells = "; ".join(
                f"{c} {speedups[c][fleet_label, ref][0]:.1f}x, {speedups[c][fleet_label, ref][1]:.1f}x"
                for c in speedups
            )
            print(f"  {fleet_label} vs {ref}: {cells}")

    outputs, text_file, out_dir = checked
    print("\nrecords (feature: reference's kind[length] | fleet's):")
    check = run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--check-child",
            json.dumps(outputs),
            text_file,
            vocab,
            str(args.check_records),
        ],
        os.path.join(tmp.name, "log-check"),
    )
    print(check["stdout"], end="")
    shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
