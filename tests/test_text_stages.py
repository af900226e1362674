"""A text job's stages (``--shards N``, ``--dedup exact``), run through a simulated shuffle: the map
and reduce items are the jobs' own (``JOB.converter``, ``JOB.reducer``) and the fleet's part (keyed
records partitioned by key range or cut into equal runs, each sorted by (key, value)) is a few
lines here. Shards hold exactly the examples a run without them writes, in every output format,
whatever the item cut; dedup keeps exactly the first copy of each normalized text."""

from __future__ import annotations

import collections
import gzip
import json
import os
import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.job import (
    ConfigError,
    ItemContext,
    ItemInput,
    KeyedSink,
    Sink,
    Source,
    Stage,
    StageOptions,
    item_seed,
    load_job,
    parse_example,
    shuffle_key,
)
from fleet.formats import tfrecord
from fleet_jobs.text.stages.dedup import (
    DedupCounts,
    decode_value,
    document_digest,
    document_record,
    normalize,
    unique_documents,
)
from fleet_jobs.text.job import DocumentConverter, TextJob
from fleet_jobs.text.output import example_sink
from fleet_jobs.text.stages import DedupReducer
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.helpers.records import canonical, examples
from tests.helpers.sinks import MemorySink

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    """About 120 different documents of the sample corpus, their first lines (a fast conversion)."""
    docs = []
    for lang in ("en", "zh"):
        with open(os.path.join(ROOT, "corpus", f"sample_{lang}.txt"), encoding="utf-8") as f:
            docs += [block.split("\n")[:6] for block in f.read().split("\n\n") if block.strip()]
    return list({" ".join(" ".join(d).split()): d for d in docs}.values())  # the planted copies are the only ones


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, documents) -> str:
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    write_vocab(train_vocab((line for d in documents for line in d), 3000), path)
    return path


# -- the fleet's part, simulated ---------------------------------------------------------------


class MemoryKeyedSink(KeyedSink):
    def __init__(self, partitions: int):
        self.partitions = partitions
        self.records: list[tuple[int, bytes]] = []

    def emit(self, key: int, value: bytes) -> None:
        assert isinstance(key, int) and 0 <= key < 1 << 64 and isinstance(value, bytes)
        self.records.append((key, value))


def shuffle(records: list[tuple[int, bytes]], stage: Stage) -> list[list[tuple[int, bytes]]]:
    """What the fleet hands a stage's items: key ranges, or equal runs of the sorted records."""
    ordered = sorted(records)
    if stage.balanced:
        n, k = len(ordered), stage.items
        bounds = [i * n // k for i in range(k + 1)]
        return [ordered[bounds[i] : bounds[i + 1]] for i in range(k)]
    parts: list[list[tuple[int, bytes]]] = [[] for _ in range(stage.items)]
    for key, value in ordered:
        parts[(key * stage.items) >> 64].append((key, value))
    return parts


def write_items(folder, items: list[list[list[str]]]) -> list[str]:
    """Each item's documents as one JSON Lines file (one item each: lines kept as they are)."""
    os.makedirs(folder, exist_ok=True)
    names = []
    for i, docs in enumerate(items):
        name = f"in-{i:03d}.jsonl"
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            for doc in docs:
                f.write(json.dumps({"text": "\n".join(doc)}) + "\n")
        names.append(name)
    return names


def run(job: TextJob, config, folder: str, options: StageOptions, workdir: str):
    """A run over the files of ``folder`` (one map item each): its outputs as [(item, suffix, bytes)],
    the counters summed, and each stage's items' counters."""
    names = sorted(os.listdir(folder))
    stages = job.stages(config, options, len(names))
    run_seed = job.seed(config)
    totals: collections.Counter = collections.Counter()
    per_stage: dict[str, list[dict]] = collections.defaultdict(list)
    outputs: list[tuple[str, str, bytes]] = []

    def sink_for(feeds: str) -> Sink | KeyedSink:
        return MemoryKeyedSink(next(s.items for s in stages if s.name == feeds)) if feeds else MemorySink()

    def collect(item_id: str, sink, stage: str, stats: dict, keyed: list):
        per_stage[stage].append(stats)
        totals.update({k: v for k, v in stats.items() if isinstance(v, (int, float))})
        if isinstance(sink, MemoryKeyedSink):
            keyed += sink.records
        else:
            outputs.extend((item_id, suffix, data) for suffix, data in sink.files.items())

    converter = job.converter(config, read_file)
    feeds = stages[0].name if stages else ""
    keyed: list[tuple[int, bytes]] = []
    for i, name in enumerate(names):
        [piece] = job.cut(Source(folder, name, os.path.getsize(os.path.join(folder, name))), 1 << 30, config, {})
        item_id = f"{i:05d}"
        ctx = ItemContext(item_id, item_seed(run_seed, item_id), name, workdir, feeds=feeds, run_seed=run_seed)
        sink = sink_for(feeds)
        collect(
            item_id,
            sink,
            "map",
            converter.convert(ItemInput(folder, name, piece.start, piece.end, meta=piece.meta), ctx, sink),
            keyed,
        )
    for n, stage in enumerate(stages):
        feeds = stages[n + 1].name if n + 1 < len(stages) else ""
        reducer = job.reducer(config, read_file, stage.name)
        parts, keyed = shuffle(keyed, stage), []
        for i, records in enumerate(parts):
            item_id = f"{i:05d}-of-{stage.items:05d}"
            ctx = ItemContext(
                item_id,
                item_seed(run_seed, f"{stage.name}/{item_id}"),
                stage.name,
                workdir,
                stage=stage.name,
                feeds=feeds,
                run_seed=run_seed,
            )
            sink = sink_for(feeds)
            collect(item_id, sink, stage.name, reducer.reduce(iter(records), ctx, sink), keyed)
    assert not keyed
    return outputs, totals, per_stage


def tf_records(outputs) -> list[bytes]:
    out = []
    for _item, suffix, data in outputs:
        assert suffix in (".tfrecord", ".tfrecord.gz")
        out += tfrecord.iter_records(gzip.decompress(data) if suffix.endswith(".gz") and data else data)
    return out


def all_examples(outputs) -> list[dict]:
    return [e for _item, suffix, data in outputs for e in examples(data, suffix)]


JOBS = {
    "electra_zh_en": {"max_seq_length": "48"},
    "causal_lm": {"max_seq_length": "40", "pack_documents": "false"},  # blocks per document: cut-invariant
}


def config_of(name: str, vocab: str, **more):
    return load_job(name).parse_config({"vocab_file": vocab, **JOBS[name], **more})


# -- the stages a text job asks for ------------------------------------------------------------


def test_stages_asked_for_by_the_options(vocab):
    for name in (*JOBS, "bert"):
        job = load_job(name)
        config = job.parse_config({"vocab_file": vocab})
        assert job.stages(config, StageOptions(), 7) == []
        assert job.stages(config, StageOptions(shards=4), 7) == [Stage("shards", 4, balanced=True)]
        assert job.stages(config, StageOptions(dedup="exact"), 7) == [Stage("dedup", 7)]
        assert job.stages(config, StageOptions(shards=4, dedup="exact"), 7) == [
            Stage("dedup", 7),
            Stage("shards", 4, balanced=True),
        ]
        with pytest.raises(ConfigError) as e:
            job.stages(config, StageOptions(dedup="fuzzy"), 7)
        assert str(e.value) == "--dedup 'fuzzy': unknown mode; known: exact, near, or exact,near"
        with pytest.raises(ConfigError, match="no stage 'sort'"):
            job.reducer(config, read_file, "sort")


# -- shards: a global shuffle of the examples a run without them writes ------------------------


@pytest.mark.parametrize("name", list(JOBS))
def test_shards_hold_the_examples_of_a_run_without_them_whatever_the_cut_and_format(name, vocab, documents, tmp_path):
    job = load_job(name)
    write_items(tmp_path / "three", [documents[:50], documents[50:90], documents[90:]])
    write_items(tmp_path / "five", [documents[i::5] for i in range(5)][::-1])  # other items, other order
    config = config_of(name, vocab)
    plain, plain_totals, _ = run(job, config, str(tmp_path / "three"), StageOptions(), str(tmp_path))
    records = sorted(tf_records(plain))
    assert len(records) > 100

    sharded, totals, per_stage = run(job, config, str(tmp_path / "three"), StageOptions(shards=4), str(tmp_path))
    assert [(item, suffix) for item, suffix, _ in sharded] == [(f"{i:05d}-of-00004", ".tfrecord") for i in range(4)]
    shards = [list(tfrecord.iter_records(data)) for _item, _suffix, data in sharded]
    assert sorted(r for shard in shards for r in shard) == records
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced
    keys = [shuffle_key(job.seed(config), r) for shard in shards for r in shard]
    assert keys == sorted(keys)  # one global order: the shuffle's
    # The map counted the examples, the shards wrote them: each once.
    assert totals["examples"] == plain_totals["examples"] == totals["shard_examples"] == len(records)
    assert job.summarize(totals) == job.summarize(plain_totals)
    assert [s["shard_examples"] for s in per_stage["shards"]] == list(map(len, shards))

    # Another cut of the same documents into items: the same shards, byte for byte.
    recut, _, _ = run(job, config, str(tmp_path / "five"), StageOptions(shards=4), str(tmp_path))
    assert recut == sharded

    # Parquet and GZIP runs shuffle the same records and write them in their format.
    for more, suffix in (({"output": "parquet"}, ".parquet"), ({"compression": "GZIP"}, ".tfrecord.gz")):
        other, _, _ = run(
            job, config_of(name, vocab, **more), str(tmp_path / "three"), StageOptions(shards=4), str(tmp_path)
        )
        assert {s for _item, s, _ in other} == {suffix}
        assert [examples(data, suffix) for _item, _s, data in other] == [
            examples(data, ".tfrecord") for _item, _s, data in sharded
        ]
    parquet_plain, _, _ = run(
        job, config_of(name, vocab, output="parquet"), str(tmp_path / "three"), StageOptions(), str(tmp_path)
    )
    assert canonical(all_examples(parquet_plain)) == canonical(all_examples(plain))


def test_a_shard_writes_parquet_rows_of_every_feature_of_the_job(vocab, documents, tmp_path):
    """A job's float features (BERT's masked_lm_weights) survive the shuffle into Parquet rows."""
    job = load_job("bert")
    write_items(tmp_path / "in", [documents[:20], documents[20:40]])
    for output in ("tfrecord", "parquet"):
        config = job.parse_config({"vocab_file": vocab, "max_seq_length": "48", "output": output})
        plain, _, _ = run(job, config, str(tmp_path / "in"), StageOptions(), str(tmp_path))
        sharded, _, _ = run(job, config, str(tmp_path / "in"), StageOptions(shards=3), str(tmp_path))
        got = all_examples(sharded)
        assert got and canonical(got) == canonical(all_examples(plain))
        assert set(got[0]) == set(job.features(config))


# -- dedup: the first copy of each normalized text ---------------------------------------------


def nfd(lines: list[str]) -> list[str]:
    return [unicodedata.normalize("NFD", line) for line in lines]


def planted(documents: list[list[str]]):
    """Items with planted copies, the documents a dedup must keep (in (item, ordinal) order, as
    they were first written), and the copies it must drop."""
    rng = random.Random(7)
    a, c = documents[:12], documents[12:30]
    e_base = [["Café crème, naïve résumé.", "second  line"], ["tab\tand  spaces", "x"]]
    near = [line[:-1] + ("!" if line[-1:] != "!" else "?") for line in a[3][:1]] + a[3][1:]  # one character
    items = [
        # Two copies in one item (the first kept); variants of item 4's first two documents, here at
        # places 2 and 3: the lower item goes first, whatever the ordinals, and its raw text is kept.
        [["Same  inside", "one item"], ["Same inside one", "item"], nfd(e_base[0]), ["  tab and spaces ", " x  "]],
        a,
        list(a),  # a whole file copied
        c[:9] + [c[2]] + rng.sample(a, 5) + c[9:] + [near],  # a copy inside the item; a shuffled subset
        e_base + [[" ".join(" ".join(c[4]).split())]],  # the variants' normal forms; c[4] on one line
    ]
    kept, seen, dropped = [], set(), []
    for docs in items:
        for doc in docs:
            text = " ".join(unicodedata.normalize("NFC", "\n".join(doc)).split())
            (dropped if text in seen else kept).append(doc)
            seen.add(text)
    assert (len(kept), len(dropped)) == (3 + 12 + 18 + 1, 1 + 12 + 1 + 5 + 2 + 1)  # as planted
    return items, kept, dropped


class Recording(DocumentConverter):
    def __init__(self):
        self.documents: list[list[str]] = []

    def convert(self, documents, ctx, sink):
        self.documents += documents
        return {"documents": len(self.documents)}


def test_dedup_keeps_the_first_copy_of_each_normalized_text(documents, tmp_path):
    items, kept, dropped = planted(documents)
    emitted = []
    for i, docs in enumerate(items):
        emitted += [document_record(doc, f"{i:05d}", n) for n, doc in enumerate(docs)]
    for parts in (1, 3):
        got: list[list[str]] = []
        counts = DedupCounts()
        for part in shuffle(emitted, Stage("dedup", parts)):
            recording = Recording()
            stats = DedupReducer(recording).reduce(iter(part), ItemContext("r", 0, "test"), MemorySink())
            got += recording.documents
            counts.kept += stats["dedup_documents_kept"]
            counts.dropped += stats["dedup_documents_dropped"]
            counts.bytes_dropped += stats["dedup_bytes_dropped"]
        assert sorted(got) == sorted(kept)  # the raw text of the first copy, not another's or the normal form
        assert counts.kept == len(kept) and counts.dropped == len(dropped)
        assert counts.bytes_dropped == sum(len("\n".join(d).encode()) for d in dropped)


def test_unique_documents_reads_sorted_records_as_the_fleet_gives_them():
    docs = [["b"], ["a"], ["b "], ["a"], [" a"], ["c"]]
    records = sorted(document_record(d, "00000" if i < 3 else "00001", i) for i, d in enumerate(docs))
    counts = DedupCounts()
    got = list(unique_documents(records, counts))
    assert sorted(got) == [["a"], ["b"], ["c"]] and (counts.kept, counts.dropped, counts.bytes_dropped) == (3, 3, 5)


@pytest.mark.parametrize("shards", [0, 3])
def test_a_dedup_run_writes_the_examples_of_a_run_over_the_unique_documents(shards, vocab, documents, tmp_path):
    items, kept, dropped = planted(documents)
    write_items(tmp_path / "planted", items)
    write_items(tmp_path / "unique", [kept])
    job = load_job("electra_zh_en")
    config = config_of("electra_zh_en", vocab)
    want, want_totals, _ = run(job, config, str(tmp_path / "unique"), StageOptions(), str(tmp_path))
    got, totals, per_stage = run(
        job, config, str(tmp_path / "planted"), StageOptions(shards=shards, dedup="exact"), str(tmp_path)
    )
    assert sorted(tf_records(got)) == sorted(tf_records(want))
    assert len({item for item, _s, _d in got}) == (shards or len(items))
    assert totals["documents_read"] == sum(map(len, items))
    assert totals["text_bytes_read"] == sum(len("\n".join(d).encode()) for docs in items for d in docs)
    assert totals["documents"] == totals["dedup_documents_kept"] == len(kept) == want_totals["documents"]
    assert totals["dedup_documents_dropped"] == len(dropped)
    assert totals["dedup_bytes_dropped"] == sum(len("\n".join(d).encode()) for d in dropped)
    assert totals["examples"] == want_totals["examples"] and totals["tokens"] == want_totals["tokens"]
    assert job.summarize(totals) == job.summarize(want_totals)
    assert all(
        set(stats) >= {"documents_read", "text_bytes_read"} and "examples" not in stats for stats in per_stage["map"]
    )


# -- the pure parts ----------------------------------------------------------------------------

WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
words = st.lists(
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1).map(lambda w: "".join(w.split())).filter(bool),
    min_size=1,
    max_size=8,
)
runs = st.text(st.sampled_from(WHITESPACE), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_normalizing_twice_changes_nothing(text):
    once = normalize(text)
    assert normalize(once) == once
    assert once == once.strip() and "  " not in once


@settings(max_examples=100, deadline=None)
@given(words=words, data=st.data())
def test_whitespace_and_composition_variants_of_a_document_hash_equal(words, data):
    def variant() -> list[str]:
        text = data.draw(st.sampled_from(["", " ", "\n"]))
        for word in words:
            text += word + data.draw(runs)
        text = unicodedata.normalize(data.draw(st.sampled_from(["NFC", "NFD"])), text)
        return text.split("\n")  # the lines: a newline is whitespace too

    assert document_digest(variant()) == document_digest(variant()) == document_digest([" ".join(words)])


@settings(max_examples=100, deadline=None)
@given(lines=st.lists(st.text()), item=st.integers(0, 99_999), ordinal=st.integers(0, 2**32 - 1))
def test_a_document_record_gives_back_its_place_and_its_lines_exactly(lines, item, ordinal):
    key, value = document_record(lines, f"{item:05d}", ordinal)
    digest = document_digest(lines)
    record = decode_value(value)
    assert (key.to_bytes(8, "big") + record.digest_tail, record.item_id, record.ordinal, record.lines) == (
        digest,
        f"{item:05d}",
        ordinal,
        lines,
    )


@settings(max_examples=100, deadline=None)
@given(
    places=st.lists(st.tuples(st.integers(0, 99_999), st.integers(0, 2**32 - 1)), min_size=2, max_size=6, unique=True),
    copies=st.lists(st.sampled_from(WHITESPACE), min_size=6, max_size=6),
)
def test_copies_of_a_text_sort_by_their_place_in_the_plan(places, copies):
    """Copies of a text (their own whitespace) sort by (item, ordinal): the reduce keeps the first."""
    records = [
        document_record([f"{space}same{space}text"], f"{item:05d}", n) for (item, n), space in zip(places, copies)
    ]
    assert len({(key, value[:8]) for key, value in records}) == 1
    order = sorted(range(len(places)), key=lambda i: records[i])
    assert [places[i] for i in order] == sorted(places)


def test_parse_example_reads_a_shuffled_record(vocab):
    """The records between stages are TFRecord frames of tf.train.Examples (checksums made once, in
    the map): the fleet's parser reads them, and the shards stage only joins them."""
    job = load_job("electra_zh_en")
    config = config_of("electra_zh_en", vocab)
    sink = MemoryKeyedSink(1)
    converter = job.document_converter(config, read_file)
    ctx = ItemContext("00000", 1, "test", feeds="shards", run_seed=12345)
    converter.convert(iter([["hello world"] * 10]), ctx, example_sink(sink, ctx))
    assert sink.records and all(set(parse_example(v[12:-4])) == set(job.features(config)) for _k, v in sink.records)
    assert all(v == tfrecord.frame(v[12:-4]) and k == shuffle_key(12345, v[12:-4]) for k, v in sink.records)
    with pytest.raises(TypeError, match="example_sink"):
        converter.convert(iter([["hello world"]]), ctx, sink)


@pytest.mark.parametrize("name", [*JOBS, "bert"])
def test_the_records_a_map_item_emits_do_not_depend_on_the_output_option(name, vocab, documents):
    """The shuffle carries the Examples a TFRecord run writes: a Parquet or GZIP run emits the same bytes."""
    job = load_job(name)
    ctx = ItemContext("00000", 99, "test", feeds="shards", run_seed=5)
    emitted, written = [], []
    for more in ({}, {"output": "parquet"}, {"compression": "GZIP"}):
        config = job.parse_config({"vocab_file": vocab, "max_seq_length": "48", **more})
        sink = MemoryKeyedSink(2)
        job.document_converter(config, read_file).convert(iter(documents[:30]), ctx, example_sink(sink, ctx))
        emitted.append(sink.records)
        plain = MemorySink()
        job.document_converter(config, read_file).convert(iter(documents[:30]), ctx, plain)
        written.append(all_examples([("00000", suffix, data) for suffix, data in plain.files.items()]))
    assert emitted[0] and emitted[0] == emitted[1] == emitted[2]
    # Each a TFRecord frame of an Example, keyed by the Example's bytes.
    assert [shuffle_key(5, value[12:-4]) for _key, value in emitted[0]] == [key for key, _value in emitted[0]]
    assert all(parse_example(value[12:-4]).keys() == job.features(config).keys() for _k, value in emitted[0])
    assert canonical(written[0]) == canonical(
        all_examples([("", ".tfrecord", b"".join(value for _k, value in emitted[0]))])
    )
