"""The causal_lm job: its pure block cutter, the converter with a byte-level BPE and a BERT vocab,
both output formats, and `fleet local` runs whose examples do not depend on how the corpus was cut."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.job import ConfigError, ItemContext, load_job
from fleet_jobs.causal_lm import JOB, CausalLMConfig
from fleet_jobs.causal_lm.blocks import BlockCutter, BlockOptions
from tests.helpers.records import canonical, examples, folder_examples
from tests.helpers.sinks import MemorySink
from tests.helpers.trained import bpe_json, wordpiece_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EOD, PAD = 0, 1


def read_documents(name: str) -> list[list[str]]:
    with open(os.path.join(ROOT, "corpus", name), encoding="utf-8") as f:
        return [block.split("\n") for block in f.read().split("\n\n") if block.strip()]


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    docs = read_documents("sample_en.txt")[:40] + read_documents("sample_zh.txt")[:40]
    return [d for d in docs if len("\n".join(d).encode()) < 30_000]  # below the smallest item used below


@pytest.fixture(scope="module")
def bpe_path(tmp_path_factory, documents) -> str:
    """A byte-level BPE trained on the documents, saved as a tokenizer.json."""
    return bpe_json(documents, str(tmp_path_factory.mktemp("bpe")), 2000)


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory, documents) -> str:
    return wordpiece_vocab(documents, str(tmp_path_factory.mktemp("vocab")), 4000)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def convert(config: CausalLMConfig, documents) -> tuple[dict, list[dict]]:
    sink = MemorySink()
    stats = JOB.document_converter(config, read_file).convert(iter(documents), ItemContext("i", 1, "test"), sink)
    [(suffix, data)] = sink.files.items()
    return stats, examples(data, suffix)


# -- the pure core ---------------------------------------------------------------------------


def real_ids(blocks) -> list[int]:
    return [i for row, n in zip(blocks.ids.tolist(), blocks.lengths.tolist()) for i in row[:n]]


docs_strategy = st.lists(st.lists(st.integers(2, 50), max_size=30), max_size=12)


@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, size=st.integers(2, 9), pack=st.booleans(), split=st.integers(0, 12))
def test_concatenated_blocks_give_back_every_token_of_every_document_in_order(docs, size, pack, split):
    cutter = BlockCutter(BlockOptions(size, EOD, PAD, "pad", pack))
    parts = [cutter.add(docs[:split]), cutter.add(docs[split:]), cutter.finish()]
    assert all(p.ids.shape[1:] == (size,) for p in parts)
    expected = [i for d in docs if d for i in (*d, EOD)]
    assert [i for p in parts for i in real_ids(p)] == expected
    for p in parts:  # padding only after the real ids, and only with the pad id
        assert all(row[n:] == [PAD] * (size - n) for row, n in zip(p.ids.tolist(), p.lengths.tolist()))
        assert (p.attention_mask.sum(axis=1) == p.lengths).all()
    if pack:  # one stream: only the item's last block may be partial
        assert all((p.lengths == size).all() for p in parts[:2])


@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, size=st.integers(2, 9), pack=st.booleans())
def test_dropping_partial_blocks_keeps_only_full_blocks_of_the_stream(docs, size, pack):
    cutter = BlockCutter(BlockOptions(size, EOD, PAD, "drop", pack))
    parts = [cutter.add(docs), cutter.finish()]
    got = [i for p in parts for i in real_ids(p)]
    assert all((p.lengths == size).all() for p in parts)
    streams = [[i for d in docs if d for i in (*d, EOD)]] if pack else [[*d, EOD] for d in docs if d]
    expected = [i for s in streams for i in s[: len(s) // size * size]]
    assert got == expected and cutter.dropped == sum(map(len, streams)) - len(expected)


def test_without_packing_a_documents_blocks_do_not_depend_on_its_neighbours():
    docs = [[5] * 7, [6] * 3, [], [7] * 12]
    alone = [BlockCutter(BlockOptions(4, EOD, PAD)).add([d]) for d in docs]
    together = BlockCutter(BlockOptions(4, EOD, PAD)).add(docs)
    assert together.ids.tolist() == [row for b in alone for row in b.ids.tolist()]
    assert together.ids.tolist()[:2] == [[5, 5, 5, 5], [5, 5, 5, EOD]] and together.ids.tolist()[2] == [6, 6, 6, EOD]


# -- the converter ---------------------------------------------------------------------------


def test_discovered_by_the_fleet_with_its_options():
    assert load_job("causal_lm") is JOB
    config = JOB.parse_config({"tokenizer_file": "t.json", "max_seq_length": "256", "last_block": "drop"})
    assert (config.max_seq_length, config.last_block, config.output) == (256, "drop", "tfrecord")
    assert JOB.files(config) == {"tokenizer_file": "t.json"}  # the run pins its digest


@pytest.mark.parametrize("pack", [True, False])
def test_byte_level_bpe_blocks_hold_every_document_and_its_end_token(bpe_path, documents, pack):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(bpe_path)
    eod = tokenizer.token_to_id("<|endoftext|>")
    config = CausalLMConfig(tokenizer_file=bpe_path, max_seq_length=64, pack_documents=pack)
    stats, rows = convert(config, documents)
    assert all(len(r["input_ids"]) == len(r["attention_mask"]) == 64 for r in rows)
    got = [i for r in rows for i, m in zip(r["input_ids"], r["attention_mask"]) if m]
    expected = [i for d in documents for i in (*tokenizer.encode("\n".join(d), add_special_tokens=False).ids, eod)]
    assert got == expected and stats["tokens"] == stats["real_tokens"] == len(expected)
    assert stats["examples"] == len(rows) and stats["positions"] == 64 * len(rows)
    assert stats["documents"] == len(documents) and 0.5 < JOB.summarize(stats)["fill_ratio"] <= 1
    assert tokenizer.decode(got[: got.index(eod)]) == "\n".join(documents[0])

    _, shifted = convert(
        CausalLMConfig(tokenizer_file=bpe_path, max_seq_length=64, shifted_labels=True, last_block="drop"), documents
    )
    assert {len(r["input_ids"]) for r in shifted} == {65} and all(set(r) == {"input_ids"} for r in shifted)


def test_parquet_rows_equal_the_tfrecords_of_the_same_documents(bpe_path, documents):
    for extra in ({"pack_documents": False}, {"last_block": "drop", "pack_documents": True}):
        _, tf_rows = convert(CausalLMConfig(tokenizer_file=bpe_path, max_seq_length=48, **extra), documents)
        _, pq_rows = convert(
            CausalLMConfig(tokenizer_file=bpe_path, max_seq_length=48, output="parquet", **extra), documents
        )
        assert len(tf_rows) > 50 and pq_rows == tf_rows


def test_examples_depend_on_the_documents_only_unless_packed(bpe_path, documents):
    def items(config, cuts):
        rows = []
        for a, b in zip([0, *cuts], [*cuts, len(documents)]):
            rows += convert(config, documents[a:b])[1]
        return canonical(rows)

    config = CausalLMConfig(tokenizer_file=bpe_path, max_seq_length=32, pack_documents=False)
    assert items(config, []) == items(config, [7, 30, 31, 55])
    packed = CausalLMConfig(tokenizer_file=bpe_path, max_seq_length=32)  # the default packs
    assert items(packed, []) != items(packed, [7, 30, 31, 55])  # as docs/text-jobs.md says: packing mixes an item


def test_a_bert_vocab_ends_documents_with_sep_and_pads_with_pad(vocab_path, documents):
    from fleet_jobs.text.tokenizers.tokenization import BertTokenizer

    bert = BertTokenizer.from_file(vocab_path)
    stats, rows = convert(CausalLMConfig(vocab_file=vocab_path, max_seq_length=40), documents[:5])
    got = [i for r in rows for i, m in zip(r["input_ids"], r["attention_mask"]) if m]
    expected = [
        i for d in documents[:5] for i in (*(j for line in bert.tokenize_lines(d) for j in line), bert.vocab["[SEP]"])
    ]
    assert got == expected
    pads = [i for r in rows for i, m in zip(r["input_ids"], r["attention_mask"]) if not m]
    assert pads and set(pads) == {bert.vocab["[PAD]"]}


def test_bad_options_are_one_clear_line(tmp_path, bpe_path, vocab_path):
    (tmp_path / "bad.json").write_text("{not json")
    cases = {
        "give one of the options tokenizer_file": CausalLMConfig(),
        "give one of the options": CausalLMConfig(tokenizer_file=bpe_path, vocab_file=vocab_path),
        "bad.json: not a tokenizers tokenizer.json": CausalLMConfig(tokenizer_file=str(tmp_path / "bad.json")),
        "cannot read tokenizer_file": CausalLMConfig(tokenizer_file=str(tmp_path / "nope.json")),
        "option eod_token: '<eot>' is not in": CausalLMConfig(tokenizer_file=bpe_path, eod_token="<eot>"),
        "option last_block: 'keep'": CausalLMConfig(tokenizer_file=bpe_path, last_block="keep"),
        "option max_seq_length": CausalLMConfig(tokenizer_file=bpe_path, max_seq_length=1),
        "compression applies to output=tfrecord": CausalLMConfig(
            tokenizer_file=bpe_path, output="parquet", compression="gzip"
        ),
    }
    for message, config in cases.items():
        with pytest.raises(ConfigError, match=message) as e:
            JOB.check(config, read_file)
        assert "\n" not in str(e.value)


# -- fleet local: the same examples whatever the item size and the input format ---------------


def fleet_local(inputs, out, *args):
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "local", *inputs, str(out), "--job", "causal_lm", "--workers", "2", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_the_default_packs_short_documents_so_only_each_items_last_block_is_padded(tmp_path, bpe_path, documents):
    """Issue 33 item 7: the defaults spend no space on padding (one padded block per document was
    8x the text on short documents)."""
    lines = [line for d in documents for line in d if line.strip()]
    text = tmp_path / "in" / "short.txt"
    text.parent.mkdir()
    text.write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    size = {}
    for name, more in (("default", []), ("per-document", ["--set", "pack_documents=false"])):
        fleet_local(
            [str(text.parent)], tmp_path / name, "--set", f"tokenizer_file={bpe_path}", "--item-mb", "0.1", *more
        )
        parts = sorted((tmp_path / name).glob("part-*.tfrecord"))
        size[name] = sum(p.stat().st_size for p in parts)
        if name == "default":
            assert len(parts) > 3
            for part in parts:
                rows = examples(part.read_bytes(), ".tfrecord")
                assert {len(r["input_ids"]) for r in rows} == {1024}
                assert all(all(r["attention_mask"]) for r in rows[:-1]) and not all(rows[-1]["attention_mask"])
    text_bytes = sum(len(line.encode()) for line in lines)
    assert size["default"] < 1.5 * text_bytes < size["per-document"] / 4


def test_fleet_local_examples_do_not_depend_on_item_size_or_input_format(tmp_path, bpe_path, documents):
    text = tmp_path / "in" / "docs.txt"
    text.parent.mkdir()
    text.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    jsonl = tmp_path / "in_jsonl" / "docs.jsonl.gz"
    jsonl.parent.mkdir()
    jsonl.write_bytes(gzip.compress("".join(json.dumps({"text": "\n".join(d)}) + "\n" for d in documents).encode()))
    opts = ["--set", f"tokenizer_file={bpe_path}", "--set", "max_seq_length=64", "--set", "pack_documents=false"]
    fleet_local([str(text.parent)], tmp_path / "one", *opts)
    # Items of 0.03 MB: more items, none cutting a document (docs/text-jobs.md says what a cut does).
    fleet_local([str(text.parent)], tmp_path / "many", *opts, "--item-mb", "0.03")
    fleet_local([str(jsonl.parent)], tmp_path / "jsonl", *opts, "--set", "output=parquet")  # .gz: one item
    with open(tmp_path / "many" / "summary.json") as f:
        summary = json.load(f)
    assert summary["items"] > 6 and "documents_cut" not in summary
    assert [p.name for p in (tmp_path / "jsonl").glob("part-*")] == ["part-00000.parquet"]
    one = canonical(folder_examples(str(tmp_path / "one")))
    assert len(one) > 100
    assert canonical(folder_examples(str(tmp_path / "many"))) == one
    assert canonical(folder_examples(str(tmp_path / "jsonl"))) == one

    # `fleet status --verify` checks Parquet outputs as it checks TFRecords: a damaged one is found.
    verify = [sys.executable, "-m", "fleet.cli", "status", str(tmp_path / "jsonl"), "--verify"]
    proc = subprocess.run(verify, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "part-00000.parquet" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    (tmp_path / "jsonl" / "part-00000.parquet").write_bytes(b"PAR1")
    proc = subprocess.run(verify, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "part-00000.parquet" in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
