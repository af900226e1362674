"""``--shards N`` and ``--dedup exact`` on the real text jobs, through real ``fleet local`` runs, read
back with their users' own readers: TensorFlow's parser, pyarrow (and Hugging Face ``datasets`` when
installed), gzip, ``follow_examples``/``follow_dataset`` and the ``fleet`` commands (issue 19).

tests/test_stages.py holds the fleet's side on a tiny job, tests/test_text_stages.py the text
jobs' side on a simulated shuffle; here both sides meet. The corpus is the first lines of each
document of corpus/sample_*.txt in three files, cut into items of 20 kB (several per file).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import random
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
from rich.console import Console

from fleet.cli.local import LocalResult, run_local
from fleet.core import shuffle
from fleet.core.follow import RunReader, feature_spec, follow_dataset, follow_examples
from fleet.core.run import load_items
from fleet.core.shuffle import CombineRule
from fleet.core.store import open_store
from fleet.job import StageOptions, load_job, shuffle_key
from fleet.formats import tfrecord
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = [os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("en", "zh")]
FLEET = [sys.executable, "-m", "fleet.cli"]
ITEM_BYTES = 20_000
MAX_SEQ = "64"


# -- the corpus, the vocab and the runs ----------------------------------------------------------


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    """The first 8 lines of every document of the samples: 131 documents, 85 kB."""
    docs = []
    for path in SAMPLES:
        with open(path, encoding="utf-8") as f:
            docs += [
                [line for line in block.split("\n") if line.strip()][:8]
                for block in f.read().split("\n\n")
                if block.strip()
            ]
    return docs


def write_txt(path, docs: list[list[str]]) -> str:
    """Documents as plain text: lines, a blank line after each document."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join("\n".join(doc) + "\n\n" for doc in docs))
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, documents) -> list[str]:
    folder = tmp_path_factory.mktemp("corpus")
    return [write_txt(folder / f"in-{i}.txt", documents[i::3]) for i in range(3)]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, documents) -> str:
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    write_vocab(train_vocab((line for doc in documents for line in doc), 3000), path)
    return path


def settings_of(vocab: str, **more) -> dict[str, str]:
    return {"vocab_file": vocab, "max_seq_length": MAX_SEQ, **{k: str(v) for k, v in more.items()}}


def run(
    inputs: list[str],
    out,
    vocab: str,
    job: str = "electra_zh_en",
    workers: int = 1,
    item_bytes: int = ITEM_BYTES,
    shards: int = 0,
    dedup: str = "",
    combine: CombineRule | None = None,
    **more,
) -> LocalResult:
    """``combine``: the rule that plans the stages' combine steps (the run is small: by default none)."""
    console = Console(file=io.StringIO(), width=200)
    saved = shuffle.COMBINE_RULE
    shuffle.COMBINE_RULE = combine or saved
    try:
        result = run_local(
            inputs,
            str(out),
            job,
            workers,
            settings_of(vocab, **more),
            item_bytes=item_bytes,
            console=console,
            stage_options=StageOptions(shards, dedup),
            lease_ttl=20,
        )
    finally:
        shuffle.COMBINE_RULE = saved
    assert result.exit_code == 0, console.file.getvalue()
    assert result.status.done == result.status.items
    return result


def outputs(out, pattern: str = "part-*") -> list[str]:
    return sorted(glob.glob(os.path.join(str(out), pattern)))


def file_bytes(out) -> dict[str, bytes]:
    return {os.path.basename(p): open(p, "rb").read() for p in outputs(out)}


def tf_records(path: str, compression: str = "") -> list[bytes]:
    """The serialized records of one file, as TensorFlow reads them."""
    import tensorflow as tf

    return [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type=compression)]


def records_of(out) -> list[bytes]:
    """Every record of a run's TFRecord outputs (the fleet's own reader: fast, no TensorFlow)."""
    paths = outputs(out, "part-*.tfrecord")
    assert paths and len(paths) == len(outputs(out))
    return [r for path in paths for r in tfrecord.iter_records(open(path, "rb").read())]


def tf_examples(path: str, layout, compression: str = "") -> list[dict[str, tuple]]:
    """Each example of a TFRecord file parsed by ``tf.io.parse_single_example`` with the run's spec."""
    import tensorflow as tf

    spec = feature_spec(layout)
    return [
        {name: tuple(t.numpy().tolist()) for name, t in tf.io.parse_single_example(r, spec).items()}
        for r in tf.data.TFRecordDataset(path, compression_type=compression)
    ]


def as_row(example: dict) -> dict[str, tuple]:
    return {name: tuple(np.asarray(v).tolist()) for name, v in example.items()}


def multiset(rows: list[dict]) -> list[tuple]:
    return sorted(tuple(sorted(row.items())) for row in rows)


def config_of(job: str, vocab: str, **more):
    return load_job(job).parse_config(settings_of(vocab, **more))


def cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(FLEET + list(args), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def electra(tmp_path_factory, corpus, vocab) -> dict[str, str]:
    """electra_zh_en runs over the corpus: without shards, and with 3 shards at two worker counts,
    two item sizes and two seeds."""
    base = tmp_path_factory.mktemp("electra")
    runs = {
        "plain": {},
        "w1": {"shards": 3},
        "w2": {"shards": 3, "workers": 2},
        "items": {"shards": 3, "item_bytes": 47_000},
        "seed": {"shards": 3, "seed": 8},
        "combine": {"shards": 3, "workers": 2, "combine": CombineRule(group=2, blocks=3)},
    }
    for name, args in runs.items():
        run(corpus, base / name, vocab, **args)
    return {name: str(base / name) for name in runs}


# -- 1. electra --shards 3 ------------------------------------------------------------------------


def test_electra_shards_are_three_balanced_files_tensorflow_parses(electra, vocab):
    names = [os.path.basename(p) for p in outputs(electra["w1"])]
    assert names == [f"part-0000{i}-of-00003.tfrecord" for i in range(3)]
    config = config_of("electra_zh_en", vocab)
    layout = load_job("electra_zh_en").features(config)
    parsed = [tf_examples(p, layout) for p in outputs(electra["w1"])]
    counts = list(map(len, parsed))
    assert max(counts) - min(counts) <= 1 and sum(counts) > 200
    assert all(
        set(ex) == set(layout) and all(len(ex[n]) == f.length for n, f in layout.items())
        for shard in parsed
        for ex in shard
    )
    summary = json.load(open(os.path.join(electra["w1"], "summary.json")))
    assert summary["examples"] == sum(counts)
    assert summary["outputs"] == names  # the records between stages are no outputs


def test_electra_shards_hold_the_records_of_the_run_without_them_in_the_seeded_order(electra, vocab):
    plain = records_of(electra["plain"])
    assert len(outputs(electra["plain"])) > 3  # one file per item: several items fed every shard
    shards = [tf_records(p) for p in outputs(electra["w1"])]
    joined = [r for shard in shards for r in shard]
    assert sorted(joined) == sorted(plain)
    seed = load_job("electra_zh_en").seed(config_of("electra_zh_en", vocab))
    keys = [shuffle_key(seed, r) for r in joined]
    assert keys == sorted(keys)  # one global order: the run seed's
    assert joined != plain  # not the document order


def test_electra_shards_are_the_same_bytes_whatever_the_workers_or_item_size(electra):
    one = file_bytes(electra["w1"])
    assert one == file_bytes(electra["w2"])
    assert one == file_bytes(electra["items"])
    assert one == file_bytes(electra["combine"])  # through a combine step (fleet.core.shuffle.combine)
    steps = [i.step for i in load_items(open_store(os.path.join(electra["combine"], ".fleet")), "local")]
    assert max(steps) == 3  # map, combine, barrier, shards
    assert (
        json.load(open(os.path.join(electra["items"], "summary.json")))["items"]
        < json.load(open(os.path.join(electra["w1"], "summary.json")))["items"]
    )  # another cut indeed


def test_another_seed_gives_another_order(electra, vocab):
    other = records_of(electra["seed"])
    assert sorted(file_bytes(electra["seed"])) == sorted(file_bytes(electra["w1"]))  # the same names
    assert file_bytes(electra["seed"]) != file_bytes(electra["w1"])
    job = load_job("electra_zh_en")
    eight, default = (job.seed(config_of("electra_zh_en", vocab, seed=s)) for s in (8, 12345))
    assert [shuffle_key(eight, r) for r in other] == sorted(shuffle_key(eight, r) for r in other)
    assert sorted(other, key=lambda r: shuffle_key(default, r)) != other


# -- 2. causal_lm --shards 2: TFRecord, Parquet, GZIP -----------------------------------------------


@pytest.fixture(scope="module")
def causal(tmp_path_factory, corpus, vocab) -> dict[str, str]:
    base = tmp_path_factory.mktemp("causal")
    runs = {
        "plain": {},
        "tfrecord": {"shards": 2},
        "parquet": {"shards": 2, "output": "parquet"},
        "gzip": {"shards": 2, "compression": "GZIP"},
    }
    for name, args in runs.items():
        run(corpus, base / name, vocab, job="causal_lm", **args)
    return {name: str(base / name) for name in runs}


def test_causal_lm_shards_hold_the_records_of_the_run_without_them(causal):
    assert [os.path.basename(p) for p in outputs(causal["tfrecord"])] == [
        "part-00000-of-00002.tfrecord",
        "part-00001-of-00002.tfrecord",
    ]
    shards = [tf_records(p) for p in outputs(causal["tfrecord"])]
    assert abs(len(shards[0]) - len(shards[1])) <= 1
    assert sorted(shards[0] + shards[1]) == sorted(records_of(causal["plain"]))


def test_causal_lm_parquet_shards_hold_the_tfrecord_shards_examples_in_order(causal, vocab):
    import pyarrow.parquet as pq

    layout = load_job("causal_lm").features(config_of("causal_lm", vocab))
    parquet = outputs(causal["parquet"])
    assert [os.path.basename(p) for p in parquet] == ["part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]
    for path, tf_path in zip(parquet, outputs(causal["tfrecord"])):
        rows = [{name: tuple(row[name]) for name in layout} for row in pq.read_table(path).to_pylist()]
        assert rows == tf_examples(tf_path, layout)


def test_causal_lm_parquet_shards_load_in_hugging_face_datasets(causal, vocab, tmp_path):
    datasets = pytest.importorskip("datasets")
    layout = load_job("causal_lm").features(config_of("causal_lm", vocab))
    loaded = datasets.load_dataset(
        "parquet", data_files=outputs(causal["parquet"]), split="train", cache_dir=str(tmp_path / "hf")
    )
    want = [ex for path in outputs(causal["tfrecord"]) for ex in tf_examples(path, layout)]
    assert [{name: tuple(row[name]) for name in layout} for row in loaded] == want


def test_causal_lm_gzip_shards_decompress_to_the_tfrecord_shards(causal):
    gz = outputs(causal["gzip"])
    assert [os.path.basename(p) for p in gz] == ["part-00000-of-00002.tfrecord.gz", "part-00001-of-00002.tfrecord.gz"]
    for path, tf_path in zip(gz, outputs(causal["tfrecord"])):
        with gzip.open(path, "rb") as f:
            data = f.read()
        assert list(tfrecord.iter_records(data)) == tf_records(tf_path)
        assert tf_records(path, "GZIP") == tf_records(tf_path)  # TensorFlow reads them too


# -- 3. bert --shards 2 ------------------------------------------------------------------------------


def test_bert_shards_hold_the_records_of_the_run_without_them(corpus, vocab, tmp_path):
    run(corpus, tmp_path / "plain", vocab, job="bert")
    run(corpus, tmp_path / "sharded", vocab, job="bert", shards=2)
    plain = records_of(tmp_path / "plain")
    shards = [tf_records(p) for p in outputs(tmp_path / "sharded")]
    assert len(shards) == 2 and abs(len(shards[0]) - len(shards[1])) <= 1
    assert sorted(shards[0] + shards[1]) == sorted(plain) and len(plain) > 100


# -- 4. the readers of a sharded run -------------------------------------------------------------------


@pytest.mark.parametrize(
    "runs, name, job",
    [
        ("electra", "w1", "electra_zh_en"),
        ("causal", "parquet", "causal_lm"),
        ("causal", "gzip", "causal_lm"),
    ],
)
def test_follow_examples_and_dataset_read_every_shard_example_once_and_no_record_between_stages(
    request, vocab, runs, name, job
):
    out = request.getfixturevalue(runs)[name]
    shuffle = glob.glob(os.path.join(out, ".fleet", "runs", "local", "shuffle", "*"))
    assert shuffle  # the records between stages are there, and are no outputs
    layout = load_job(job).features(config_of(job, vocab))
    # What TensorFlow parses from the TFRecord shards of the same inputs and config (the Parquet and
    # GZIP shards hold the same, tests above).
    tf_out = request.getfixturevalue(runs)["w1" if runs == "electra" else "tfrecord"]
    want = multiset([ex for path in outputs(tf_out) for ex in tf_examples(path, layout)])
    assert len(want) > 200
    assert multiset([as_row(ex) for ex in follow_examples(out, poll=0.1)]) == want
    assert multiset([as_row(ex) for ex in follow_dataset(out, poll=0.1).as_numpy_iterator()]) == want


def test_a_host_reading_its_share_of_a_sharded_run_gets_its_own_shard(electra, vocab):
    """``shard=(i, n)`` with n the run's --shards: host i reads shard i, all n hosts the same share
    (the reason to ask for balanced shards). The shards' ids are numbered like the map items'."""
    out = electra["w1"]
    layout = load_job("electra_zh_en").features(config_of("electra_zh_en", vocab))
    for i, path in enumerate(outputs(out)):
        got = [as_row(ex) for ex in follow_examples(out, poll=0.1, shard=(i, 3))]
        assert got == tf_examples(path, layout)  # in the shard's own order


def test_fleet_follow_prints_the_shards_and_exits_0(electra):
    out = electra["w1"]
    proc = cli("follow", "--bucket", out, "--from-start", "--poll", "0.1")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == outputs(out)


# -- 5. --dedup exact on planted copies ------------------------------------------------------------------


def nfd(lines: list[str]) -> list[str]:
    return [unicodedata.normalize("NFD", line) for line in lines]


@pytest.fixture(scope="module")
def planted(tmp_path_factory, documents):
    """Three files with planted copies, and a corpus of the first copy of each text.

    a.txt: 31 documents and a copy of its 3rd right after it, lines cut elsewhere and
    spaces doubled (one item: a duplicate inside an item). b.txt: a.txt copied whole. c.txt: 20
    documents of its own with 8 of a.txt's shuffled among them, and an NFD copy of a composed text.
    """
    rng = random.Random(19)
    documents = list({" ".join(" ".join(doc).split()): doc for doc in documents}.values())  # no copies of their own
    accents = ["Café crème brûlée, naïve résumé: the first copy is kept.", "Señor Müller ate crêpes."]
    a_docs = documents[:30:2] + [accents] + documents[1:30:2]
    regrouped = [" ".join(a_docs[2][:2]).replace(" ", "  ", 3)] + a_docs[2][2:]
    a = a_docs[:3] + [regrouped] + a_docs[3:]
    own = documents[40:60]
    taken = rng.sample(a_docs, 8)
    c = own[:5] + [nfd(accents)] + own[5:]
    for doc in taken:
        c.insert(rng.randrange(len(c) + 1), doc)
    folder = tmp_path_factory.mktemp("planted")
    files = [write_txt(folder / "a.txt", a), write_txt(folder / "b.txt", a), write_txt(folder / "c.txt", c)]
    kept, seen, dropped = [], set(), []
    for doc in a + a + c:
        text = " ".join(unicodedata.normalize("NFC", "\n".join(doc)).split())
        (dropped if text in seen else kept).append(doc)
        seen.add(text)
    assert len(kept) == 31 + 20 and len(dropped) == 1 + 32 + 8 + 1  # as planted
    unique = write_txt(tmp_path_factory.mktemp("unique") / "unique.txt", kept)
    return files, unique, dropped, a


def offsets(docs: list[list[str]]) -> list[int]:
    """Where each document starts in the file ``write_txt`` makes of them (bytes)."""
    at, out = 0, []
    for doc in docs:
        out.append(at)
        at += len(("\n".join(doc) + "\n\n").encode())
    return out + [at]


@pytest.fixture(scope="module")
def dedup_runs(tmp_path_factory, planted, vocab) -> dict[str, tuple[str, LocalResult]]:
    files, unique, _dropped, _a = planted
    base = tmp_path_factory.mktemp("dedup")
    runs = {
        "unique": ([unique], {}),
        "dedup": (files, {"workers": 2, "dedup": "exact"}),
        "both": (files, {"workers": 2, "dedup": "exact", "shards": 2}),
        "combined": (files, {"workers": 2, "dedup": "exact", "shards": 2, "combine": CombineRule(group=3)}),
    }
    return {name: (str(base / name), run(inputs, base / name, vocab, **args)) for name, (inputs, args) in runs.items()}


def test_the_duplicate_inside_one_item_is_inside_one_item(planted, dedup_runs):
    """a.txt's 3rd document and its regrouped copy right after it are in the same map item."""
    _files, _unique, _dropped, a = planted
    store = open_store(os.path.join(dedup_runs["dedup"][0], ".fleet"))
    items = [i for i in load_items(store, "local") if i.step == 0 and i.name.endswith("a.txt")]
    assert len(items) > 1
    at = offsets(a)
    assert any(i.start <= at[2] and at[4] <= i.end for i in items)


def test_dedup_writes_the_records_of_a_run_over_the_first_copies(planted, dedup_runs):
    files, _unique, dropped, _a = planted
    (unique_out, unique), (out, result) = dedup_runs["unique"], dedup_runs["dedup"]
    assert sorted(records_of(out)) == sorted(records_of(unique_out))
    follow = [r for chunk in RunReader(out, poll=0.1).record_chunks() for r in chunk]
    assert sorted(follow) == sorted(records_of(out))  # the map's documents between stages are not read
    assert len(outputs(out)) == result.status.stages[0]["items"]  # a dedup item (and file) per map item
    summary = json.load(open(os.path.join(out, "summary.json")))
    for got in (summary, result.summary):
        assert got["dedup_documents_dropped"] == len(dropped)
        assert got["dedup_bytes_dropped"] == sum(len("\n".join(doc).encode()) for doc in dropped)
        assert got["dedup_documents_kept"] == unique.summary["documents"]
        assert got["examples"] == unique.summary["examples"]
        assert got["text_bytes"] == unique.summary["text_bytes"] and got["tokens"] == unique.summary["tokens"]
        assert got["documents_read"] == sum(map(len, _texts(files)))
        assert got["text_bytes_read"] == sum(len(text.encode()) for texts in _texts(files) for text in texts)


def _texts(files: list[str]) -> list[list[str]]:
    """Each file's documents as their lines joined by newlines (what the map counts)."""
    return [[block for block in open(path, encoding="utf-8").read().split("\n\n") if block.strip()] for path in files]


def test_fleet_status_shows_what_dedup_dropped(planted, dedup_runs):
    _files, _unique, dropped, _a = planted
    out, _result = dedup_runs["dedup"]
    proc = cli("status", out)
    assert proc.returncode == 0, proc.stderr
    dropped_bytes = sum(len("\n".join(doc).encode()) for doc in dropped)
    lines = [" ".join(line.replace("│", " ").split()) for line in proc.stdout.splitlines()]
    assert f"dedup documents dropped {len(dropped):,}" in lines, proc.stdout
    assert f"dedup bytes dropped {dropped_bytes:,}" in lines, proc.stdout


def test_dedup_and_shards_together_shard_the_dedup_runs_records(dedup_runs, vocab):
    out, result = dedup_runs["both"]
    assert [os.path.basename(p) for p in outputs(out)] == [
        "part-00000-of-00002.tfrecord",
        "part-00001-of-00002.tfrecord",
    ]
    shards = [tf_records(p) for p in outputs(out)]
    assert abs(len(shards[0]) - len(shards[1])) <= 1
    assert sorted(shards[0] + shards[1]) == sorted(records_of(dedup_runs["dedup"][0]))
    assert [s["name"] for s in result.status.stages] == ["map", "dedup", "shards"]
    # With a combine step before each stage: the same files, and the same counts.
    combined_out, combined = dedup_runs["combined"]
    assert file_bytes(combined_out) == file_bytes(out)
    assert [s["name"] for s in combined.status.stages] == ["map", "dedup combine", "dedup", "shards combine", "shards"]
    assert combined.summary["dedup_documents_dropped"] == result.summary["dedup_documents_dropped"]
    assert result.summary["dedup_documents_dropped"] == dedup_runs["dedup"][1].summary["dedup_documents_dropped"]
    layout = load_job("electra_zh_en").features(config_of("electra_zh_en", vocab))
    assert multiset([as_row(ex) for ex in follow_examples(out, poll=0.1)]) == multiset(
        [ex for path in outputs(out) for ex in tf_examples(path, layout)]
    )


# -- 6. resume ----------------------------------------------------------------------------------------


def state(out) -> dict[str, bytes]:
    """The run's leases and outputs, and when each output was written."""
    leases = glob.glob(os.path.join(str(out), ".fleet", "runs", "local", "leases", "*"))
    return {
        **{p: open(p, "rb").read() for p in leases},
        **{p: open(p, "rb").read() + str(os.stat(p).st_mtime_ns).encode() for p in outputs(out)},
    }


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, corpus, vocab):
    """A sharded run, and the leases and files it left."""
    out = tmp_path_factory.mktemp("resume") / "out"
    first = run(corpus, out, vocab, shards=3)
    return out, first, state(out)


def test_a_sharded_run_resumes_with_nothing_redone(sharded, corpus, vocab):
    out, first, before = sharded
    assert len(before) == first.status.items + 3
    again = run(corpus, out, vocab, shards=3)
    assert state(out) == before
    assert again.summary["outputs"] == first.summary["outputs"] and again.summary["done"] == first.status.items


@pytest.mark.parametrize(
    "args, named",
    [
        (["--shards", "4"], "shards is 4, was 3"),
        ([], "shards is 0, was 3"),
        (["--shards", "3", "--dedup", "exact"], "dedup is 'exact', was ''"),
    ],
)
def test_resuming_a_sharded_run_with_other_stages_is_refused_in_one_line(sharded, corpus, vocab, args, named):
    out, _first, before = sharded
    sets = [arg for k, v in settings_of(vocab).items() for arg in ("--set", f"{k}={v}")]
    proc = cli(
        "local",
        *corpus,
        str(out),
        "--job",
        "electra_zh_en",
        "--workers",
        "1",
        "--item-mb",
        str(ITEM_BYTES / 1e6),
        "--lease-ttl",
        "20",
        *args,
        *sets,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and named in proc.stderr, proc.stderr
    # The inputs are the same: the line says what changed, not that an input did.
    assert "input" not in proc.stderr.split("Its outputs")[0] and "cut into" not in proc.stderr, proc.stderr
    assert state(out) == before
