"""``provenance=true`` (issue 20, item 5): every example or sequence traced back to its document.

First the text layer: the place recorded for every document points at that document in the file,
for every format, compression and damage the input fuzzer makes (its renderer is reused). Then
causal_lm's block arithmetic against the BlockCutter itself. Then whole ``fleet local`` runs over
plain text, gzipped JSON Lines and Parquet: each sidecar line leads to the document whose tokens
its example holds (re-tokenized from the file at the recorded place), the sidecar has a line per
example, and the outputs themselves are the bytes a run without provenance writes.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from fleet.cli.local import run_local
from fleet.job import ConfigError, StageOptions
from fleet.core.store.local import LocalStore
from fleet_jobs.causal_lm import JOB, CausalLMConfig
from fleet_jobs.causal_lm.blocks import BlockCutter, BlockOptions
from fleet_jobs.causal_lm.provenance import BlockSources
from fleet_jobs.text.inputs import ReadOptions, Tally, formats, iter_documents, plan_ranges, ranges
from fleet_jobs.text.inputs.formats import _DOC_OPEN
from fleet_jobs.text.inputs.places import Places, field_text, line_records, placed
from fleet_jobs.text.provenance import PROVENANCE_SUFFIX
from fleet.formats.token_files import read_sequences
from tests.helpers.records import examples
from tests.test_input_invariants import COMPRESS, FORMATS_NAMES, FUZZ_SETTINGS, _STORE, damage, lines, render

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- 1. the text layer: each document's place is where the document is ----------------------------


def stream_of(data: bytes, compression: str) -> bytes:
    """What the reader reads of a file: its decompressed stream, up to where it breaks off."""
    out = b""
    for block in formats._blocks(io.BytesIO(data), compression):
        if block.__class__ is not bytes:
            break
        out += block
    return out


def record_at(stream: bytes, offset: int, fmt: str, options: ReadOptions) -> list[str]:
    """The lines of the record that starts at ``offset``, read by a parser of this test's own."""
    rest = stream[offset:].split(b"\n")

    def good(raw: bytes):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return None if len(raw) > formats.MAX_LINE_BYTES else line

    if fmt == "text":
        out = []
        for raw in rest:
            line = good(raw)
            if line is not None and not line.strip():
                break
            if line is not None:
                out.append(line)
        return out
    if fmt == "wikiextractor":
        assert _DOC_OPEN.match(rest[0].decode("utf-8")), rest[0]
        body = rest[1 if options.keep_titles else 2 :]
        out = []
        for raw in body:
            line = good(raw)
            if line is not None and line.rstrip() == "</doc>" or line is not None and _DOC_OPEN.match(line):
                break
            if line is not None and line.strip():
                out.append(line)
        return out
    if len(rest[0]) > formats.MAX_LINE_BYTES:  # the reader streams it: what it hands on before a fault
        record = formats._LongRecord(0, 0, options.text_column)
        return [x for ev in (*record.feed(rest[0]), *record.close()) if ev.__class__ is list for x in ev]
    record = json.loads(rest[0].decode("utf-8"))
    text = "\n\n".join(record[name] for name in options.text_column.split(",") if record.get(name))
    return [line for line in text.split("\n") if line.strip()]


def records_with_text(stream: bytes, column: str) -> int:
    """The JSON records of an undamaged stream whose joined text fields have a line the reader
    keeps: no lone surrogate (the record is bad), and in a record read as a stream, a line no
    longer than MAX_LINE_BYTES characters (a longer one is dropped)."""
    n = 0
    for raw in stream.split(b"\n"):
        try:
            record = json.loads(raw.decode("utf-8"))
        except Exception:  # not a record (POISONED): the reader's bad record
            continue
        if not isinstance(record, dict) or set(record) == {"index"}:
            continue
        text = "\n\n".join(record[k] for k in column.split(",") if isinstance(record.get(k), str) and record[k])
        streamed = len(raw) > formats.MAX_LINE_BYTES
        keep = [x for x in text.split("\n") if x.strip() and not (streamed and len(x) > formats.MAX_LINE_BYTES)]
        n += bool(keep) and not formats._SURROGATE.search(text)
    return n


FIELDS = ("id", "meta", "tail", "absent")  # what render() puts in JSON records (a string, an object), and none


def fields_at(stream: bytes, offset: int, fmt: str) -> dict:
    """The fields a document of the record at ``offset`` carries (``fields=id,meta,tail,absent``):
    its JSON object's values as text (``field_text``), all null where there is no object."""
    record = None
    if fmt in ("jsonl", "cirrus"):
        try:
            record = json.loads(stream[offset:].split(b"\n", 1)[0].decode("utf-8"))
        except ValueError:
            record = None
    return {name: field_text(record.get(name)) if isinstance(record, dict) else None for name in FIELDS}


def placed_items(data: bytes, fmt: str, compression: str, name: str, target: int, options: ReadOptions):
    """(document, place) of every item of the file, as workers read them with provenance=true."""
    if compression != "none":
        spans = [(0, len(data))]
    else:
        with open(os.path.join(_STORE, name), "wb") as f:
            f.write(data)
        spans = [(s, e) for s, e, _ in plan_ranges(LocalStore(_STORE), name, len(data), fmt, target)]
    out = []
    for start, end in spans:
        base = start if compression == "none" else 0
        places = Places(FIELDS)
        docs = iter_documents(io.BytesIO(data[start:end]), fmt, compression, name, base, Tally(), options)
        records = line_records(io.BytesIO(data[start:end]), fmt, compression, base, options, FIELDS)
        for doc in placed(docs, records, name, False, places):
            out.append((doc, places[-1]))
        assert [p.document for p in places] == list(range(len(places)))
    return out


def check_places(draw, fmt: str) -> None:
    max_doc = draw(st.sampled_from([4, 30, 4 << 20]))
    patches = [
        (formats, "MAX_DOCUMENT_CHARS", max_doc),
        (formats, "MAX_LINE_BYTES", draw(st.sampled_from([64, 300]))),
        (formats, "_BLOCK", draw(st.sampled_from([7, 64]))),
        (ranges, "_SCAN", draw(st.sampled_from([5, 64 << 10]))),
    ]
    saved = [(m, a, getattr(m, a)) for m, a, _ in patches]
    for m, a, v in patches:
        setattr(m, a, v)
    try:
        titles = fmt == "wikiextractor" and draw(st.booleans())
        r = render(fmt, draw(st.lists(lines, max_size=6)), draw, formats.MAX_LINE_BYTES, titles)
        data, _ = damage(r, draw) if draw(st.booleans()) else (r.data, set())
        whole = data == r.data
        compression = draw(st.sampled_from(["none", "none", "gz", "zst"]))
        name = FORMATS_NAMES[fmt]
        if compression != "none":
            name += "." + compression
            data = COMPRESS[compression](data)
            if data and draw(st.booleans()):
                data = data[: draw(st.integers(0, len(data) - 1))]  # a stream that breaks off
        # JSON: the text field, or (--text-column tail,text) the text joined after the string "tail"
        # that half the records hold after it: a long one's text is held until its record ends.
        column = draw(st.sampled_from(["text", "tail,text"])) if fmt in ("jsonl", "cirrus") else "text"
        options = ReadOptions(text_column=column, keep_titles=titles, max_bad_share=1.0)
        got = placed_items(data, fmt, compression, name, draw(st.integers(1, max(1, len(data)))), options)
        stream = stream_of(data, compression)
        previous = None
        for doc, place in got:
            assert place.offset is not None and place.file == name, (doc, place)
            record = record_at(stream, place.offset, fmt, options)
            if previous is not None and previous[0] == place.offset:  # the next part of one record
                used = previous[1]
            else:
                assert previous is None or place.offset > previous[0], (previous, place)
                used = 0
                if fmt == "text" and compression == "none" and place.offset not in (0, 3):
                    # a plain-text item may start inside a document longer than an item: its lines
                    assert stream[place.offset - 1 : place.offset] == b"\n"
            assert record[used : used + len(doc)] == doc, (record, used, doc)
            assert place.fields == fields_at(stream, place.offset, fmt), (place, doc)
            previous = (place.offset, used + len(doc))
        if "," in column and whole and compression == "none":  # every record with joined text is placed
            assert len({place.offset for _, place in got}) == records_with_text(stream, column)
    finally:
        for m, a, v in saved:
            setattr(m, a, v)


@pytest.mark.parametrize("fmt", list(FORMATS_NAMES))
@settings(max_examples=int(os.environ.get("PLACES_EXAMPLES", "60")), **FUZZ_SETTINGS)
@given(data=st.data())
def test_every_document_is_placed_at_its_record(fmt, data):
    check_places(data.draw, fmt)


# -- 2. which documents each block holds, as the BlockCutter cuts them -------------------------------


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), max_size=12),
    size=st.integers(2, 7),
    pad=st.booleans(),
    pack=st.booleans(),
    batches=st.integers(1, 3),
)
def test_block_sources_name_the_documents_each_block_holds(lengths, size, pad, pack, batches):
    opts = BlockOptions(size, eod_id=0, pad_id=-1, last_block="pad" if pad else "drop", pack_documents=pack)
    cutter, sources = BlockCutter(opts), BlockSources(opts)
    docs = [[1000 * (k + 1) + j for j in range(n)] for k, n in enumerate(lengths)]
    blocks, named = [], []
    cut = [len(docs) * i // batches for i in range(batches + 1)]
    for a, b in zip(cut, cut[1:]):
        blocks += list(cutter.add(docs[a:b]).ids)
        named += sources.add(lengths[a:b], list(range(a, b)))
    blocks += list(cutter.finish().ids)
    named += sources.finish()
    assert len(blocks) == len(named)
    # Who owns each position of the stream (a document's ids and its end token), and where a block
    # may start: anywhere a block_size apart when packed, else at that step within each document.
    owners = [k for k, d in enumerate(docs) if d for _ in range(len(d) + 1)]
    stream = [t for d in docs if d for t in (*d, 0)]
    if pack:
        starts = list(range(0, len(stream), size))
    else:
        starts, pos = [], 0
        for d in docs:
            if d:
                starts += range(pos, pos + len(d) + 1, size)
                pos += len(d) + 1
    at = 0
    for block, names in zip(blocks, named):
        real = [t for t in block.tolist() if t != -1]
        at = next(s for s in starts if s >= at and stream[s : s + len(real)] == real)
        assert names == list(dict.fromkeys(owners[at : at + len(real)])), (names, block)
        at += len(real)


# -- 3. fleet local runs: the sidecar leads back to the tokens -------------------------------------


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    docs = []
    for lang in ("en", "zh"):
        with open(os.path.join(ROOT, "corpus", f"sample_{lang}.txt"), encoding="utf-8") as f:
            docs += [
                [line for line in block.split("\n") if line.strip()][:5]
                for block in f.read().split("\n\n")
                if block.strip()
            ]
    return docs[:60]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, documents) -> list[str]:
    """The documents in three files: plain text, gzipped JSON Lines, Parquet of small row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.txt").write_text("".join("\n".join(d) + "\n\n" for d in documents[:20]), encoding="utf-8")
    with gzip.open(folder / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": k, "text": "\n".join(d)}) + "\n" for k, d in enumerate(documents[20:40]))
    pq.write_table(pa.table({"text": ["\n".join(d) for d in documents[40:]]}), folder / "c.parquet", row_group_size=4)
    return [str(folder / n) for n in ("a.txt", "b.jsonl.gz", "c.parquet")]


@pytest.fixture(scope="module")
def bpe_path(tmp_path_factory, documents) -> str:
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        ("\n".join(d) for d in documents), vocab_size=1200, special_tokens=["<|endoftext|>"], show_progress=False
    )
    path = str(tmp_path_factory.mktemp("bpe") / "tokenizer.json")
    tokenizer.save(path)
    return path


def local(inputs, out, settings_: dict[str, str]) -> None:
    console = Console(file=io.StringIO(), width=200)
    result = run_local(inputs, str(out), "causal_lm", 2, settings_, item_bytes=3_000, console=console, lease_ttl=20)
    assert result.exit_code == 0, console.file.getvalue()


def document_at(line: dict) -> list[str]:
    """The document a sidecar line names, read from the corpus at its place (not by the reader)."""
    path = line["file"]
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        text = pq.read_table(path).column("text")[line["row"]].as_py()
        return [x for x in text.split("\n") if x.strip()]
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    rest = data[line["offset"] :]
    if path.endswith(".txt"):
        assert line["offset"] == 0 or data[line["offset"] - 1 : line["offset"]] == b"\n"
        return rest.split(b"\n\n")[0].decode("utf-8").split("\n")
    return [x for x in json.loads(rest.split(b"\n")[0])["text"].split("\n") if x.strip()]


@pytest.fixture(scope="module")
def encode(bpe_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(bpe_path)
    eod = tok.token_to_id("<|endoftext|>")
    return lambda doc: [*tok.encode("\n".join(doc), add_special_tokens=False).ids, eod]


def sidecar(path: str) -> list[dict]:
    with open(path, encoding="ascii") as f:
        return [json.loads(line) for line in f]


def output_files(out) -> dict[str, bytes]:
    names = sorted(p for p in glob.glob(os.path.join(str(out), "part-*")) if not p.endswith(PROVENANCE_SUFFIX))
    return {os.path.basename(p): open(p, "rb").read() for p in names}


def test_each_sequence_of_output_megatron_is_traced_to_its_document(tmp_path, corpus, bpe_path, encode, documents):
    local(corpus, tmp_path / "on", {"tokenizer_file": bpe_path, "output": "megatron", "provenance": "true"})
    local(corpus, tmp_path / "off", {"tokenizer_file": bpe_path, "output": "megatron"})
    assert output_files(tmp_path / "on") == output_files(tmp_path / "off")  # provenance changes no output
    assert not glob.glob(str(tmp_path / "off" / ("*" + PROVENANCE_SUFFIX)))
    found, files = [], set()
    for bin_path in sorted(glob.glob(str(tmp_path / "on" / "part-*.bin"))):
        prefix = bin_path[:-4]
        with open(prefix + ".idx", "rb") as f:
            sequences = read_sequences(bin_path, f.read(), "megatron", 1200)
        lines = sidecar(prefix + PROVENANCE_SUFFIX)
        assert len(lines) == len(sequences) > 0
        assert [line["document"] for line in lines] == list(range(len(lines)))  # no document is empty
        for line, sequence in zip(lines, sequences):
            doc = document_at(line)
            assert encode(doc) == sequence.tolist(), line
            found.append(doc)
            files.add(os.path.basename(line["file"]))
    assert files == {"a.txt", "b.jsonl.gz", "c.parquet"}
    assert sorted(map(tuple, found)) == sorted(map(tuple, documents))  # each document once


@pytest.mark.parametrize("output,pack", [("tfrecord", False), ("parquet", True)])
def test_each_block_is_traced_to_the_documents_it_holds(tmp_path, corpus, bpe_path, encode, output, pack):
    settings_ = {
        "tokenizer_file": bpe_path,
        "output": output,
        "max_seq_length": "24",
        "pack_documents": str(pack).lower(),
    }
    local(corpus, tmp_path / "on", {**settings_, "provenance": "true"})
    local(corpus, tmp_path / "off", settings_)
    assert output_files(tmp_path / "on") == output_files(tmp_path / "off")
    suffix = ".parquet" if output == "parquet" else ".tfrecord"
    spanning = 0
    for path in sorted(glob.glob(str(tmp_path / "on" / ("part-*" + suffix)))):
        with open(path, "rb") as f:
            rows = examples(f.read(), suffix)
        lines = sidecar(path[: -len(suffix)] + PROVENANCE_SUFFIX)
        assert len(lines) == len(rows) > 0
        for line, row in zip(lines, rows):
            ids = (
                [i for i, m in zip(row["input_ids"], row["attention_mask"]) if m]
                if "attention_mask" in row
                else row["input_ids"]
            )
            spans = line.get("spans", [line])
            assert spans[0] == {k: v for k, v in line.items() if k != "spans"}
            spanning += len(spans) > 1
            stream = [t for span in spans for t in encode(document_at(span))]
            assert any(stream[i : i + len(ids)] == ids for i in range(len(stream) - len(ids) + 1)), line
            if not pack:
                assert len(spans) == 1
    assert spanning or not pack


def test_provenance_refuses_shards_and_dedup_in_one_line(bpe_path):
    for output in ("tfrecord", "megatron"):
        config = CausalLMConfig(tokenizer_file=bpe_path, output=output, provenance=True)
        with pytest.raises(ConfigError, match=r"^option provenance: not with --shards"):
            JOB.stages(config, StageOptions(4, ""), 3)
        with pytest.raises(ConfigError, match=r"^option provenance: not with --dedup"):
            JOB.stages(config, StageOptions(0, "exact"), 3)
        assert JOB.stages(CausalLMConfig(tokenizer_file=bpe_path, output=output), StageOptions(4, ""), 3)


def test_places_of_a_parquet_item_count_rows_from_the_file_start(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fleet_jobs.text.inputs import plan_slices, read_slice

    texts = [f"row {i}\nsecond" if i % 3 else ("" if i % 2 else None) for i in range(30)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "x.parquet", row_group_size=7)
    seen = []
    for piece in plan_slices([str(tmp_path / "x.parquet")], 1):
        places = []
        for doc in read_slice(piece, str(tmp_path), places=places):
            seen.append((doc, places[-1].row))
    assert len({piece for piece in plan_slices([str(tmp_path / "x.parquet")], 1)}) > 1
    assert seen == [([f"row {i}", "second"], i) for i in range(30) if i % 3]
    assert np.all(np.diff([row for _, row in seen]) > 0)


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory, documents) -> str:
    from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab

    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    write_vocab(train_vocab((line for d in documents for line in d), 2000), path)
    return path


@pytest.mark.parametrize("sentences", [False, True])
def test_each_electra_example_is_traced_to_its_document(tmp_path, corpus, vocab_path, sentences):
    from fleet_jobs.text.sentences import split_lines
    from fleet_jobs.text.tokenizers.tokenization import BertTokenizer

    settings_ = {"vocab_file": vocab_path, "max_seq_length": "32", "split_sentences": str(sentences).lower()}
    for name, extra in (("on", {"provenance": "true"}), ("off", {})):
        console = Console(file=io.StringIO(), width=200)
        result = run_local(
            corpus,
            str(tmp_path / name),
            "electra_zh_en",
            2,
            {**settings_, **extra},
            item_bytes=3_000,
            console=console,
            lease_ttl=20,
        )
        assert result.exit_code == 0, console.file.getvalue()
    assert output_files(tmp_path / "on") == output_files(tmp_path / "off")
    # The run's readers read the examples and pass the sidecars by.
    from fleet.core.follow import follow_examples

    assert (
        sum(1 for _ in follow_examples(str(tmp_path / "on")))
        == sum(1 for _ in follow_examples(str(tmp_path / "off")))
        > 0
    )
    bert = BertTokenizer.from_file(vocab_path)
    cls, sep = bert.vocab["[CLS]"], bert.vocab["[SEP]"]
    paths = sorted(glob.glob(str(tmp_path / "on" / "part-*.tfrecord")))
    assert len(paths) > 3
    for path in paths:
        with open(path, "rb") as f:
            rows = examples(f.read(), ".tfrecord")
        lines = sidecar(path[: -len(".tfrecord")] + PROVENANCE_SUFFIX)
        assert len(lines) == len(rows) > 0
        for line, row in zip(lines, rows):
            doc = document_at(line)
            pieces = [ids for ids in bert.tokenize_lines(split_lines(doc) if sentences else doc) if ids]
            ids = [t for t, m in zip(row["input_ids"], row["input_mask"]) if m]
            assert ids[0] == cls and ids[-1] == sep
            segments, part = [], []
            for t in ids[1:]:
                if t == sep:
                    segments.append(part)
                    part = []
                else:
                    part.append(t)
            for segment in segments:  # each the ids of some of the document's lines, in order (the last cut)
                assert of_lines(segment, pieces), (line, segment, pieces)


def of_lines(segment: list[int], lines: list[list[int]], at: int = 0, line: int = 0) -> bool:
    """Whether ``segment`` is the ids of lines of ``lines`` taken in order, the last maybe cut short."""
    if at == len(segment):
        return True
    rest = segment[at:]
    return any(
        rest == ids[: len(rest)] or rest[: len(ids)] == ids and of_lines(segment, lines, at + len(ids), j + 1)
        for j, ids in enumerate(lines[line:], line)
    )


def test_electra_provenance_refuses_what_mixes_documents(vocab_path):
    from fleet_jobs.electra_zh_en import JOB as ELECTRA

    def check(**values):
        config = ELECTRA.parse_config({"vocab_file": vocab_path, "provenance": True, **values})
        ELECTRA.check(config, None)

    with pytest.raises(ConfigError, match=r"^option provenance: not with pack_documents"):
        check(pack_documents=True)
    from fleet.core.discovery import load_configured

    with pytest.raises(ConfigError, match=r"^option provenance: not with format=bert \(job bert has no option"):
        load_configured("electra_zh_en", {"vocab_file": vocab_path, "provenance": True, "format": "bert"})
