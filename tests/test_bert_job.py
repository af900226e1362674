"""The bert job through the job API on the sample corpus: records BERT's run_pretraining.py parses,
masking statistics, whole words in Chinese and English, NSP labels, packing, GZIP, v2 names; and
``--job electra_zh_en --set format=bert``, its former name (read as the bert job by discovery's rule),
giving the same."""

from __future__ import annotations

import gzip
import os
import random
import re
from collections import Counter

import numpy as np
import pytest
import rjieba

from fleet.core.discovery import load_configured
from fleet.job import ConfigError, ItemContext
from fleet_jobs.bert import JOB as BERT, BertConfig
from fleet_jobs.electra_zh_en import JOB, ElectraConfig
from fleet.formats import tfrecord
from fleet_jobs.bert.builder import DocBatcher, PairOptions, assemble, build_spans, truncate_pairs
from fleet_jobs.bert import records as bert_records
from fleet_jobs.bert.records import BertLayout, BertRecordEncoder, feature_names
from fleet_jobs.bert.masking import Masked, mask_batch
from fleet_jobs.text.tokenizers.tokenization import CJK_RANGES, WORD_CONTINUES, BertTokenizer
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.helpers.sinks import MemorySink


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, PREDS = 128, 20


def read_documents(name: str) -> list[list[str]]:
    with open(os.path.join(ROOT, "corpus", name), encoding="utf-8") as f:
        return [block.split("\n") for block in f.read().split("\n\n") if block.strip()]


@pytest.fixture(scope="module")
def documents() -> dict[str, list[list[str]]]:
    return {"zh": read_documents("sample_zh.txt"), "en": read_documents("sample_en.txt")}


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory, documents) -> str:
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    lines = (line for docs in documents.values() for doc in docs for line in doc)
    write_vocab(train_vocab(lines, 21128), path)
    return path


@pytest.fixture(scope="module")
def tokenizer(vocab_path) -> BertTokenizer:
    return BertTokenizer.from_file(vocab_path)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def convert(vocab_path, docs, seed=7, **options) -> tuple[dict, str, bytes]:
    # the bert job, or electra_zh_en with format=electra, or format=bert (the bert job under its former name)
    job, config = load_configured(
        "electra_zh_en" if "format" in options else "bert", {"vocab_file": vocab_path, **options}
    )
    sink = MemorySink()
    stats = job.document_converter(config, read_file).convert(iter(docs), ItemContext("item", seed, "test"), sink)
    ((suffix, data),) = sink.files.items()
    return stats, suffix, data


@pytest.fixture(scope="module")
def sample_run(vocab_path, documents):
    """The whole sample corpus (both languages), the bert job, default options."""
    stats, suffix, data = convert(vocab_path, documents["zh"] + documents["en"])
    return stats, data


def parse_all(data: bytes) -> list[dict]:
    return [tfrecord.parse_example(r) for r in tfrecord.iter_records(data)]


# -- the records ---------------------------------------------------------------------------


def test_tensorflow_parses_records_with_run_pretrainings_spec(sample_run, tokenizer):
    tf = pytest.importorskip("tensorflow")
    stats, data = sample_run
    spec = {
        "input_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "input_mask": tf.io.FixedLenFeature([SEQ], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([PREDS], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([PREDS], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([PREDS], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    raw = list(tfrecord.iter_records(data))
    parsed = tf.io.parse_example(tf.constant(raw), spec)  # every record, all at once
    ids, mask, seg = (parsed[k].numpy() for k in ("input_ids", "input_mask", "segment_ids"))
    pos, mlm_ids, weights = (parsed[k].numpy() for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"))
    labels = parsed["next_sentence_labels"].numpy()[:, 0]
    assert len(raw) == stats["examples"] > 2000 and set(map(len, parsed.values())) == {len(raw)}
    vocab = tokenizer.vocab
    for i in range(len(raw)):
        n = int(mask[i].sum())
        n0 = n - int(seg[i].sum())
        k = int(weights[i].sum())
        assert (mask[i, :n] == 1).all() and (ids[i, n:] == 0).all() and (seg[i, n:] == 0).all()
        assert (seg[i, :n0] == 0).all() and (seg[i, n0:n] == 1).all() and n0 < n
        assert ids[i, 0] == vocab["[CLS]"] and ids[i, n0 - 1] == vocab["[SEP]"] and ids[i, n - 1] == vocab["[SEP]"]
        assert weights[i].tolist() == [1.0] * k + [0.0] * (PREDS - k) and k >= 1
        p = pos[i, :k]
        assert (np.diff(p) > 0).all() and (pos[i, k:] == 0).all() and (mlm_ids[i, k:] == 0).all()
        assert not np.isin(p, [0, n0 - 1, n - 1]).any() and (p < n).all()
        assert k <= min(PREDS, max(1, round(n * 0.15)))
    assert set(labels.tolist()) == {0, 1}
    assert stats["tokens"] == mask.sum() and stats["masked_lm_predictions"] == weights.sum()
    assert stats["random_next"] == labels.sum()


def test_records_are_exactly_what_the_generic_encoder_writes(sample_run):
    _, data = sample_run
    records = list(tfrecord.iter_records(data))
    for raw in records[:: max(1, len(records) // 200)]:
        ex = tfrecord.parse_example(raw)
        features = {
            name: (tfrecord.float_feature(v.tolist()) if v.dtype == np.float32 else tfrecord.int64_feature(v.tolist()))
            for name, v in ex.items()
        }
        assert tfrecord.example(features) == raw
        assert sorted(ex) == sorted(feature_names(False).values())


@pytest.mark.parametrize(
    "seq,preds,v2,top",
    [
        (128, 20, False, 30000),
        (16, 3, True, 1 << 16),
        (9, 5, False, 1 << 30),
        (64, 1, True, 500),
        (12, 3000, False, 3000),
    ],
)
def test_encoder_writes_what_the_generic_encoder_writes(seq, preds, v2, top, monkeypatch):
    """The encoder lays out all rows' bytes at once (numpy): each record must be exactly
    ``tfrecord.example`` of its features, framed, for every varint width (ids of one to five
    bytes, a vocab beyond 2**16), empty B, no predictions, v2 names, one row or many, rows
    encoded a slice at a time (the layout stays bounded however big max_predictions_per_seq is)."""
    monkeypatch.setattr(bert_records, "LAYOUT_BYTES", 1 << 16)
    rng = np.random.default_rng(seq * 7 + preds)
    encoder = BertRecordEncoder(BertLayout(seq, preds, v2))
    names = feature_names(v2)
    for n_rows in (1, 37):
        lengths = rng.integers(2, seq + 1, n_rows)
        first = np.array([rng.integers(2, n + 1) for n in lengths])  # == n: A only
        ids = np.where(np.arange(seq) < lengths[:, None], rng.integers(0, top, (n_rows, seq)), 0).astype(np.int64)
        counts = rng.integers(0, min(preds, seq) + 1, n_rows)
        positions = np.where(np.arange(preds) < counts[:, None], rng.integers(1, seq, (n_rows, preds)), 0)
        labels = np.where(np.arange(preds) < counts[:, None], rng.integers(0, top, (n_rows, preds)), 0)
        random_next = rng.integers(0, 2, n_rows)
        data = encoder.encode(Masked(ids, positions, labels, counts), lengths, first, random_next)
        expected = b""
        for i in range(n_rows):
            n, n0, k = int(lengths[i]), int(first[i]), int(counts[i])
            features = {
                names["input_ids"]: tfrecord.int64_feature(ids[i].tolist()),
                names["input_mask"]: tfrecord.int64_feature([1] * n + [0] * (seq - n)),
                names["segment_ids"]: tfrecord.int64_feature([0] * n0 + [1] * (n - n0) + [0] * (seq - n)),
                names["masked_lm_positions"]: tfrecord.int64_feature(positions[i].tolist()),
                names["masked_lm_ids"]: tfrecord.int64_feature(labels[i].tolist()),
                names["masked_lm_weights"]: tfrecord.float_feature([1.0] * k + [0.0] * (preds - k)),
                names["next_sentence_labels"]: tfrecord.int64_feature([int(random_next[i])]),
            }
            expected += tfrecord.frame(tfrecord.example(features))
        assert data == expected


def test_masking_statistics_on_the_sample(sample_run, tokenizer):
    stats, data = sample_run
    examples = parse_all(data)
    mask_id = tokenizer.vocab["[MASK]"]
    masked = replaced_by_mask = unchanged = 0
    special = {tokenizer.vocab[t] for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]")}
    for ex in examples:
        k = int(ex["masked_lm_weights"].sum())
        now = ex["input_ids"][ex["masked_lm_positions"][:k]]
        was = ex["masked_lm_ids"][:k]
        masked += k
        replaced_by_mask += int((now == mask_id).sum())
        unchanged += int((now == was).sum())
        randoms = now[(now != mask_id) & (now != was)]
        assert not special & set(randoms.tolist()), "a random replacement is never a special token"
    share = masked / stats["tokens"]
    assert 0.14 < share < 0.152  # 15% of each length, rounded, at most 20 (19 of 128)
    assert abs(replaced_by_mask / masked - 0.8) < 0.015
    assert abs(unchanged / masked - 0.1) < 0.015
    assert abs((masked - replaced_by_mask - unchanged) / masked - 0.1) < 0.015


def test_next_sentence_labels_about_half_on_long_documents(sample_run, documents):
    stats, _ = sample_run
    assert min(map(len, documents["zh"] + documents["en"])) > 1  # documents of many lines
    assert 0.45 < stats["random_next"] / stats["examples"] < 0.62  # one-line chunks are always random, as in BERT
    assert 0.85 < BERT.summarize(stats)["fill_ratio"] <= 1


# -- whole words ---------------------------------------------------------------------------

CJK = re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in CJK_RANGES) + "]")


def reference_flags(tokenizer: BertTokenizer, line: str) -> list[int]:
    """WORD_CONTINUES per token, spelled out: a CJK character continues a word when rjieba puts it
    after another character of the same run; a ## piece continues its word."""
    text = tokenizer.normalize(line)
    continues = [False] * len(text)
    for run in re.finditer(CJK.pattern + "{2,}", text):
        at = run.start()
        for word in rjieba.cut(run.group()):
            for j in range(1, len(word)):
                continues[at + j] = True
            at += len(word)
    pattern = tokenizer._all.tokens  # BERT's basic tokens, with their positions
    flags = []
    for m in pattern.finditer(text):
        if CJK.match(m.group()):
            flags.append(int(continues[m.start()]))
        else:
            flags += [0] + [1] * (len(tokenizer._wordpiece(m.group())) - 1)
    return flags


def test_tokenizer_marks_whole_words_in_both_languages(tokenizer, documents):
    lines = [line for docs in documents.values() for doc in docs[::4] for line in doc]
    lines += ["服务器性能测试工具 unaffordable 中文", "我们在野生动物园玩", "", "   ", "㐀㐁中文\U00020000\U00020001"]
    flagged = tokenizer.tokenize_lines_words(lines, rjieba.cut)
    plain = tokenizer.tokenize_lines(lines)
    n_cjk_continuing = 0
    for line, got, want in zip(lines, flagged, plain):
        assert [i & (WORD_CONTINUES - 1) for i in got] == want, line  # one token per Chinese character still
        flags = [i >> 30 for i in got]
        assert flags == reference_flags(tokenizer, line), line
        n_cjk_continuing += sum(f for f, t in zip(flags, tokenizer.convert_ids_to_tokens(want)) if CJK.match(t))
    assert n_cjk_continuing > 1000
    ids = tokenizer.tokenize_lines_words(["服务器性能测试工具 unaffordable"], rjieba.cut)[0]
    tokens = tokenizer.convert_ids_to_tokens([i & (WORD_CONTINUES - 1) for i in ids])
    words, current = [], []
    for t, i in zip(tokens, ids):
        if not i & WORD_CONTINUES and current:
            words.append("".join(current))
            current = []
        current.append(t.removeprefix("##"))
    words.append("".join(current))
    assert words[:3] == ["服务器", "性能", "测试工具"] and "".join(words[3:]) == "unaffordable" and len(words) == 4


def test_whole_words_are_masked_together_in_the_sample(tokenizer, documents):
    """The converter's pieces on real text: every word (rjieba's for Chinese, ## pieces for English)
    is masked whole or not at all, and multi-character words do get masked."""
    from fleet_jobs.bert.examples import BertExamples, BertOptions

    ex = BertExamples(tokenizer, BertOptions(), rjieba.cut)
    batcher = DocBatcher()
    for number, doc in enumerate(documents["zh"][:40] + documents["en"][:20]):
        batcher.add(number, ex.tokenize(doc))
    batch = batcher.take()
    gen = np.random.default_rng(1)
    spans = truncate_pairs(build_spans(batch, 0, PairOptions(), random.Random(1)), SEQ - 3, gen)
    pairs = assemble(batch.ids, spans, SEQ, tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"])
    masked = mask_batch(pairs.tokens, pairs.lengths, pairs.first_lengths, ex.masking, gen)
    multi = {"zh": 0, "en": 0}
    for i in range(len(pairs.tokens)):
        n, n0, k = int(pairs.lengths[i]), int(pairs.first_lengths[i]), int(masked.counts[i])
        chosen = set(masked.positions[i, :k].tolist())
        row = pairs.tokens[i]
        word: list[int] = []
        for p in list(range(1, n0 - 1)) + [-1] + list(range(n0, n - 1)) + [-1]:
            if p >= 0 and word and row[p] & WORD_CONTINUES:
                word.append(p)
                continue
            if word:
                inside = {q in chosen for q in word}
                assert len(inside) == 1, f"example {i}: word at {word} partly masked"
                if len(word) > 1 and True in inside:
                    first = tokenizer.inv_vocab[int(row[word[0]] & (WORD_CONTINUES - 1))]
                    multi["zh" if CJK.match(first) else "en"] += 1
            word = [p] if p >= 0 else []
    assert multi["zh"] > 100 and multi["en"] > 50


# -- options -----------------------------------------------------------------------------------


def test_same_seed_same_bytes(vocab_path, documents):
    docs = documents["zh"][:15] + documents["en"][:8]
    a = convert(vocab_path, docs, seed=3)[2]
    assert a == convert(vocab_path, [list(d) for d in docs], seed=3)[2]
    assert a != convert(vocab_path, docs, seed=4)[2]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {
            "v2_feature_names": "true",
            "whole_word_masking": "false",
            "dupe_factor": "2",
            "max_seq_length": "40",
            "max_predictions_per_seq": "7",
        },
    ],
)
def test_parquet_rows_make_the_file_parsed_records_made(vocab_path, documents, monkeypatch, options):
    """format=bert hands Parquet its rows (``BertExamples.rows``), not records for the writer to
    parse back; the file is the one the records made, row groups included (here of 7 rows)."""
    from fleet_jobs.bert import examples as bert_examples
    from fleet.formats import parquet

    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 7)
    docs = documents["zh"][:12] + documents["en"][:6]
    stats, suffix, rows_made = convert(vocab_path, docs, seed=11, output="parquet", **options)
    monkeypatch.setattr(bert_examples.BertExamples, "rows", bert_examples.BertExamples.records)  # the former way
    monkeypatch.setattr(parquet.ParquetExampleWriter, "write_examples", parquet.ParquetExampleWriter.write)
    again, _, parsed = convert(vocab_path, docs, seed=11, output="parquet", **options)
    assert suffix == ".parquet" and stats == again and stats["examples"] > 50
    assert rows_made == parsed


def test_gzip(vocab_path, documents):
    tf = pytest.importorskip("tensorflow")
    docs = documents["zh"][:10] + documents["en"][:5]
    _, suffix, plain = convert(vocab_path, docs, seed=5)
    _, gz_suffix, packed = convert(vocab_path, docs, seed=5, compression="GZIP")
    assert (suffix, gz_suffix) == (".tfrecord", ".tfrecord.gz")
    assert gzip.decompress(packed) == plain and len(packed) < len(plain) / 2
    assert convert(vocab_path, docs, seed=5, compression="gzip")[2] == packed  # no time stamp in the bytes
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bert-gzip-{os.getpid()}.tfrecord.gz")
    with open(path, "wb") as f:
        f.write(packed)
    try:
        read = [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type="GZIP")]
    finally:
        os.unlink(path)
    assert read == list(tfrecord.iter_records(plain))


def test_v2_feature_names(vocab_path, documents):
    tf = pytest.importorskip("tensorflow")
    docs = documents["en"][:5]
    _, _, v1 = convert(vocab_path, docs)
    _, _, v2 = convert(vocab_path, docs, v2_feature_names="true")
    names = feature_names(True)
    assert names["input_ids"] == "input_word_ids" and names["segment_ids"] == "input_type_ids"
    # tf-models' BertPretrainDataLoader with use_v2_feature_names
    spec = {
        "input_word_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "input_type_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "input_mask": tf.io.FixedLenFeature([SEQ], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([PREDS], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([PREDS], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([PREDS], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    first1, first2 = parse_all(v1), parse_all(v2)
    assert len(first1) == len(first2) > 10
    for a, b in zip(first1, first2):
        assert set(b) == set(spec) and "input_ids" not in b
        assert (a["input_ids"] == b["input_word_ids"]).all() and (a["segment_ids"] == b["input_type_ids"]).all()
    parsed = tf.io.parse_example(tf.constant(list(tfrecord.iter_records(v2))), spec)
    assert parsed["input_word_ids"].shape == (len(first2), SEQ)


def test_dupe_factor_builds_the_item_again_with_other_randomness(vocab_path, documents):
    docs = documents["zh"][:6] + documents["en"][:4]
    one, _, data1 = convert(vocab_path, docs)
    three, _, data3 = convert(vocab_path, docs, dupe_factor=3)
    records = list(tfrecord.iter_records(data3))
    first, rest = Counter(tfrecord.iter_records(data1)), Counter(records)
    rest.subtract(first)
    assert min(rest.values()) >= 0  # the first pass is the dupe_factor=1 output (all passes shuffled together)
    assert len(records) == three["examples"] and 2.5 * one["examples"] < three["examples"] < 3.5 * one["examples"]
    assert three["documents"] == one["documents"]  # the documents are read once
    passes = [parse_all(data1), parse_all(b"".join(tfrecord.frame(r) for r in rest.elements()))]
    assert len(passes[1]) == three["examples"] - one["examples"]
    positions = [{tuple(ex["masked_lm_positions"]) for ex in p} for p in passes]
    assert len(positions[0] & positions[1]) < len(positions[0]) / 10  # masked elsewhere


def test_dupe_factor_spills_to_a_file_beyond_its_memory_limit(vocab_path, documents, monkeypatch):
    import functools

    from fleet_jobs.bert import examples as bert_examples, job

    docs = documents["zh"][:12] + documents["en"][:8]
    monkeypatch.setattr(bert_examples, "DocBatcher", functools.partial(bert_examples.DocBatcher, batch_tokens=5000))
    _, _, in_memory = convert(vocab_path, docs, dupe_factor=2)
    spilled = []

    class Recording(job.SpillingBatches):
        def __exit__(self, *exc):
            spilled.append((len(self.in_memory), self.spilled))
            super().__exit__(*exc)

    monkeypatch.setattr(job, "SpillingBatches", functools.partial(Recording, limit=100_000))
    _, _, on_disk = convert(vocab_path, docs, dupe_factor=2)
    assert on_disk == in_memory
    assert spilled[0][0] >= 1 and spilled[0][1] >= 2, spilled  # some batches in memory, the rest in the file


def test_pack_documents_fills_sequences_of_short_documents(vocab_path, documents):
    lines = [line for doc in documents["zh"][:30] + documents["en"][:20] for line in doc]
    rng = random.Random(0)
    short, i = [], 0
    while i < len(lines):  # documents of one to three lines
        n = rng.randint(1, 3)
        short.append(lines[i : i + n])
        i += n
    fill = {}
    for fmt, job in (("electra", JOB), ("bert", BERT)):
        for pack in (False, True):
            config = job.parse_config({"vocab_file": vocab_path, "pack_documents": str(pack)})
            sink = MemorySink()
            stats = job.document_converter(config, read_file).convert(short, ItemContext("i", 1, "t"), sink)
            fill[fmt, pack] = job.summarize(stats)["fill_ratio"]
            if fmt == "bert" and pack:
                assert 0.4 < stats["random_next"] / stats["examples"] < 0.65
    assert fill["electra", False] < 0.5 and fill["bert", False] < 0.55  # measured: 42-44% on short documents
    assert fill["electra", True] > 0.9 and fill["bert", True] > 0.9


def test_a_huge_document_is_tokenized_in_parts(vocab_path, documents, monkeypatch):
    from fleet_jobs.bert import examples as bert_examples

    doc = [line for d in documents["zh"][:20] for line in d]
    stats, _, whole = convert(vocab_path, [doc])
    monkeypatch.setattr(bert_examples, "LINE_CHARS_PER_CALL", 2000)
    stats_parts, _, parts = convert(vocab_path, [doc])
    assert parts == whole and stats_parts == stats  # same document, same examples
    assert stats["random_next"] == 0  # one document: no other to draw from


def short_documents(documents, n_lines=2000) -> list[list[str]]:
    """The sample's lines regrouped into documents of one to three lines."""
    lines = [line for doc in documents["zh"] + documents["en"] for line in doc][:n_lines]
    rng, out, i = random.Random(0), [], 0
    while i < len(lines):
        n = rng.randint(1, 3)
        out.append(lines[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("options", [{}, {"whole_word_masking": "false"}, {"pack_documents": "true"}])
def test_short_documents_tokenized_together_give_the_records_of_one_at_a_time(
    vocab_path, documents, monkeypatch, options
):
    import functools

    from fleet_jobs.bert import examples as bert_examples

    docs = short_documents(documents)
    monkeypatch.setattr(bert_examples, "DocBatcher", functools.partial(bert_examples.DocBatcher, batch_tokens=3000))
    together = convert(vocab_path, docs, **options)
    monkeypatch.setattr(bert_examples, "GROUP_CHARS", 1)  # each document tokenized alone
    assert convert(vocab_path, docs, **options) == together


@pytest.mark.parametrize("pack", ["false", "true"])
def test_electra_groups_of_documents_give_the_records_of_one_at_a_time(
    vocab_path, documents, tokenizer, monkeypatch, pack
):
    import random as random_module

    from fleet_jobs.electra_zh_en import job
    from fleet_jobs.electra_zh_en.builder import DocumentRandom, ExampleBuilder

    docs = short_documents(documents) + documents["en"][:3]
    _, _, together = convert(vocab_path, docs, format="electra", pack_documents=pack)
    monkeypatch.setattr(job, "GROUP_CHARS", 1)
    _, _, alone = convert(vocab_path, docs, format="electra", pack_documents=pack)
    assert alone == together
    # ... and the per-example writer on the reference builder's padded examples.
    # (without packing each document draws from its own DocumentRandom, from the run seed and its text)
    config = JOB.parse_config({"vocab_file": vocab_path})
    converter = JOB.document_converter(config, read_file)
    builder = ExampleBuilder(SEQ, converter.cls_id, converter.sep_id, random_module.Random(7))
    key = DocumentRandom.seed_key(config.seed)

    def add(sentences, doc):
        if pack == "true":
            return builder.add_sentences(sentences)
        builder.rng, builder._target = DocumentRandom(key, "\n".join(doc).encode()), SEQ
        return builder.add_document(sentences)

    examples = [ex for doc in docs for ex in add(tokenizer.tokenize_lines(doc), doc)]
    last = builder.end_document()
    examples += [last] if last is not None else []
    assert together == b"".join(map(converter.encoder.record, examples))


def test_config_errors(vocab_path, tmp_path):
    bad = {
        "unknown option(s) masked_lm_prob": {"masked_lm_prob": "0.2"},  # the bert job's: --job bert
        "option masked_lm_prob: not with format=electra (job electra_zh_en has no option masked_lm_prob)": {
            "format": "electra",
            "masked_lm_prob": "0.2",
        },
        "option provenance: not with format=bert (job bert has no option provenance)": {
            "format": "bert",
            "provenance": "true",
        },
        "option compression: 'zip' is not supported": {"compression": "zip"},
        "option format: 'gpt' is not supported (known: electra, bert; format=bert is the job bert: --job bert)": {
            "format": "gpt"
        },
    }
    for_bert = {
        "option compression: 'zip' is not supported": {"compression": "zip"},
        "option masked_lm_prob: must be in (0, 1]": {"masked_lm_prob": "0"},
        "option max_predictions_per_seq": {"max_predictions_per_seq": "0"},
        "option short_seq_prob": {"short_seq_prob": "1.5"},
        "option dupe_factor: must be between": {"dupe_factor": "0"},
        "option whole_word_masking: expected true or false": {"whole_word_masking": "maybe"},
        "option max_seq_length: must be between 5 and 65536": {"max_seq_length": "4"},
        "unknown option(s) format": {"format": "bert"},  # the bert job has no format
    }
    cases = [("electra_zh_en", message, options) for message, options in bad.items()]
    cases += [("bert", message, options) for message, options in for_bert.items()]
    cases += [
        ("electra_zh_en", message, {"format": "bert", **options})  # the alias checks as the bert job does
        for message, options in for_bert.items()
        if "format" not in options
    ]
    for name, message, options in cases:
        with pytest.raises(ConfigError) as e:
            job, config = load_configured(name, {"vocab_file": vocab_path, **options})
            job.check(config, read_file)
        assert message in str(e.value) and "\n" not in str(e.value), (name, options, str(e.value))
    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\n")
    with pytest.raises(ConfigError, match="no_mask.txt: the bert job needs a \\[MASK\\] token"):
        BERT.check(BertConfig(vocab_file=str(no_mask)), read_file)
    with pytest.raises(ConfigError, match="no_mask.txt: the electra_zh_en job needs a \\[MASK\\] token"):
        JOB.check(ElectraConfig(vocab_file=str(no_mask)), read_file)  # ELECTRA's trainer masks too (issue 17)
    for job in (JOB, BERT):
        job.check(
            job.parse_config({"vocab_file": vocab_path, "compression": "GZIP", "pack_documents": "true"}), read_file
        )


# The options of electra_zh_en as a run's run.json holds them before the bert job left it (issue 31):
# a run planned with them must still parse, resume and read (discovery's rule: FORMER_NAMES).
OLD_ELECTRA_CONFIG = {
    "vocab_file": "",
    "max_seq_length": 128,
    "do_lower_case": True,
    "seed": 12345,
    "format": "electra",
    "compression": "none",
    "output": "tfrecord",
    "pack_documents": False,
    "split_sentences": False,
    "masked_lm_prob": 0.15,
    "max_predictions_per_seq": 20,
    "short_seq_prob": 0.1,
    "dupe_factor": 1,
    "whole_word_masking": True,
    "v2_feature_names": False,
    "provenance": False,
}
# Options added since that run.json was written (--dedup near's): an old run.json reads them at their defaults.
NEW_TEXT_OPTIONS = {"near_threshold": 0.8, "near_ngram": 5, "near_bands": "14x8", "near_clusters": False}
NEW_ELECTRA_OPTIONS = {"fields": ""}  # beside provenance, which the bert job has not
ELECTRA_OPTIONS = (
    set(NEW_TEXT_OPTIONS)
    | set(NEW_ELECTRA_OPTIONS)
    | set(OLD_ELECTRA_CONFIG)
    - {
        "format",
        "masked_lm_prob",
        "max_predictions_per_seq",
        "short_seq_prob",
        "dupe_factor",
        "whole_word_masking",
        "v2_feature_names",
    }
)


def test_the_electra_options_and_the_old_run_json_they_read():
    """electra_zh_en's options are ELECTRA's alone; a run.json written before (format and the bert
    job's options at their defaults, or format=bert) reads as electra_zh_en or the bert job with
    the options they had."""
    import dataclasses

    from fleet.core.discovery import JobChoice, resolve_job

    config = dataclasses.asdict(ElectraConfig())
    assert set(config) == ELECTRA_OPTIONS
    defaults = {**OLD_ELECTRA_CONFIG, **NEW_TEXT_OPTIONS, **NEW_ELECTRA_OPTIONS}
    assert all(config[name] == defaults[name] for name in config)
    bert = dataclasses.asdict(BertConfig())
    # the bert job: the options of format=bert, and the new ones
    assert set(bert) == set(NEW_TEXT_OPTIONS) | set(OLD_ELECTRA_CONFIG) - {"format", "provenance"}
    assert all(bert[name] == defaults[name] for name in bert)
    assert resolve_job("electra_zh_en", OLD_ELECTRA_CONFIG).settings == {
        k: v for k, v in config.items() if k not in NEW_TEXT_OPTIONS and k not in NEW_ELECTRA_OPTIONS
    }  # what that run.json held: the new options take their defaults when it is parsed
    old_bert = {**OLD_ELECTRA_CONFIG, "format": "bert", "dupe_factor": 3}
    before = {k: v for k, v in bert.items() if k not in NEW_TEXT_OPTIONS}  # what that run.json held
    assert resolve_job("electra_zh_en", old_bert) == JobChoice("bert", {**before, "dupe_factor": 3})


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"dupe_factor": "2", "v2_feature_names": "true", "pack_documents": "true"},
        {"split_sentences": "true", "whole_word_masking": "false", "output": "parquet"},
        {"compression": "GZIP", "max_seq_length": "64", "seed": "3"},
    ],
)
def test_format_bert_is_the_bert_job(vocab_path, documents, options):
    """``--job electra_zh_en --set format=bert`` and an old run.json's config (every option written
    out, provenance too) load the bert job: its files, counters and summary, byte for byte."""
    import dataclasses

    docs = documents["zh"][:15] + documents["en"][:10]
    settings = {"vocab_file": vocab_path, **options}
    old_run_json = {**dataclasses.asdict(BERT.parse_config(settings)), "format": "bert", "provenance": False}

    def run(values):
        job, config = load_configured("electra_zh_en", values)
        assert job is BERT
        sink = MemorySink()
        stats = job.document_converter(config, read_file).convert(iter(docs), ItemContext("i", 7, "t"), sink)
        return stats, sink.files

    direct = BERT.document_converter(BERT.parse_config(settings), read_file).convert(
        iter(docs), ItemContext("i", 7, "t"), sink := MemorySink()
    )
    assert run({**settings, "format": "bert"}) == run(old_run_json) == (direct, sink.files)
    assert direct["examples"] > 20


def test_electra_with_gzip_and_packing(vocab_path, documents):
    docs = documents["en"][:5]
    config = JOB.parse_config({"vocab_file": vocab_path})
    plain = MemorySink()
    JOB.document_converter(config, read_file).convert(docs, ItemContext("i", 1, "t"), plain)
    packed = MemorySink()
    config = JOB.parse_config({"vocab_file": vocab_path, "compression": "GZIP"})
    JOB.document_converter(config, read_file).convert(docs, ItemContext("i", 1, "t"), packed)
    assert gzip.decompress(packed.files[".tfrecord.gz"]) == plain.files[".tfrecord"]


def test_fleet_jobs_lists_the_bert_job_with_help_for_every_option():
    """``fleet jobs`` finds the bert job by discovery; its options inherited from the shared
    base have their help too (from the fields' metadata: the fleet reads a comment from the
    job's own class only)."""
    from fleet.job import available_jobs, describe_options
    from tests.helpers.cli import fleet

    assert {"bert", "electra_zh_en"} <= set(available_jobs())
    for config_type in (BertConfig, ElectraConfig):
        missing = [o.name for o in describe_options(config_type) if not o.help]
        assert not missing, (config_type.__name__, missing)
    proc = fleet("jobs", "bert", env={"COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines() if line.count("│") == 5}
    assert set(rows) == set(NEW_TEXT_OPTIONS) | set(OLD_ELECTRA_CONFIG) - {"format", "provenance"}
    assert "URL or path of a BERT vocab.txt" in rows["vocab_file"] and "0.15" in rows["masked_lm_prob"]
