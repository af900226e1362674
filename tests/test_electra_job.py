"""The electra_zh_en job through the fleet's job API, with an in-memory sink."""

from __future__ import annotations

import io
import os
import random

import pytest

from fleet.core.discovery import load_configured
from fleet.job import ConfigError, ItemContext, load_job
from fleet_jobs.electra_zh_en import JOB, ElectraConfig
from fleet.formats import tfrecord
from fleet_jobs.electra_zh_en.builder import DocumentRandom, ExampleBuilder
from fleet_jobs.text.tokenizers.tokenization import BertTokenizer
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.helpers.sinks import MemorySink


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_documents(name: str) -> list[list[str]]:
    with open(os.path.join(ROOT, "corpus", name), encoding="utf-8") as f:
        return [block.split("\n") for block in f.read().split("\n\n") if block.strip()]


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    return read_documents("sample_zh.txt")[:20] + read_documents("sample_en.txt")[:10]


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory, documents) -> str:
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    write_vocab(train_vocab((line for doc in documents for line in doc), 8000), path)
    return path


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def convert(config, documents, seed=99):
    sink = MemorySink()
    stats = JOB.document_converter(config, read_file).convert(
        iter(documents), ItemContext("item-1", seed, "test"), sink
    )
    assert list(sink.files) == [".tfrecord"]
    return stats, sink.files[".tfrecord"]


def test_discovered_by_the_fleet():
    assert load_job("electra_zh_en") is JOB
    assert JOB.name == "electra_zh_en" and JOB.config_type is ElectraConfig


def test_parse_config():
    config = JOB.parse_config({"vocab_file": "v.txt", "max_seq_length": "64", "do_lower_case": "false"})
    assert config == ElectraConfig(vocab_file="v.txt", max_seq_length=64, do_lower_case=False)
    with pytest.raises(ConfigError):
        JOB.parse_config({"vocab": "v.txt"})


def test_check(tmp_path, vocab_path):
    JOB.check(ElectraConfig(vocab_file=vocab_path), read_file)
    bad = {
        "required": ElectraConfig(),
        "cannot read vocab_file": ElectraConfig(vocab_file=str(tmp_path / "nope.txt")),
        "max_seq_length": ElectraConfig(vocab_file=vocab_path, max_seq_length=4),
    }
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "partial.txt").write_text("[PAD]\n[UNK]\nhello\n")
    bad["empty.txt: the vocab file is empty"] = ElectraConfig(vocab_file=str(tmp_path / "empty.txt"))
    bad["partial.txt: not a BERT vocab, missing [CLS] [SEP]"] = ElectraConfig(vocab_file=str(tmp_path / "partial.txt"))
    for message, config in bad.items():
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
            JOB.check(config, read_file)
        assert "\n" not in str(e.value)
        with pytest.raises(ConfigError):
            JOB.document_converter(config, read_file)


def test_convert_counts_and_layout(vocab_path, documents):
    config = ElectraConfig(vocab_file=vocab_path, max_seq_length=128)
    docs = documents + [["", "   ", "\x01\x02"]]  # a document with no tokens yields no example
    stats, data = convert(config, docs)
    records = list(tfrecord.iter_records(data))
    assert stats["documents"] == len(docs)
    assert stats["lines"] == sum(map(len, docs))
    assert stats["text_bytes"] == sum(len(line.encode()) for doc in docs for line in doc)
    assert stats["examples"] == len(records) > 30
    assert stats["positions"] == 128 * len(records)
    assert 0.5 < JOB.summarize(stats)["fill_ratio"] == stats["tokens"] / stats["positions"] <= 1

    # The same records, built the slow, generic way: each document from its own DocumentRandom.
    tokenizer = BertTokenizer.from_file(vocab_path)
    builder = ExampleBuilder(128, tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"], random.Random(99))
    key, examples = DocumentRandom.seed_key(config.seed), []
    for d in docs:
        builder.rng, builder._target = DocumentRandom(key, "\n".join(d).encode()), 128
        examples += builder.add_document(tokenizer.tokenize_lines(d))
    assert stats["tokens"] == sum(ex.length for ex in examples)
    assert records == [
        tfrecord.int64_example({"input_ids": ex.input_ids, "input_mask": ex.input_mask, "segment_ids": ex.segment_ids})
        for ex in examples
    ]


def test_output_is_a_pure_function_of_documents_config_and_seed(vocab_path, documents):
    config = ElectraConfig(vocab_file=vocab_path)
    _, first = convert(config, documents, seed=5)
    _, again = convert(config, [list(d) for d in documents], seed=5)
    _, other = convert(ElectraConfig(vocab_file=vocab_path, seed=6), documents, seed=5)
    _, shorter = convert(ElectraConfig(vocab_file=vocab_path, max_seq_length=64), documents, seed=5)
    assert first == again
    assert first != other and first != shorter
    # Documents are seeded by the run seed and their text, not by the item: the item seed does not matter
    # (with pack_documents, which mixes documents, it does).
    assert convert(config, documents, seed=6)[1] == first
    packed = ElectraConfig(vocab_file=vocab_path, pack_documents=True)
    assert convert(packed, documents, seed=5)[1] != convert(packed, documents, seed=6)[1]


def test_no_documents_gives_an_empty_file(vocab_path):
    stats, data = convert(ElectraConfig(vocab_file=vocab_path), [])
    assert data == b"" and stats["examples"] == 0 and stats["positions"] == 0
    assert JOB.summarize(stats) == {"fill_ratio": 0.0}


def test_vocab_is_read_once_per_converter(vocab_path, documents):
    calls = []

    def opener(path):
        calls.append(path)
        return read_file(path)

    converter = JOB.document_converter(ElectraConfig(vocab_file=vocab_path), opener)
    for i in range(3):
        converter.convert(documents[:2], ItemContext(f"i{i}", i, "test"), MemorySink())
    assert calls == [vocab_path]


def test_lower_case_option(vocab_path):
    docs = [["HELLO World Café"]]
    lower = convert(ElectraConfig(vocab_file=vocab_path), docs)[1]
    cased = convert(ElectraConfig(vocab_file=vocab_path, do_lower_case=False), docs)[1]
    assert lower != cased


@pytest.mark.parametrize("fmt", ["electra", "bert"])
def test_parquet_output_holds_the_same_examples_as_the_tfrecords(vocab_path, documents, fmt):
    import pyarrow.parquet as pq

    from tests.helpers.records import examples

    config = dict(vocab_file=vocab_path, format=fmt, max_seq_length=64)  # format=bert: the bert job
    tf_sink, pq_sink, again = MemorySink(), MemorySink(), MemorySink()
    for sink, output in ((tf_sink, "tfrecord"), (pq_sink, "parquet"), (again, "parquet")):
        job, parsed = load_configured("electra_zh_en", {**config, "output": output})
        job.document_converter(parsed, read_file).convert(iter(documents), ItemContext("item-1", 3, "test"), sink)
    assert list(pq_sink.files) == [".parquet"]
    data = pq_sink.files[".parquet"]
    assert data == again.files[".parquet"]  # a retried item rewrites the same bytes
    rows = examples(data, ".parquet")
    assert len(rows) > 10 and rows == examples(tf_sink.files[".tfrecord"], ".tfrecord")
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"
    assert str(pq.read_schema(io.BytesIO(data)).field("input_ids").type) == "list<element: int32>"


def test_parquet_output_option_checks(vocab_path):
    for bad, message in (
        ({"output": "csv"}, "option output: 'csv' is not supported"),
        ({"output": "parquet", "compression": "GZIP"}, "compression applies to output=tfrecord"),
    ):
        with pytest.raises(ConfigError, match=message):
            JOB.check(ElectraConfig(vocab_file=vocab_path, **bad), read_file)
    sink = MemorySink()
    JOB.document_converter(ElectraConfig(vocab_file=vocab_path, output="parquet"), read_file).convert(
        iter([]), ItemContext("i", 1, "t"), sink
    )
    import pyarrow.parquet as pq

    assert pq.read_table(io.BytesIO(sink.files[".parquet"])).num_rows == 0  # an empty item: a valid empty file


@pytest.mark.parametrize("big_ids", [False, True])
def test_records_are_record_of_each_example(vocab_path, big_ids):
    """The converter's batch encoder gives ``record``'s bytes for every example, with ids below
    2**16 (varints of the real tokens, the padding with the tail) and above (padded rows)."""
    from fleet_jobs.electra_zh_en.builder import Example

    converter = JOB.document_converter(ElectraConfig(vocab_file=vocab_path, max_seq_length=40), read_file)
    converter.encoder.small_ids = not big_ids
    rng = random.Random(3)
    top = 1 << 20 if big_ids else 1 << 16
    examples = []
    for _ in range(300):
        n = rng.randint(2, 40)
        first = rng.randint(2, n) if n < 4 or rng.random() < 0.3 else rng.randint(2, n - 2)
        examples.append(
            Example(
                [rng.choice((0, 5, 127, 128, 16383, 16384, top - 1, rng.randrange(top))) for _ in range(n)], n, first
            )
        )
    padded = [Example(ex.input_ids + [0] * (40 - ex.length), ex.length, ex.first_length) for ex in examples]
    encoder = converter.encoder
    assert encoder.records(examples) == b"".join(encoder.record(ex) for ex in padded)
    assert encoder.records(padded) == encoder.records(examples)
    assert encoder.records(examples[:7]) + encoder.records(examples[7:]) == encoder.records(examples)
    assert encoder.records([]) == b""


def test_electra_parquet_rows_make_the_file_parsed_records_made(vocab_path, documents, monkeypatch):
    """electra_zh_en hands Parquet its rows, not records to parse back; the file is the same,
    row groups included (a group ends after exactly ROW_GROUP_ROWS rows, here 7)."""
    from fleet.formats import parquet
    from fleet.formats.tfrecord.writer import encode_rows

    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 7)
    config = ElectraConfig(vocab_file=vocab_path, max_seq_length=64, output="parquet")

    def run():
        sink = MemorySink()
        stats = JOB.document_converter(config, read_file).convert(
            iter(documents), ItemContext("item-1", 3, "test"), sink
        )
        return stats, sink.files[".parquet"]

    stats, rows_made = run()
    monkeypatch.setattr(
        parquet.ParquetExampleWriter,
        "write_examples",  # the former way: records, parsed
        lambda self, values: self.write(b"".join(encode_rows(self.columns, values))),
    )
    again, parsed = run()
    assert stats == again and stats["examples"] > 20 and rows_made == parsed


@pytest.mark.parametrize("max_length", [16, 128, 512])
def test_electra_packs_from_line_lengths_as_from_id_lists(vocab_path, documents, max_length):
    """electra_zh_en packs from the lines' lengths and gathers the ids from ``tokenize_flat``'s
    one array (``seeded_document_runs``); the records are those of the list path it replaced:
    ``tokenize_lines``, ``add_documents`` with a ``DocumentRandom`` per document, ``records``, a
    group of documents at a time."""
    from itertools import accumulate

    from fleet_jobs.electra_zh_en import job

    rng = random.Random(5)
    lines = [line for doc in documents for line in doc]
    short, at = [], 0
    while at < len(lines):
        n = rng.randint(1, 3)
        short.append(lines[at : at + n])
        at += n
    docs = documents + [[], ["", "!"], ["", ""], ["one line only"]] + short
    config = ElectraConfig(vocab_file=vocab_path, max_seq_length=max_length)
    stats, data = convert(config, docs, seed=1)
    converter = JOB.document_converter(config, read_file)
    key = DocumentRandom.seed_key(config.seed)
    expected = []
    for group in job._groups(iter(docs)):
        builder = ExampleBuilder(max_length, converter.cls_id, converter.sep_id, random.Random(1), pad=False)
        group_lines = [line for doc in group for line in doc]
        examples = builder.add_documents(
            converter.tokenizer.tokenize_lines(group_lines),
            accumulate(map(len, group)),
            [DocumentRandom(key, "\n".join(d).encode()) for d in group],
        )
        expected.append(converter.encoder.records(examples))
    assert len(expected) > 2 and stats["examples"] > 100
    assert data == b"".join(expected)


def test_an_electra_worker_does_not_import_the_bert_modules(vocab_path, documents):
    """electra_zh_en imports none of the bert job's modules (a worker's start-up pays for each import)."""
    import subprocess
    import sys

    code = (
        "import sys, io\n"
        "from fleet.job import ItemContext, load_job\n"
        "from tests.helpers.sinks import MemorySink\n"
        "job = load_job('electra_zh_en')\n"
        f"config = job.parse_config({{'vocab_file': {vocab_path!r}}})\n"
        "job.document_converter(config, lambda p: open(p, 'rb').read()).convert(iter([['a b', 'c'], ['d']]),"
        " ItemContext('i', 1, 't'), MemorySink())\n"
        "print(sorted(m for m in sys.modules if m.startswith('fleet_jobs.bert') or m.split('.')[-1] in "
        "('sentences', 'rjieba', 'pyarrow')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]"]
