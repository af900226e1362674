"""Near-duplicate removal side by side: fleet's ``--dedup near`` and datatrove's MinHash
pipeline, on one synthetic corpus whose duplicates are known, against an exact ground truth.

    .venv/bin/python bench/near_dedup.py [--mb 25] [--seed 0] [--threshold 0.8]
        [--work-dir DIR] [--datatrove-python /work/dt-venv/bin/python] [--skip datatrove,fleet,plain]

Corpus (seeded, deterministic): one JSON Lines file, ``{"id": "d0000123", "text": ...}`` a
line. A base document is 2-4 runs of consecutive lines of ``corpus/sample_en.txt`` (English
man pages) with a Zipf-distributed synthetic word (s = 1.07 over 30,000 made-up words) after
about one word in six, so no two base documents share much. Planted, each ~5% of the
documents: exact copies of a base document; near copies (1% of its words replaced, at least
one); look-alikes (40% replaced); and one boilerplate page copied ``--boilerplate`` times
(2,000). The order is shuffled with the seed; what each document is (and its source) is kept.

Ground truth: exact Jaccard over fleet's own shingles (``fleet_jobs.text.stages.near.shingles``,
word 5-grams of its normalized words, as a set). A document should be dropped iff an EARLIER
document (corpus order) has Jaccard >= ``--threshold`` with it. Not all pairs: identical sets
are collapsed first (the boilerplate alone would be 2M pairs), then prefix filtering finds the
candidates (with shingles ordered rarest first, a pair with J >= t shares one of the first
ceil((1 - t) * |x|) + 1 of each set, and |y| >= t * |x|), and those get their exact Jaccard.

Rows, each a fresh process tree on one core (RAYON_NUM_THREADS=1, OMP/OPENBLAS threads 1):

- ``datatrove``: its four MinHash stages (signatures, buckets, clustering, filter, as in its
  examples/minhash_deduplication.py) in one ``LocalPipelineExecutor`` per stage, workers=1,
  tasks=1 (the buckets stage must have a multiple of num_buckets tasks: 14, run one after the
  other), word 5-grams, 14 buckets x 8 hashes, its default 64-bit xxhash; the filter writes the
  kept documents and, with an exclusion writer, the removed ones, whose ids say what it dropped.
  It has no threshold: every pair that shares a band is a duplicate (the S-curve's midpoint is
  near (1/14)**(1/8) = 0.72), so ``--threshold`` moves the truth and fleet only.
  It runs from its own venv (``--datatrove-python``; ``pip install 'datatrove[processing]' spacy``:
  its English word tokenizer is spaCy's), never fleet's.
- ``fleet near``: ``fleet local CORPUS OUT --workers 1 --job causal_lm --set tokenizer_file=...
  --set output=megatron --dedup near --set near_threshold=T --set near_clusters=true``; the sidecars
  ``part-*.near.jsonl`` (a line per member of each cluster: file, offset, kept) say what it
  dropped. fleet also tokenizes and writes tokens, datatrove only filters text: so
- ``fleet plain``: the same command without ``--dedup``, whose CPU is the conversion's; the
  difference of the two is what the near dedup costs.

The tokenizer is a byte-level BPE of 8,000 tokens trained here (``tokenizers``) on the first
2,000 documents.

Figures, per row:

- documents dropped; recall and precision against the ground truth;
- pairs with one dropped: of the pairs of distinct texts with J >= t (the first document of
  each), the share with either member dropped (recall whichever member a system keeps), and
  the same for the pairs of J in [t, t + 0.05), [t + 0.05, 0.9) and >= 0.9 (the truth
  column: how many pairs);
- near copies caught: of the planted near copies whose exact J with their base is >= t, the
  share whose later member in corpus order was dropped; look-alikes kept;
- exact copies and boilerplate copies dropped, of those after the first of their text in
  corpus order (which must all go);
- the documents missed and those dropped wrongly, by planted kind; the exact J range of the
  missed ones with their earlier partner; the wrong drops split by their largest exact J with
  an earlier document (known down to ``--floor``, 0.6): between floor and t (the estimate or
  the bands erred near the threshold), below floor (a chain, or a cluster that kept a later
  member); and how many of them have J >= t with a later document (their cluster kept another
  member than the earliest: datatrove keeps a cluster's union-find root);
- MB/s per core = corpus MB (10^6 bytes of the JSONL file) / CPU, CPU = user + system seconds
  of the whole process tree (the difference of ``getrusage(RUSAGE_CHILDREN)`` around the run);
  wall seconds; peak RSS, the largest ``ru_maxrss`` in the tree (``os.wait4`` in a small
  process that starts the command: RUSAGE_CHILDREN's maxrss is the largest of every child so
  far, and a child forked from this script would start at its size).

One run each, no timed assertion; run nothing else heavy beside it (about 4 minutes at 25 MB,
most of it datatrove).

Measured 2026-11-29 (this 2-core machine, shared; 25.6 MB, 26,027 documents, seed 0; datatrove
0.10.1): recall / precision datatrove 0.996 / 0.991, fleet 0.991 / 0.998; pairs with one
dropped 0.995 vs 0.967, the gap all in J [0.80, 0.85) (133 pairs: 0.97 vs 0.73), where fleet's
estimate-at-the-threshold test (112 sketch bytes, sd ~0.03) misses about a quarter and
datatrove's unverified bands catch nearly all, paying with drops below the threshold (26 vs 8
at J 0.6-0.8). CPU, machine otherwise idle: datatrove 159-163 s (0.16 MB/s a core, 97% of it
its signatures stage: spaCy's word tokenizer), fleet with --dedup near 20.6-21.2 s (1.2 MB/s a
core, tokenizing and writing Megatron files included), without 8.8-9.2 s: the near dedup itself
11-12 s, 2.1-2.2 MB/s a core (about half of it near.signatures: 6.1 s for these texts in one
process; the rest 14 band records a document through the shuffle, the graph stages and the
second read of the input). Peak RSS: datatrove 127 MB, fleet 104 MB plain, 172 MB with near
(its 1 Mi-character signature batches).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import random
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fleet_jobs.text.stages.near import shingles  # noqa: E402

NGRAM = 5
ONE_CORE = {
    "RAYON_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}
BOILERPLATE = (
    "Cookie notice\n"
    "We use cookies and similar technologies to provide the best experience on our website, to "
    "remember your preferences, to measure how the site is used and to show you content that may "
    "interest you. By clicking Accept all you agree to the storing of cookies on your device. You can "
    "change your choice at any time from the Privacy settings link at the bottom of every page.\n"
    "Terms of use | Privacy policy | Contact us | Sitemap | Accessibility\n"
    "Copyright 2024 Example Media Group. All rights reserved. No part of this site may be reproduced "
    "without our written permission."
)


# ---------------------------------------------------------------- corpus


@dataclass
class Corpus:
    texts: list[str]  # in corpus order
    kinds: list[str]  # base, exact, near, lookalike, boilerplate
    sources: list[int]  # the base document's position a planted one was made from (-1: none)
    path: str = ""
    offsets: dict[int, int] = field(default_factory=dict)  # byte offset of a line -> position
    mb: float = 0.0


def synthetic_words(rng: random.Random, n: int) -> list[str]:
    """n distinct made-up words of 2-4 syllables (so the synthetic text is word-like)."""
    onsets, vowels, codas = (
        "b c d f g h j k l m n p r s t v w z br ch dr fl gr pl sh st tr".split(),
        "a e i o u ai ea oo".split(),
        ["", "", "n", "r", "s", "t", "l", "m"],
    )
    seen: set[str] = set()
    while len(seen) < n:
        seen.add("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(2, 4))))
    return sorted(seen)


class Zipf:
    def __init__(self, rng: random.Random, words: list[str], s: float = 1.07):
        self.rng, self.words = rng, words
        rng.shuffle(self.words)
        self.cum = list(accumulate(1 / (r**s) for r in range(1, len(words) + 1)))

    def word(self) -> str:
        return self.words[bisect.bisect(self.cum, self.rng.random() * self.cum[-1])]


def base_document(rng: random.Random, lines: list[str], zipf: Zipf) -> str:
    """2-4 runs (more while under 40 words) of 2-5 consecutive lines of the sample, a synthetic
    word after ~1 word in 6. One word changed in a document of under ~60 words leaves J < 0.8:
    a few planted near copies fall below the threshold."""
    out: list[str] = []
    runs = n_words = 0
    while runs < 2 or n_words < 40 or (runs < 4 and rng.random() < 0.3):
        start = rng.randrange(len(lines) - 5)
        for line in lines[start : start + rng.randint(2, 5)]:
            words = []
            for w in line.split():
                words.append(w)
                if rng.random() < 0.17:
                    words.append(zipf.word())
            out.append(" ".join(words))
            n_words += len(words)
        runs += 1
    return "\n".join(out)


def mutate(rng: random.Random, text: str, fraction: float, zipf: Zipf) -> str:
    """The text with round(fraction * words) words (at least 1) replaced by a different synthetic
    word; line breaks kept."""
    lines = [line.split(" ") for line in text.split("\n")]
    spots = [(i, j) for i, line in enumerate(lines) for j in range(len(line))]
    for i, j in rng.sample(spots, max(1, round(fraction * len(spots)))):
        new = zipf.word()
        while new == lines[i][j]:
            new = zipf.word()
        lines[i][j] = new
    return "\n".join(" ".join(line) for line in lines)


def build_corpus(mb: float, seed: int, boilerplate: int, share: float) -> Corpus:
    """Base documents until the corpus is about ``mb`` MB, ``share`` of the documents planted of
    each kind, ``boilerplate`` copies of one page; shuffled."""
    rng = random.Random(seed)
    with open(os.path.join(ROOT, "corpus", "sample_en.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    zipf = Zipf(rng, synthetic_words(rng, 30_000))
    target = mb * 1e6 - boilerplate * (len(BOILERPLATE) + 30)
    base: list[str] = []
    size = 0.0
    while size < target * (1 - 3 * share):
        base.append(base_document(rng, lines, zipf))
        size += len(base[-1].encode()) + 30
    n_each = round(share * len(base) / (1 - 3 * share))
    docs = [(t, "base", i) for i, t in enumerate(base)]
    for i in (rng.randrange(len(base)) for _ in range(n_each)):
        docs.append((base[i], "exact", i))
    for i in (rng.randrange(len(base)) for _ in range(n_each)):
        docs.append((mutate(rng, base[i], 0.01, zipf), "near", i))
    for i in (rng.randrange(len(base)) for _ in range(n_each)):
        docs.append((mutate(rng, base[i], 0.40, zipf), "lookalike", i))
    docs += [(BOILERPLATE, "boilerplate", -1)] * boilerplate
    order = list(range(len(docs)))
    rng.shuffle(order)
    position = {old: new for new, old in enumerate(order)}  # a base document's index in docs is its base id
    return Corpus(
        texts=[docs[k][0] for k in order],
        kinds=[docs[k][1] for k in order],
        sources=[position[docs[k][2]] if docs[k][2] >= 0 else -1 for k in order],
    )


def write_corpus(corpus: Corpus, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    corpus.path = os.path.join(folder, "corpus.jsonl")
    at = 0
    with open(corpus.path, "wb") as f:
        for i, text in enumerate(corpus.texts):
            line = (json.dumps({"id": f"d{i:07d}", "text": text}, ensure_ascii=False) + "\n").encode()
            corpus.offsets[at] = i
            f.write(line)
            at += len(line)
    corpus.mb = at / 1e6


# ---------------------------------------------------------------- ground truth


def jaccard(x: np.ndarray, y: np.ndarray) -> float:
    inter = len(np.intersect1d(x, y, assume_unique=True))
    return inter / (len(x) + len(y) - inter)


@dataclass
class Truth:
    drop: np.ndarray  # bool per document: an earlier document has J >= t
    earlier: np.ndarray  # per document: the largest J with an earlier document (0 when below floor)
    any: np.ndarray  # per document: the largest J with any other document (0 when below floor)
    pairs: np.ndarray  # (n, 2) first documents of two distinct shingle sets with J >= t
    pair_j: np.ndarray  # their J
    stats: dict


def ground_truth(sets: list[np.ndarray], t: float, floor: float) -> Truth:
    """Which documents should be dropped (an earlier one has J >= t), by prefix filtering; and
    each document's largest J with an earlier / any document, exact down to ``floor`` (<= t)."""
    uid = np.empty(len(sets), np.int64)
    index: dict[bytes, int] = {}
    unique: list[np.ndarray] = []
    for i, s in enumerate(sets):
        uid[i] = index.setdefault(s.tobytes(), len(unique))
        if uid[i] == len(unique):
            unique.append(s)  # unique ids are in the order of first occurrence
    values, df = np.unique(np.concatenate(unique), return_counts=True)
    rank = np.empty(len(values), np.int64)
    rank[np.lexsort((values, df))] = np.arange(len(values))  # rarest first, ties by value
    tok, doc = [], []
    sizes = np.array([len(s) for s in unique])
    for u, s in enumerate(unique):
        if not len(s):
            continue  # no word, never a near duplicate
        p = min(len(s), math.ceil((1 - floor) * len(s)) + 1)
        r = np.sort(rank[np.searchsorted(values, s)])[:p]
        tok.append(r)
        doc.append(np.full(p, u, np.int64))
    tok_a, doc_a = np.concatenate(tok), np.concatenate(doc)
    order = np.lexsort((doc_a, tok_a))
    tok_a, doc_a = tok_a[order], doc_a[order]
    keys = []
    for group in np.split(doc_a, np.flatnonzero(np.diff(tok_a)) + 1):
        if len(group) > 1:
            a, b = np.triu_indices(len(group), 1)
            keys.append(group[a] * len(unique) + group[b])  # a < b: the group is sorted
    cand = np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
    a, b = cand // len(unique), cand % len(unique)
    small, large = np.minimum(sizes[a], sizes[b]), np.maximum(sizes[a], sizes[b])
    keep = small >= floor * large - 1e-9  # J <= |small| / |large|
    a, b = a[keep], b[keep]
    earlier_u, any_u = np.zeros(len(unique)), np.zeros(len(unique))
    similar: list[tuple[int, int]] = []
    similar_j: list[float] = []
    for x, y in zip(a.tolist(), b.tolist()):
        j = jaccard(unique[x], unique[y])
        if j >= floor:
            if j >= t:
                similar.append((x, y))
                similar_j.append(j)
            earlier_u[y] = max(earlier_u[y], j)
            any_u[x], any_u[y] = max(any_u[x], j), max(any_u[y], j)
    earlier, first = earlier_u[uid], np.full(len(unique), -1)
    for i, u in enumerate(uid.tolist()):
        if first[u] >= 0:
            earlier[i] = 1.0  # a later copy of the same set
        else:
            first[u] = i
    counts = np.bincount(uid, minlength=len(unique))
    most = np.where(counts[uid] > 1, 1.0, any_u[uid])
    return Truth(
        earlier >= t,
        earlier,
        most,
        first[np.array(similar, np.int64).reshape(-1, 2)],
        np.array(similar_j),
        {
            "unique sets": len(unique),
            f"candidates at J >= {floor}": len(cand),
            "after length filter": len(a),
            f"pairs at J >= {t}": len(similar),
        },
    )


# ---------------------------------------------------------------- runs


@dataclass
class Run:
    name: str
    command: list[str]
    cpu: float = 0.0
    wall: float = 0.0
    rss_mb: float = 0.0
    dropped: np.ndarray | None = None
    note: str = ""


# python -c PEAK_RSS FD COMMAND...: runs the command and writes its tree's peak RSS (KiB) to FD.
# A process's ru_maxrss starts at its parent's RSS when it forked (exec keeps the old image's
# high-water mark), so the command is started from this small process, not from the bench,
# which holds the corpus.
PEAK_RSS = """import os, sys
fd = int(sys.argv[1])
os.set_inheritable(fd, False)
pid = os.posix_spawn(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
os.write(fd, str(usage.ru_maxrss).encode())
sys.exit(os.waitstatus_to_exitcode(status))
"""


def measure(run: Run, log: str) -> None:
    """Run the command; CPU of its tree (RUSAGE_CHILDREN before/after), wall, peak RSS."""
    read, write = os.pipe()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", PEAK_RSS, str(write), *run.command],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, **ONE_CORE),
            pass_fds=(write,),
        )
        os.close(write)
        proc.wait()
    run.wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    run.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with os.fdopen(read, "rb") as f:
        run.rss_mb = int(f.read() or 0) / 1024
    if proc.returncode:
        with open(log, "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace")
        raise SystemExit(f"{run.name} failed (exit {proc.returncode}): {shlex.join(run.command)}\n{tail}")


DATATROVE_PIPELINE = '''"""datatrove's MinHash dedup, its four stages, one core (written and run by bench/near_dedup.py)."""
import sys

from datatrove.executor.local import LocalPipelineExecutor
from datatrove.pipeline.dedup import MinhashDedupSignature
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers.jsonl import JsonlWriter
from datatrove.utils.hashing import HashConfig
from datatrove.utils.typeshelper import Languages

corpus, work = sys.argv[1], sys.argv[2]
config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, hash_config=HashConfig(precision=64))
stages = [
    ([JsonlReader(corpus), MinhashDedupSignature(f"{work}/signatures", config=config, language=Languages.english)], 1),
    ([MinhashDedupBuckets(f"{work}/signatures", f"{work}/buckets", config=config)], config.num_buckets),
    ([MinhashDedupCluster(f"{work}/buckets", f"{work}/remove_ids", config=config)], 1),
    (
        [
            JsonlReader(corpus),
            MinhashDedupFilter(
                f"{work}/remove_ids",
                exclusion_writer=JsonlWriter(f"{work}/removed", output_filename="removed.jsonl", compression=None),
            ),
            JsonlWriter(f"{work}/kept", output_filename="kept.jsonl", compression=None),
        ],
        1,
    ),
]
for i, (pipeline, tasks) in enumerate(stages, 1):
    LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=f"{work}/logs/stage{i}").run()
'''


def run_datatrove(corpus: Corpus, python: str, work: str) -> Run:
    folder = os.path.join(work, "datatrove")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    script = os.path.join(folder, "minhash.py")
    with open(script, "w") as f:
        f.write(DATATROVE_PIPELINE)
    run = Run("datatrove", [python, script, os.path.dirname(corpus.path), folder])
    measure(run, os.path.join(work, "datatrove.log"))
    run.dropped = np.zeros(len(corpus.texts), bool)
    with open(os.path.join(folder, "removed", "removed.jsonl"), encoding="utf-8") as f:
        for line in f:
            run.dropped[int(json.loads(line)["id"][1:])] = True
    seconds = []  # each stage's steps' time, as its executor's stats.json says (wall, not CPU)
    for i in range(1, 5):
        with open(os.path.join(folder, "logs", f"stage{i}", "stats.json"), encoding="utf-8") as f:
            seconds.append(sum(step["time_stats"]["total"] for step in json.load(f)))
    run.note = "stage seconds: " + ", ".join(
        f"{name} {t:.1f}" for name, t in zip(("signatures", "buckets", "clusters", "filter"), seconds)
    )
    return run


def train_tokenizer(corpus: Corpus, work: str) -> str:
    from tokenizers import ByteLevelBPETokenizer

    path = os.path.join(work, "tokenizer.json")
    if not os.path.exists(path):
        tokenizer = ByteLevelBPETokenizer()
        tokenizer.train_from_iterator(
            corpus.texts[:2000], vocab_size=8000, special_tokens=["<|endoftext|>"], show_progress=False
        )
        tokenizer.save(path)
    return path


def fleet_command(corpus: Corpus, out: str, tokenizer: str, near: bool, threshold: float) -> list[str]:
    fleet = os.path.join(os.path.dirname(sys.executable), "fleet")
    cmd = [fleet, "local", os.path.dirname(corpus.path), out, "--workers", "1", "--job", "causal_lm"]
    cmd += ["--set", f"tokenizer_file={tokenizer}", "--set", "output=megatron"]
    if near:
        cmd += ["--dedup", "near", "--set", f"near_threshold={threshold}", "--set", "near_clusters=true"]
    return cmd


def run_fleet(corpus: Corpus, work: str, tokenizer: str, near: bool, threshold: float) -> Run:
    name = "fleet near" if near else "fleet plain"
    out = os.path.join(work, name.replace(" ", "-"))
    shutil.rmtree(out, ignore_errors=True)
    run = Run(name, fleet_command(corpus, out, tokenizer, near, threshold))
    measure(run, out + ".log")
    if not near:
        return run
    run.dropped = np.zeros(len(corpus.texts), bool)
    seen = np.zeros(len(corpus.texts), bool)
    sidecars = sorted(n for n in os.listdir(out) if n.startswith("part-") and n.endswith(".near.jsonl"))
    for name in sidecars:
        with open(os.path.join(out, name), encoding="utf-8") as f:
            for line in f:
                member = json.loads(line)
                i = corpus.offsets[member["offset"]]
                if seen[i]:
                    run.note = "a document in two sidecar lines"
                seen[i] = True
                run.dropped[i] = not member["kept"]
    run.note = run.note or f"{len(sidecars)} sidecars, {int(seen.sum()):,} members"
    return run


# ---------------------------------------------------------------- figures


def figures(
    corpus: Corpus, sets: list[np.ndarray], truth: Truth, dropped: np.ndarray, t: float, floor: float
) -> dict[str, str]:
    kinds = np.array(corpus.kinds)
    should = truth.drop
    hit = int((dropped & should).sum())
    near = [
        (i, s)
        for i, (k, s) in enumerate(zip(corpus.kinds, corpus.sources))
        if k == "near" and jaccard(sets[i], sets[s]) >= t
    ]
    caught = sum(bool(dropped[max(i, s)]) for i, s in near)
    groups: dict[int, list[int]] = {}  # base position -> the base and its exact copies
    for i, (k, s) in enumerate(zip(corpus.kinds, corpus.sources)):
        if k == "exact":
            groups.setdefault(s, [s]).append(i)
    later = [i for g in groups.values() for i in sorted(g)[1:]]  # each after the first of its text: must go
    boiler = np.flatnonzero(kinds == "boilerplate")[1:]
    look = kinds == "lookalike"
    missed, wrong = should & ~dropped, dropped & ~should
    pair_hit = dropped[truth.pairs].any(axis=1)
    bands = [(t, round(t + 0.05, 9)), (round(t + 0.05, 9), 0.9), (0.9, 2.0)]
    return {
        "documents dropped": f"{int(dropped.sum()):,}",
        "recall": f"{hit / max(1, int(should.sum())):.4f}",
        "precision": f"{hit / max(1, int(dropped.sum())):.4f}",
        "pairs with one dropped": f"{pair_hit.mean():.4f}",
        f"  J in [{t:.2f},{t + 0.05:.2f}) / [{t + 0.05:.2f},0.90) / >=0.90": " / ".join(
            (f"{int(m.sum()):,}" if dropped is truth.drop else f"{pair_hit[m].mean():.2f}") if m.any() else "-"
            for m in ((truth.pair_j >= lo) & (truth.pair_j < hi) for lo, hi in bands)
        ),
        "near copies caught": f"{caught / max(1, len(near)):.4f}",
        "look-alikes kept": f"{1 - dropped[look].sum() / max(1, look.sum()):.4f}",
        "exact copies dropped": f"{int(dropped[later].sum()):,}/{len(later):,}",
        "boilerplate dropped": f"{int(dropped[boiler].sum()):,}/{len(boiler):,}",
        "missed, by kind": by_kind(kinds[missed]),
        "missed, J with earlier": f"{truth.earlier[missed].min():.3f}-{truth.earlier[missed].max():.3f}"
        if missed.any()
        else "-",
        "wrong drops, by kind": by_kind(kinds[wrong]),
        f"wrong: earlier J in [{floor}, {t})": f"{int((truth.earlier[wrong] >= floor).sum()):,}",
        f"wrong: earlier J < {floor}": f"{int((truth.earlier[wrong] < floor).sum()):,}",
        f"wrong: J >= {t} w/ a later doc": f"{int((truth.any[wrong] >= t).sum()):,}",
    }


def by_kind(kinds: np.ndarray) -> str:
    """ "near 12, base 3": how many of each planted kind (most first); "0" for none."""
    names, counts = np.unique(kinds, return_counts=True)
    return ", ".join(f"{n} {c:,}" for c, n in sorted(zip(counts.tolist(), names.tolist()), reverse=True)) or "0"


def print_table(rows: dict[str, dict[str, str]]) -> None:
    names = list(rows)
    keys = list(dict.fromkeys(k for r in rows.values() for k in r))
    width = max(map(len, keys)) + 2
    cols = [max(len(n), *(len(rows[n].get(k, "")) for k in keys)) + 2 for n in names]
    print("".ljust(width) + "".join(n.rjust(c) for n, c in zip(names, cols)))
    for k in keys:
        print(k.ljust(width) + "".join(rows[n].get(k, "-").rjust(c) for n, c in zip(names, cols)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=25, help="corpus size, MB of JSONL")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=float, default=0.8, help="Jaccard at which a later document is a duplicate")
    ap.add_argument(
        "--floor", type=float, default=0.6, help="exact J is known down to this (the wrong drops' breakdown)"
    )
    ap.add_argument("--boilerplate", type=int, default=2000, help="copies of the boilerplate page")
    ap.add_argument("--share", type=float, default=0.05, help="share of the documents of each planted kind")
    ap.add_argument("--work-dir", help="where the corpus, runs and logs go (default: a temporary folder, removed)")
    ap.add_argument("--datatrove-python", default="/work/dt-venv/bin/python", help="a Python with datatrove installed")
    ap.add_argument("--skip", default="", help="rows not to run, comma-separated: datatrove, fleet, plain")
    args = ap.parse_args()
    args.floor = min(args.floor, args.threshold)
    skip = set(filter(None, args.skip.split(",")))
    work = args.work_dir or tempfile.mkdtemp(prefix="bench-near-")
    os.makedirs(work, exist_ok=True)
    try:
        t0 = time.perf_counter()
        corpus = build_corpus(args.mb, args.seed, args.boilerplate, args.share)
        write_corpus(corpus, os.path.join(work, "corpus"))
        counts = {k: corpus.kinds.count(k) for k in ("base", "exact", "near", "lookalike", "boilerplate")}
        print(
            f"corpus: {corpus.path}, {corpus.mb:.1f} MB, {len(corpus.texts):,} documents "
            f"({', '.join(f'{v:,} {k}' for k, v in counts.items())}), seed {args.seed}, "
            f"{time.perf_counter() - t0:.1f} s"
        )
        t0 = time.perf_counter()
        sets = [shingles(text, NGRAM) for text in corpus.texts]
        t1 = time.perf_counter()
        truth = ground_truth(sets, args.threshold, args.floor)
        near_j = [
            jaccard(sets[i], sets[s]) for i, (k, s) in enumerate(zip(corpus.kinds, corpus.sources)) if k == "near"
        ]
        look_j = [
            jaccard(sets[i], sets[s]) for i, (k, s) in enumerate(zip(corpus.kinds, corpus.sources)) if k == "lookalike"
        ]
        print(
            f"ground truth (J >= {args.threshold} with an earlier document, fleet's {NGRAM}-word shingles): "
            f"{int(truth.drop.sum()):,} to drop; shingles {t1 - t0:.1f} s, prefix filter + exact Jaccard "
            f"{time.perf_counter() - t1:.1f} s ({', '.join(f'{k} {v:,}' for k, v in truth.stats.items())})"
        )
        print(
            f"planted near copies: J with their base median {np.median(near_j):.3f}, "
            f"{sum(j >= args.threshold for j in near_j):,} of {len(near_j):,} at >= {args.threshold}; "
            f"look-alikes: median {np.median(look_j):.3f}, max {max(look_j):.3f}"
        )
        rows: dict[str, dict[str, str]] = {
            "truth": figures(corpus, sets, truth, truth.drop, args.threshold, args.floor)
        }
        runs: list[Run] = []
        if "datatrove" not in skip:
            runs.append(run_datatrove(corpus, args.datatrove_python, work))
        if not {"fleet", "plain"} <= skip:
            tokenizer = train_tokenizer(corpus, work)
        if "fleet" not in skip:
            runs.append(run_fleet(corpus, work, tokenizer, True, args.threshold))
        if "plain" not in skip:
            runs.append(run_fleet(corpus, work, tokenizer, False, args.threshold))
        for run in runs:
            row = (
                figures(corpus, sets, truth, run.dropped, args.threshold, args.floor) if run.dropped is not None else {}
            )
            row.update(
                {
                    "CPU s (user+sys)": f"{run.cpu:.1f}",
                    "MB/s per core": f"{corpus.mb / run.cpu:.2f}",
                    "wall s": f"{run.wall:.1f}",
                    "peak RSS MB": f"{run.rss_mb:.0f}",
                }
            )
            rows[run.name] = row
        print()
        print_table(rows)
        plain = next((r for r in runs if r.name == "fleet plain"), None)
        near_run = next((r for r in runs if r.name == "fleet near"), None)
        if plain and near_run:
            extra = near_run.cpu - plain.cpu
            print(
                f"\nfleet's near dedup alone: {extra:.1f} CPU s more than without it ({corpus.mb / max(extra, 1e-9):.2f} MB/s per core)"
            )
        print("\ncommands:")
        for run in runs:
            print(f"  {run.name}: {shlex.join(run.command)}" + (f"  [{run.note}]" if run.note else ""))
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
