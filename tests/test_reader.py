"""Reading a run's examples while it runs (issue 11): numpy iterator and tf.data, local and gs://."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import numpy as np
import pytest

from fleet.core.follow import FollowError, RunReader, follow_examples
from fleet.core.store import locate, open_store
from fleet.formats import tfrecord
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.helpers.cli import FLEET, fleet, fleet_in_process
from tests.helpers.procs import ROOT, write_corpus

SLOW_ITEMS = {"FLEET_TEST_PAUSE": "claimed=0.3"}  # each item takes a while: outputs land over seconds


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("corpus")
    path = write_corpus(str(folder / "c.txt"), 90)
    vocab = str(folder / "vocab.txt")
    with open(path, encoding="utf-8") as f:
        write_vocab(train_vocab((line for line in f if line.strip()), 300), vocab)
    return path, vocab


def plan(bucket: str, out_dir: str, inputs: list[str], vocab: str, **options) -> None:
    sets = [a for k, v in {"vocab_file": vocab, "max_seq_length": 32, **options}.items() for a in ("--set", f"{k}={v}")]
    proc = fleet_in_process(  # (the workers and the readers are what these tests are about)
        "plan",
        "--bucket",
        bucket,
        "--run",
        "r",
        "--job",
        "electra_zh_en",
        "--output",
        out_dir,
        "--item-mb",
        "0.004",
        *[a for i in inputs for a in ("--input", i)],
        *sets,
    )
    assert proc.returncode == 0, proc.stderr


def start_workers(bucket: str, tmp_path, procs: int = 1) -> subprocess.Popen:
    return subprocess.Popen(
        FLEET + ["work", "--bucket", bucket, "--run", "r", "--procs", str(procs)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, TMPDIR=str(tmp_path), **SLOW_ITEMS),
    )


def committed_records(bucket: str) -> tuple[list[bytes], float]:
    """Every record of the run's outputs, read directly; and when its last item was committed."""
    reader = RunReader(bucket, "r")
    records, last = [], 0.0
    for out in reader.outputs():
        store, name = locate(out.url)
        data = store.read(name)
        if name.endswith(".gz"):
            import gzip

            data = gzip.decompress(data)
        records += list(tfrecord.iter_records(data))
        last = max(last, out.committed)
    return records, last


def key(example: dict) -> tuple:
    return tuple((name, value.dtype.str, value.tobytes()) for name, value in sorted(example.items()))


class Consumer(threading.Thread):
    """A trainer's input loop in a thread: started before the workers, it reads until the run drains."""

    def __init__(self, iterable_factory):
        super().__init__(daemon=True)
        self.factory = iterable_factory
        self.items: list = []
        self.first_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for item in self.factory():
                if self.first_at is None:
                    self.first_at = time.time()
                self.items.append(item)
        except BaseException as e:  # handed to the test
            self.error = e


@pytest.mark.parametrize("kind", ["local", "gcs"])
def test_a_reader_started_before_the_workers_reads_every_example_once_and_ends(tmp_path, kind, corpus, request):
    path, vocab = corpus
    bucket = str(tmp_path / "bucket") if kind == "local" else f"gs://{request.getfixturevalue('gcs_bucket')}"
    output = str(tmp_path / "out") if kind == "local" else f"{bucket}/out"
    plan(bucket, output, [path], vocab, **({"compression": "GZIP"} if kind == "gcs" else {}))
    consumer = Consumer(lambda: follow_examples(bucket, "r", poll=0.1))
    consumer.start()
    time.sleep(0.5)  # the reader is waiting before any worker starts
    assert consumer.items == [] and consumer.is_alive()
    workers = start_workers(bucket, tmp_path)
    try:
        consumer.join(timeout=120)
        assert not consumer.is_alive() and consumer.error is None, consumer.error
    finally:
        workers.kill() if workers.poll() is None else None
        workers.wait()
    records, last_commit = committed_records(bucket)
    expected = sorted(key(tfrecord.parse_example(r)) for r in records)
    assert len(expected) > 20 and sorted(key(e) for e in consumer.items) == expected  # each example once
    assert consumer.first_at < last_commit  # it read while the run went on, not only at the end
    first = consumer.items[0]
    assert {n: (v.dtype, v.shape) for n, v in first.items()} == {
        n: (np.dtype(np.int64), (32,)) for n in ("input_ids", "input_mask", "segment_ids")
    }
    names = [b.name for b in open_store(bucket).list("runs/r/final/")]
    assert len(names) > 5  # several items


def test_a_reader_started_mid_run_catches_up(tmp_path, corpus, gcs_bucket):
    path, vocab = corpus
    bucket = f"gs://{gcs_bucket}"
    plan(bucket, f"{bucket}/out", [path], vocab)
    workers = start_workers(bucket, tmp_path)
    store = open_store(bucket)
    try:
        deadline = time.time() + 90
        while len(finals := list(store.list("runs/r/final/"))) < 2:
            assert time.time() < deadline, "no item finished"
            time.sleep(0.05)
        reader = RunReader(bucket, "r", poll=0.1)
        records = list(reader.records())
        assert len(finals) < len(list(store.list("runs/r/final/")))  # it started mid-run
    finally:
        workers.wait(timeout=120)
    assert sorted(records) == sorted(committed_records(bucket)[0])


def test_failed_items_end_the_reading_with_their_names_after_every_good_example(tmp_path, corpus):
    path, vocab = corpus
    bad = tmp_path / "broken.jsonl"
    bad.write_text("this is not json\n" * 50)
    bucket = str(tmp_path / "bucket")
    plan(bucket, str(tmp_path / "out"), [path, str(bad)], vocab)
    assert fleet("work", "--bucket", bucket, "--run", "r", "--procs", "1", tmp=tmp_path).returncode == 0
    got = []
    with pytest.raises(FollowError, match=r"run r: 1 item\(s\) failed: \d+: .*broken.jsonl.*not JSON") as e:
        for example in follow_examples(bucket, poll=0.1):  # the run is named by the bucket alone
            got.append(example)
    assert "\n" not in str(e.value)
    direct = sorted(key(tfrecord.parse_example(r)) for r in _all_records(tmp_path / "out"))
    assert len(direct) > 20 and sorted(key(x) for x in got) == direct  # every good example came first
    shares = [RunReader(bucket, "r", shard=(i, 3)) for i in range(3)]  # e.g. one per DataLoader worker
    urls = [[o.url for o in _good_outputs(reader)] for reader in shares]
    assert all(urls) and sorted(sum(urls, [])) == sorted(o.url for o in _good_outputs(RunReader(bucket, "r")))
    with pytest.raises(FollowError, match="shard 3 of 3"):
        RunReader(bucket, "r", shard=(3, 3))
    # the same as `fleet follow`: exit 1, the failed item listed
    proc = fleet_in_process("follow", "--bucket", bucket, "--run", "r", "--from-start")
    assert proc.returncode == 1 and "broken.jsonl" in proc.stderr


def _good_outputs(reader: RunReader) -> list:
    outs = []
    with pytest.raises(FollowError, match="failed"):
        for out in reader.outputs():
            outs.append(out)
    return outs


def _all_records(folder) -> list[bytes]:
    out = []
    for name in sorted(os.listdir(folder)):
        if ".tfrecord" in name:
            out += list(tfrecord.iter_records((folder / name).read_bytes()))
    return out


def test_a_damaged_output_is_named(tmp_path, corpus):
    path, vocab = corpus
    out = tmp_path / "out"
    proc = fleet(
        "local", path, out, "--workers", "1", "--item-mb", "0.004", "--set", f"vocab_file={vocab}", tmp=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    bucket = str(out)  # the output folder of fleet local names its run
    assert len(list(follow_examples(bucket))) == len(_all_records(out)) > 20
    victim = sorted(p for p in out.iterdir() if p.name.startswith("part-"))[0]
    original = victim.read_bytes()
    data = bytearray(original)
    data[40] ^= 0xFF  # inside the first record
    victim.write_bytes(bytes(data))
    with pytest.raises(FollowError, match=f"{victim.name}: bad data checksum at byte 0"):
        list(follow_examples(bucket))
    victim.write_bytes(original[:-3])  # cut short
    with pytest.raises(FollowError, match=f"{victim.name}: truncated record"):
        list(follow_examples(bucket))
    first = next(iter(tfrecord.iter_records(original)))
    victim.write_bytes(original + tfrecord.frame(first))  # a whole record more: the framing is fine, the bytes not
    with pytest.raises(FollowError, match=f"{victim.name}: not the bytes committed"):
        list(follow_examples(bucket))


def test_nothing_to_follow_is_one_clear_error(tmp_path):
    with pytest.raises(FollowError, match="no runs"):
        RunReader(str(tmp_path))
    with pytest.raises(FollowError, match="no run 'x'"):
        RunReader(str(tmp_path), "x")


def test_the_layout_follows_the_config():
    from fleet.core.discovery import load_configured

    job, config = load_configured(
        "electra_zh_en",
        {
            "vocab_file": "v",
            "format": "bert",
            "max_seq_length": 64,
            "max_predictions_per_seq": 10,
            "v2_feature_names": "true",
        },
    )
    bert = job.features(config)  # format=bert: the bert job's layout
    assert {n: (f.length, f.dtype) for n, f in bert.items()} == {
        "input_word_ids": (64, "int64"),
        "input_mask": (64, "int64"),
        "input_type_ids": (64, "int64"),
        "masked_lm_positions": (10, "int64"),
        "masked_lm_ids": (10, "int64"),
        "masked_lm_weights": (10, "float32"),
        "next_sentence_labels": (1, "int64"),
    }


def test_tf_dataset_follows_a_bert_run_and_fails_naming_the_failed_item(tmp_path, corpus):
    tf = pytest.importorskip("tensorflow")
    from fleet.core.follow import follow_dataset

    path, vocab = corpus
    bad = tmp_path / "broken.jsonl"
    bad.write_text("this is not json\n" * 50)
    out = tmp_path / "out"
    bucket = str(tmp_path / "bucket")
    plan(bucket, str(out), [path, str(bad)], vocab, format="bert", max_predictions_per_seq=5)
    got: list = []
    errors: list = []

    def consume():
        try:
            for example in follow_dataset(bucket, "r", poll=0.1):
                got.append({k: v.numpy() for k, v in example.items()})
        except tf.errors.OpError as e:
            errors.append(e)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    time.sleep(0.5)
    workers = start_workers(bucket, tmp_path)
    try:
        consumer.join(timeout=180)
        assert not consumer.is_alive()
    finally:
        workers.kill() if workers.poll() is None else None
        workers.wait()
    assert len(errors) == 1 and "broken.jsonl" in errors[0].message and "failed" in errors[0].message
    direct = sorted(key(tfrecord.parse_example(r)) for r in _all_records(out))
    assert len(direct) > 20 and sorted(key(x) for x in got) == direct
    assert got[0]["masked_lm_weights"].dtype == np.float32 and got[0]["next_sentence_labels"].shape == (1,)


@pytest.mark.parametrize("fmt", ["electra", "bert"])
def test_a_parquet_run_reads_as_the_same_examples_as_its_tfrecord_twin(tmp_path, corpus, fmt):
    """output=parquet: the readers hand over the same examples as for output=tfrecord (before:
    'bad length checksum ... not a TFRecord file?')."""
    tf = pytest.importorskip("tensorflow")
    from fleet.core.follow import follow_dataset

    path, vocab = corpus
    got = {}
    for output in ("tfrecord", "parquet"):
        bucket, out = str(tmp_path / f"b-{output}"), str(tmp_path / f"o-{output}")
        extra = {"max_predictions_per_seq": 5} if fmt == "bert" else {}
        plan(bucket, out, [path], vocab, format=fmt, **extra, **{"output": output})
        assert fleet("work", "--bucket", bucket, "--run", "r", "--procs", "1", tmp=tmp_path).returncode == 0
        got[output] = sorted(key(x) for x in follow_examples(bucket, "r", poll=0.1))
        via_tf = sorted(key({k: v.numpy() for k, v in x.items()}) for x in follow_dataset(bucket, "r", poll=0.1))
        assert via_tf == got[output]
    assert len(got["parquet"]) > 20 and got["parquet"] == got["tfrecord"]
    with pytest.raises(FollowError, match="Parquet"):
        next(iter(RunReader(str(tmp_path / "b-parquet"), "r").records()))
    assert tf is not None


# -- causal_lm: the same readers, with the layout its Job.features gives ---------------------


@pytest.mark.parametrize(
    "options", [{"compression": "GZIP"}, {"output": "parquet"}, {"shifted_labels": "true", "last_block": "drop"}]
)
def test_a_causal_lm_run_reads_as_tensorflow_and_pyarrow_read_its_files(tmp_path, corpus, options):
    """follow_examples and follow_dataset read any job that declares its features (before: electra_zh_en
    only): they give exactly what TensorFlow's parser (with the job's spec) or pyarrow read from the files."""
    tf = pytest.importorskip("tensorflow")
    import pyarrow.parquet as pq

    from fleet.core.follow import feature_spec, follow_dataset
    from fleet_jobs.causal_lm import JOB

    path, vocab = corpus
    out = tmp_path / "out"
    sets = {"vocab_file": vocab, "max_seq_length": 24, **options}
    proc = fleet(
        "local",
        path,
        out,
        "--job",
        "causal_lm",
        "--workers",
        "1",
        "--item-mb",
        "0.004",
        *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")],
        tmp=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    layout = JOB.features(JOB.parse_config(sets))
    files = sorted(str(p) for p in out.glob("part-*"))
    assert len(files) > 3
    if sets.get("output") == "parquet":
        table = pq.read_table(files)
        assert sorted(table.column_names) == sorted(layout)  # no column the layout leaves out
        columns = {name: table.column(name).to_pylist() for name in layout}
        direct = [
            {name: np.array(columns[name][i], layout[name].dtype) for name in layout} for i in range(table.num_rows)
        ]
    else:
        records = tf.data.TFRecordDataset(files, compression_type="GZIP" if "compression" in sets else "")
        direct = [
            {k: v.numpy() for k, v in tf.io.parse_single_example(r, feature_spec(layout)).items()} for r in records
        ]
    width = 25 if "shifted_labels" in sets else 24
    assert set(layout) == ({"input_ids"} if "last_block" in sets else {"input_ids", "attention_mask"})
    assert {n: (v.dtype, v.shape) for n, v in direct[0].items()} == {n: (np.dtype(np.int64), (width,)) for n in layout}
    expected = sorted(key(x) for x in direct)
    assert len(expected) > 20
    assert sorted(key(x) for x in follow_examples(str(out))) == expected
    assert sorted(key({k: v.numpy() for k, v in x.items()}) for x in follow_dataset(str(out))) == expected


def test_a_run_of_a_job_without_features_is_one_clear_error(tmp_path):
    """A job that declares no features (Job.features' default) writes no examples the readers know."""
    from tests.helpers.procs import LINEJOB

    bucket = str(tmp_path / "bucket")
    corpus = write_corpus(str(tmp_path / "c.txt"), 10)
    proc = fleet_in_process(
        "plan", "--bucket", bucket, "--run", "r", "--job", LINEJOB, "--input", corpus, "--output", str(tmp_path / "out")
    )
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(
        FollowError, match=r"run r in .*declares no features \(Job.features\).*fleet.core.follow.follow"
    ):
        RunReader(bucket)


@pytest.mark.parametrize("output", ["tfrecord", "parquet"])
def test_examples_that_are_not_the_layout_the_job_declares_are_named(tmp_path, corpus, output):
    """Each example is checked against the job's features (length and dtype, records and rows alike),
    and a Parquet output changed since its commit is named as a TFRecord one is."""
    path, vocab = corpus
    out = tmp_path / "out"
    proc = fleet(
        "local",
        path,
        out,
        "--workers",
        "1",
        "--item-mb",
        "0.004",
        "--set",
        f"vocab_file={vocab}",
        "--set",
        "max_seq_length=32",
        "--set",
        f"output={output}",
        tmp=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    from fleet.job import Feature

    reader = RunReader(str(out))
    assert reader.layout == {n: Feature(32, "int64") for n in ("input_ids", "input_mask", "segment_ids")}
    assert len(list(reader.examples())) > 20
    reader.layout = {**reader.layout, "input_mask": Feature(31, "int64")}
    with pytest.raises(FollowError, match=r"part-\S+: .*input_mask .*31"):
        next(reader.examples())
    reader.layout = {**reader.layout, "input_mask": Feature(32, "float32")}
    with pytest.raises(FollowError, match=r"part-\S+: .*input_mask .*float32"):
        next(reader.examples())
    if output == "parquet":
        victim = sorted(out.glob("part-*"))[0]
        victim.write_bytes(victim.read_bytes() + b"\0")
        with pytest.raises(FollowError, match=f"{victim.name}: not the bytes committed"):
            list(follow_examples(str(out)))
