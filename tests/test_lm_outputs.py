"""causal_lm's token-sequence outputs (issue 20): ``output=megatron`` (megatron-core's indexed
datasets) and ``output=tokens`` (flat token files), read back by their users' readers: megatron-core's
own ``IndexedDataset`` and ``numpy.memmap`` as docs/outputs.md shows it. Every token must come back, in
order, with a BERT vocab.txt and a tokenizer.json, per item and per shard (``--shards``); the
dtype comes from the vocab size, so no id can wrap; Megatron's --data-path list is weighted by
the exact counts the outputs recorded.

megatron-core and the CPU build of torch are in the ``[test]`` extra (pyproject.toml).
"""

from __future__ import annotations

import glob
import io
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from fleet.cli.local import run_local
from fleet.formats.token_files import INDEX_SUFFIXES, MEGATRON_HEADER, read_megatron_index, read_sequences, token_dtype
from fleet.job import ConfigError, ItemContext, RunManifest, StageOptions, load_job
from fleet_jobs.causal_lm import JOB, CausalLMConfig
from fleet_jobs.text.output import open_sequence_writer
from tests.helpers.sinks import MemorySink
from tests.helpers.trained import bpe_json, wordpiece_vocab

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron")  # its builder, numpy 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def megatron():
    """megatron-core's indexed_dataset module (its import takes a few seconds: once)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


# -- the corpus and the tokenizers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    """The first 6 lines of each document of the samples, and one with no text at all."""
    docs = []
    for lang in ("en", "zh"):
        with open(os.path.join(ROOT, "corpus", f"sample_{lang}.txt"), encoding="utf-8") as f:
            docs += [
                [line for line in block.split("\n") if line.strip()][:6]
                for block in f.read().split("\n\n")
                if block.strip()
            ]
    return docs[:70]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, documents) -> str:
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("".join("\n".join(d) + "\n\n" for d in documents), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def bpe_path(tmp_path_factory, documents) -> str:
    """A byte-level BPE trained on the documents, saved as a tokenizer.json."""
    return bpe_json(documents, str(tmp_path_factory.mktemp("bpe")), 1500)


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory, documents) -> str:
    return wordpiece_vocab(documents, str(tmp_path_factory.mktemp("vocab")), 3000)


def expected_sequences(documents, tokenizer_option: str, path: str) -> list[list[int]]:
    """Each document's ids and its end token, by the tokenizer library itself."""
    if tokenizer_option == "tokenizer_file":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        eod = tok.token_to_id("<|endoftext|>")
        seqs = [tok.encode("\n".join(d), add_special_tokens=False).ids for d in documents]
    else:
        from fleet_jobs.text.tokenizers.tokenization import BertTokenizer

        bert = BertTokenizer.from_file(path)
        eod = bert.vocab["[SEP]"]
        seqs = [[i for line in bert.tokenize_lines(d) for i in line] for d in documents]
    return [[*s, eod] for s in seqs if s]


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def datasets(out, output: str) -> list[str]:
    """The prefixes of a run's datasets, in name order."""
    return [p[:-4] for p in sorted(glob.glob(os.path.join(str(out), "part-*.bin")))]


def readme_tokens(prefix: str, vocab_size: int) -> list[list[int]]:
    """The reader of output=tokens in docs/outputs.md, as written there."""
    starts = np.load(prefix + ".npy")
    ids = np.memmap(prefix + ".bin", dtype=np.uint16 if vocab_size <= 65536 else np.uint32, mode="r")
    assert len(ids) == starts[-1]
    return [ids[starts[i] : starts[i + 1]].tolist() for i in range(len(starts) - 1)]


def megatron_sequences(megatron, prefix: str) -> list[list[int]]:
    dataset = megatron.IndexedDataset(prefix)
    assert len(dataset.document_indices) == len(dataset) + 1
    return [dataset[i].tolist() for i in range(len(dataset))]


def local(inputs: list[str], out, settings_: dict[str, str], shards: int = 0, item_bytes: int = 6_000, dedup: str = ""):
    console = Console(file=io.StringIO(), width=200)
    result = run_local(
        inputs,
        str(out),
        "causal_lm",
        2,
        settings_,
        item_bytes=item_bytes,
        console=console,
        stage_options=StageOptions(shards, dedup),
        lease_ttl=20,
    )
    assert result.exit_code == 0, console.file.getvalue()
    return result


# -- the writer: any documents, any vocab, read back by every reader -----------------------------

VOCABS = st.sampled_from([2, 300, 65_499, 65_500, 65_536, 65_537, 200_000])


@settings(max_examples=40, deadline=None)
@given(data=st.data(), vocab=VOCABS, output=st.sampled_from(["megatron", "tokens"]))
def test_written_sequences_read_back_equal_whatever_the_vocab(megatron, data, vocab, output):
    docs = data.draw(st.lists(st.lists(st.integers(0, vocab - 1), max_size=40), max_size=12))
    with tempfile.TemporaryDirectory() as tmp:
        sink = DirectorySink(tmp)
        with open_sequence_writer(sink, output, vocab) as out:
            cut = data.draw(st.integers(0, len(docs)))
            out.write(docs[:cut])
            out.write(docs[cut:])
        prefix = os.path.join(tmp, "part-i")
        index = read_file(prefix + INDEX_SUFFIXES[output])
        assert [s.tolist() for s in read_sequences(prefix + ".bin", index, output, vocab)] == docs
        assert sink.output_counts == {".bin": {"tokens": sum(map(len, docs)), "documents": len(docs)}}
        if output == "tokens":
            if sum(map(len, docs)):
                assert readme_tokens(prefix, vocab) == docs
            return
        assert read_megatron_index(index).dtype == megatron.DType.optimal_dtype(vocab)
        if sum(map(len, docs)):  # (megatron-core maps the .bin: an empty one it cannot open)
            assert megatron_sequences(megatron, prefix) == docs
        # The same bytes as megatron-core's own builder writes for these documents.
        import torch

        builder = megatron.IndexedDatasetBuilder(
            os.path.join(tmp, "ref.bin"), dtype=megatron.DType.optimal_dtype(vocab)
        )
        for doc in docs:
            builder.add_document(torch.tensor(doc, dtype=torch.int64), [len(doc)])
        builder.finalize(os.path.join(tmp, "ref.idx"))
        assert read_file(prefix + ".bin") == read_file(os.path.join(tmp, "ref.bin"))
        assert index == read_file(os.path.join(tmp, "ref.idx"))


class DirectorySink(MemorySink):
    """Outputs as files ``part-i<suffix>`` in a folder (the readers memory-map them)."""

    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder

    def open(self, suffix):
        return open(os.path.join(self.folder, "part-i" + suffix), "wb")


@pytest.mark.parametrize("output", ["megatron", "tokens"])
def test_the_vocab_size_decides_the_dtype_so_no_id_can_wrap(output):
    edges = [1, 2, 255, 256, 65_499, 65_500, 65_535, 65_536, 65_537, 1 << 31]
    for vocab in edges + list(np.random.default_rng(0).integers(1, 1 << 31, 200)):
        dtype = token_dtype(output, int(vocab))
        assert np.iinfo(dtype).max >= vocab - 1 and np.iinfo(dtype).min <= 0
    assert token_dtype(output, 65_499) == np.uint16 and token_dtype(output, 65_537) != np.uint16
    sink = MemorySink()
    with pytest.raises(ValueError, match="token id 65536 is outside the vocab"):
        with open_sequence_writer(sink, output, 65_536) as out:
            out.write([[1, 65_536]])  # a tokenizer that lies about its size is caught, not narrowed


# -- the converter and fleet local ---------------------------------------------------------------


@pytest.mark.parametrize("tokenizer", ["tokenizer_file", "vocab_file"])
def test_fleet_local_megatron_and_tokens_give_back_every_token_in_order(
    megatron, tmp_path, corpus, documents, bpe_path, vocab_path, tokenizer
):
    path = bpe_path if tokenizer == "tokenizer_file" else vocab_path
    want = expected_sequences(documents, tokenizer, path)
    vocab_size = JOB.document_converter(JOB.parse_config({tokenizer: path}), read_file).tokenizer.vocab_size
    for output in ("megatron", "tokens"):
        out = tmp_path / output
        result = local([corpus], out, {tokenizer: path, "output": output})
        prefixes = datasets(out, output)
        assert len(prefixes) == result.status.items > 2  # one dataset per item
        run_files = ["manifest.json"] + (["megatron-data-path.txt"] if output == "megatron" else [])
        assert sorted(os.listdir(out)) == sorted(
            [".fleet", "summary.json", *run_files]
            + [os.path.basename(p) + s for p in prefixes for s in (".bin", INDEX_SUFFIXES[output])]
        )
        if output == "megatron":  # the --data-path list names every dataset, weighted by its tokens
            listed = read_file(str(out / "megatron-data-path.txt")).decode().split()
            assert listed[1::2] == [os.path.basename(p) for p in prefixes]
            assert list(map(int, listed[0::2])) == [len(sum(megatron_sequences(megatron, p), [])) for p in prefixes]
        ours = [
            s.tolist()
            for p in prefixes
            for s in read_sequences(p + ".bin", read_file(p + INDEX_SUFFIXES[output]), output, vocab_size)
        ]
        assert ours == want
        if output == "tokens":
            assert [s for p in prefixes for s in readme_tokens(p, vocab_size)] == want
        else:
            assert [s for p in prefixes for s in megatron_sequences(megatron, p)] == want
            assert read_file(prefixes[0] + ".idx").startswith(MEGATRON_HEADER)


def test_each_output_counts_exactly_what_its_readers_find(bpe_path, documents):
    config = CausalLMConfig(tokenizer_file=bpe_path, output="megatron")
    sink = MemorySink()
    stats = JOB.document_converter(config, read_file).convert(iter(documents), ItemContext("i", 1, "t"), sink)
    index = read_megatron_index(sink.files[".idx"])
    assert sink.output_counts == {".bin": {"tokens": int(index.sizes.sum()), "documents": len(index.sizes)}}
    assert len(sink.files[".bin"]) == 2 * stats["tokens"] and stats["sequences"] == len(index.sizes)
    assert JOB.features(config) == {} and JOB.summarize(stats) == {}


def test_shards_are_balanced_datasets_holding_every_sequence_of_the_run(
    megatron, tmp_path, corpus, documents, bpe_path
):
    want = sorted(map(tuple, expected_sequences(documents, "tokenizer_file", bpe_path)))
    for output in ("megatron", "tokens"):
        out = tmp_path / output
        local([corpus], out, {"tokenizer_file": bpe_path, "output": output}, shards=3)
        prefixes = datasets(out, output)
        assert [os.path.basename(p) for p in prefixes] == [f"part-{i:05d}-of-00003" for i in range(3)]
        vocab = 1500
        shards = [
            [
                tuple(s.tolist())
                for s in read_sequences(p + ".bin", read_file(p + INDEX_SUFFIXES[output]), output, vocab)
            ]
            for p in prefixes
        ]
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        assert sorted(s for shard in shards for s in shard) == want
        if output == "megatron":
            assert [tuple(s) for p in prefixes for s in megatron_sequences(megatron, p)] == [
                s for shard in shards for s in shard
            ]


def test_dedup_then_shards_keeps_one_copy_of_each_document(tmp_path, corpus, documents, bpe_path):
    copy = tmp_path / "copy" / "again.txt"
    copy.parent.mkdir()
    copy.write_bytes(read_file(corpus))
    local(
        [corpus, str(copy)],
        tmp_path / "out",
        {"tokenizer_file": bpe_path, "output": "megatron"},
        shards=2,
        dedup="exact",
    )
    got = [
        tuple(s.tolist())
        for p in datasets(tmp_path / "out", "megatron")
        for s in read_sequences(p + ".bin", read_file(p + ".idx"), "megatron", 1500)
    ]
    assert sorted(got) == sorted(set(map(tuple, expected_sequences(documents, "tokenizer_file", bpe_path))))


# -- Megatron's --data-path list -------------------------------------------------------------------


def test_run_files_list_every_megatron_dataset_weighted_by_its_tokens():
    manifest = RunManifest(
        sources={"in.txt": {"documents": 5}},
        outputs={
            "part-00001.bin": {"tokens": 700, "documents": 3},
            "part-00001.idx": {},
            "part-00000.bin": {"tokens": 1200, "documents": 2},
            "part-00000.idx": {},
            "part-00002.bin": {"tokens": 0, "documents": 0},
            "part-00002.idx": {},
        },
    )
    files = JOB.run_files(CausalLMConfig(tokenizer_file="t.json", output="megatron"), manifest)
    assert files == {"megatron-data-path.txt": b"1200 part-00000\n700 part-00001\n"}  # the empty one left out
    assert JOB.run_files(CausalLMConfig(tokenizer_file="t.json", output="tokens"), manifest) == {}
    assert JOB.run_files(CausalLMConfig(tokenizer_file="t.json"), manifest) == {}


# -- bad options: one line, at plan time -----------------------------------------------------------


def test_options_that_make_no_sense_with_whole_sequences_are_one_line(bpe_path):
    cases = {
        "option max_seq_length: output=megatron writes each document whole": {"max_seq_length": "512"},
        "option pack_documents: output=megatron": {"pack_documents": "false"},
        "option last_block: output=megatron": {"last_block": "drop"},
        "option shifted_labels: output=megatron": {"shifted_labels": "true"},
        "option pad_token: output=megatron": {"pad_token": "<|endoftext|>"},
        "compression applies to output=tfrecord; output=megatron files are memory-mapped": {"compression": "GZIP"},
    }
    for message, more in cases.items():
        config = JOB.parse_config({"tokenizer_file": bpe_path, "output": "megatron", **more})
        with pytest.raises(ConfigError, match=message) as e:
            JOB.check(config, read_file)
        assert "\n" not in str(e.value)
    with pytest.raises(
        ConfigError, match=r"'npy' is not supported \(known: tfrecord, parquet, mds, megatron, tokens\)"
    ):
        JOB.check(JOB.parse_config({"tokenizer_file": bpe_path, "output": "npy"}), read_file)
    electra = load_job("electra_zh_en")
    with pytest.raises(ConfigError, match="output: megatron holds token sequences, which this job does not make"):
        electra.check(electra.parse_config({"vocab_file": "v.txt", "output": "megatron"}), read_file)


def test_fleet_local_refuses_a_conflict_in_one_line_with_exit_2(tmp_path, corpus, bpe_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "local",
            corpus,
            str(tmp_path / "out"),
            "--job",
            "causal_lm",
            "--set",
            f"tokenizer_file={bpe_path}",
            "--set",
            "output=tokens",
            "--set",
            "pack_documents=false",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "pack_documents" in line]
    assert len(lines) == 1 and "output=tokens writes each document whole" in lines[0]
