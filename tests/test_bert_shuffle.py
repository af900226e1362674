"""The bert job writes each item's examples in a seeded random order, as BERT's
``create_pretraining_data.py`` shuffles its instances: the same examples as the order they
are built in (document order, batch by batch), not that order; the same bytes on a retry and
whatever the memory budget (the spill path); TFRecord and Parquet in the same order; left
alone when the item feeds a later stage (``ctx.feeds``: that stage's shuffle orders them)."""

from __future__ import annotations

import functools
import glob
import io
import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, strategies as st

from fleet.job import ItemContext, ItemInput, KeyedSink, item_seed
from fleet_jobs.bert import JOB
from fleet_jobs.bert import examples as bert_examples, job as bert_job, shuffle
from fleet_jobs.bert.masking import Masked
from fleet.formats import tfrecord
from fleet.formats.parquet import read_rows
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.helpers.sinks import MemorySink

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = [os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("zh", "en")]


def read_documents(path: str) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        return [block.split("\n") for block in f.read().split("\n\n") if block.strip()]


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    zh, en = map(read_documents, SAMPLES)
    return zh[:40] + en[:25]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> str:
    lines = [line for path in SAMPLES for line in open(path, encoding="utf-8").read().split("\n")]
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    write_vocab(train_vocab(lines, 8000), path)
    return path


@pytest.fixture
def small_batches(monkeypatch):
    """Batches of 4,000 tokens: the sample's documents then span many batches, as a big item's do
    (examples are built, and were written, batch after batch in document order)."""
    monkeypatch.setattr(bert_examples, "DocBatcher", functools.partial(bert_examples.DocBatcher, batch_tokens=4000))


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def convert(vocab, docs, seed=7, feeds="", **options) -> tuple[dict, bytes]:
    config = JOB.parse_config({"vocab_file": vocab, **options})
    sink = MemorySink()
    ctx = ItemContext("item", seed, "test", feeds=feeds)
    stats = JOB.document_converter(config, read_file).convert(iter(docs), ctx, sink)
    (data,) = sink.files.values()
    return stats, data


def records(data: bytes) -> list[bytes]:
    return list(tfrecord.iter_records(data))


def built_positions(shuffled: list[bytes], built: list[bytes]) -> np.ndarray:
    """Where each shuffled record was in the built order (equal records: in turn)."""
    where: dict[bytes, list[int]] = {}
    for i, r in enumerate(built):
        where.setdefault(r, []).append(i)
    return np.array([where[r].pop(0) for r in shuffled])


def assert_shuffled(shuffled: list[bytes], built: list[bytes], seed: int) -> None:
    assert len(built) > 500 and Counter(shuffled) == Counter(built)  # the same examples
    assert shuffled == [built[i] for i in shuffle.permutation(len(built), seed)]  # in the documented order
    positions = built_positions(shuffled, built)
    assert abs(np.corrcoef(np.arange(len(positions)), positions)[0, 1]) < 0.2  # built order: 1
    # Neighbours come from far apart: a third of the item apart on average, as random picks are.
    assert np.abs(np.diff(positions)).mean() > len(built) / 5


def test_an_items_examples_are_written_shuffled_not_in_document_order(vocab, documents, small_batches):
    stats, data = convert(vocab, documents)
    _, built = convert(vocab, documents, feeds="dedup")  # a stage's input: in the order built
    assert stats["examples"] == len(records(data))
    assert_shuffled(records(data), records(built), 7)
    assert convert(vocab, [list(d) for d in documents])[1] == data  # a retry rewrites the same bytes
    other = convert(vocab, documents, seed=8)[1]
    assert Counter(records(other)) != Counter(records(data))  # another item seed: other examples...
    assert shuffle.permutation(1000, 7).tolist() != shuffle.permutation(1000, 8).tolist()  # ... and order


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"output": "parquet"},
        {"compression": "GZIP"},
        {"dupe_factor": "3"},
        {"pack_documents": "true", "max_seq_length": "64"},
    ],
)
def test_the_bytes_do_not_depend_on_the_memory_budget(vocab, documents, small_batches, monkeypatch, options):
    _, in_memory = convert(vocab, documents, **options)
    spilled = []

    class Recording(shuffle.ShuffledExamples):
        def __exit__(self, *exc):
            spilled.append(self.spilled)
            super().__exit__(*exc)

    monkeypatch.setattr(bert_job, "ShuffledExamples", functools.partial(Recording, limit=50_000))
    _, on_disk = convert(vocab, documents, **options)
    assert spilled == [True] and on_disk == in_memory
    monkeypatch.setattr(bert_job, "ShuffledExamples", functools.partial(Recording, limit=1 << 30))
    assert convert(vocab, documents, **options)[1] == in_memory and spilled[-1] is False


def test_dupe_factor_passes_are_shuffled_together(vocab, documents, small_batches):
    stats, data = convert(vocab, documents, dupe_factor="2")
    _, built = convert(vocab, documents, dupe_factor="2", feeds="dedup")
    shuffled, built = records(data), records(built)
    assert len(shuffled) == stats["examples"]
    assert_shuffled(shuffled, built, 7)
    first_pass = built_positions(shuffled, built) < len(built) // 2
    assert 0.4 < first_pass[: len(first_pass) // 2].mean() < 0.6  # the passes mixed, not one after the other


def test_parquet_rows_are_in_the_order_of_the_tfrecords(vocab, documents, small_batches):
    _, tf_data = convert(vocab, documents, max_seq_length="64", dupe_factor="2")
    _, pq_data = convert(vocab, documents, max_seq_length="64", dupe_factor="2", output="parquet")
    rows = read_rows(io.BytesIO(pq_data))
    examples = [tfrecord.parse_example(r) for r in records(tf_data)]
    assert len(examples) == len(rows["input_ids"]) > 500
    for name in examples[0]:
        assert rows[name] == [ex[name].tolist() for ex in examples], name  # (weights: 0.0 and 1.0, exact)


def test_fleet_local_writes_each_item_as_the_pure_core_shuffles_it(vocab, tmp_path):
    """One item bigger than a batch (both samples: about 350k tokens), through ``fleet local``:
    its file is the pure core's shuffled output with the item's seed, not the order built."""
    from rich.console import Console

    from fleet.cli.local import run_local

    both = tmp_path / "in" / "both.txt"
    both.parent.mkdir()
    both.write_text("\n\n".join(open(p, encoding="utf-8").read().strip("\n") for p in SAMPLES) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    result = run_local(
        [str(both)],
        str(out),
        "bert",
        1,
        {"vocab_file": vocab},
        item_bytes=10 << 20,
        console=Console(file=io.StringIO()),
    )
    assert result.exit_code == 0 and result.status.done == result.status.items == 1
    (path,) = glob.glob(str(out / "part-*.tfrecord"))
    item_id = os.path.basename(path)[len("part-") : -len(".tfrecord")]
    config = JOB.parse_config({"vocab_file": vocab})
    seed = item_seed(JOB.seed(config), item_id)

    item = ItemInput(str(both.parent), both.name, 0, both.stat().st_size)
    sink = MemorySink()
    JOB.converter(config, read_file).convert(item, ItemContext(item_id, seed, "t"), sink)
    (pure,) = sink.files.values()

    class Emitted(KeyedSink):  # what the item emits when it feeds a shards stage: the examples as built
        partitions, values = 1, []

        def emit(self, key, value):
            self.values.append(value)

    keyed = Emitted()
    JOB.converter(config, read_file).convert(item, ItemContext(item_id, seed, "t", feeds="shards"), keyed)
    written = read_file(path)
    assert written == pure
    assert_shuffled(records(written), [value[12:-4] for value in keyed.values], seed)  # TFRecord frames of Examples


def chunk_of(values: np.ndarray, seq: int = 3, preds: int = 2) -> shuffle.Chunk:
    """A chunk whose every field of row i is made from values[i] (so rows can be told apart)."""
    v = values.astype(np.int64)
    return shuffle.Chunk(
        Masked(
            (v[:, None] + np.arange(seq)).astype(np.int32),
            (v[:, None] * 2 + np.arange(preds)).astype(np.int32),
            (v[:, None] * 3).repeat(preds, 1).astype(np.int32),
            v + 1,
        ),
        v + 2,
        v + 3,
        v % 2,
    )


@given(
    sizes=st.lists(st.integers(0, 1500), max_size=6),
    limit=st.integers(0, 1 << 20),
    seed=st.integers(0, 2**64),
    id_bound=st.sampled_from([1 << 15, 1 << 16, 1 << 31]),
)
def test_shuffled_examples_give_every_row_in_the_seeded_order(tmp_path_factory, sizes, limit, seed, id_bound):
    start = np.cumsum([0] + sizes)
    chunks = [chunk_of(np.arange(a, b)) for a, b in zip(start[:-1], start[1:])]  # ids up to 27,000
    with shuffle.ShuffledExamples(seed, str(tmp_path_factory.getbasetemp()), limit, id_bound) as store:
        out = list(store.shuffled(iter(chunks)))
    n = int(start[-1])
    assert [len(c) for c in out] == [min(shuffle.ROWS_OUT, n - i) for i in range(0, n, shuffle.ROWS_OUT)]
    expected = chunk_of(shuffle.permutation(n, seed)) if n else None
    for field in ("lengths", "first_lengths", "random_next"):
        got = np.concatenate([getattr(c, field) for c in out]) if out else np.zeros(0, np.int64)
        assert got.tolist() == (getattr(expected, field).tolist() if n else [])
    for field in ("input_ids", "positions", "labels", "counts"):
        got = [row for c in out for row in getattr(c.masked, field).tolist()]
        assert got == (getattr(expected.masked, field).tolist() if n else [])
    assert all(c.masked.input_ids.dtype == np.int32 and c.lengths.dtype == np.int64 for c in out)


def test_an_id_beyond_the_bound_is_an_error_not_a_wrapped_id():
    with shuffle.ShuffledExamples(1, id_bound=1 << 16) as store:
        with pytest.raises(ValueError, match="id 70002, the vocab has 65536"):
            list(store.shuffled([chunk_of(np.array([1, 70000]))]))
