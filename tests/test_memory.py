"""Issue 17 (d): a worker's memory is bounded by a constant, not by the document.

Measured structurally, so that a loaded machine cannot make these flaky: ``tracemalloc``
counts what Python allocates (strings, lists, ints, numpy arrays; not pyarrow's own
buffers), and its peak while a document is read or tokenized must stay far below the
document's size. The part size (MAX_DOCUMENT_CHARS) and the line limit are made small
here, so a document of a few MB is "huge"; the property tests hold the streamed Parquet
reader to the documents and tally the whole-row reading gave.
"""

from __future__ import annotations

import pathlib
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fleet.core.store import open_store
from fleet_jobs.text.inputs import formats, parquet
from fleet_jobs.text.inputs.formats import Bad, ReadOptions, Tally, checked

ROOT = pathlib.Path(__file__).resolve().parent.parent


def write_rows(path, rows: list[bytes | None], row_group_size: int = 1 << 20) -> None:
    """A Parquet file of one string column; rows may be invalid UTF-8 (written as is)."""
    array = pa.array(rows, pa.binary()).view(pa.string())
    pq.write_table(
        pa.table({"text": array}), str(path), row_group_size=row_group_size, compression="zstd", use_dictionary=False
    )


def read_rows(path, tally: Tally | None = None) -> list[list[str]]:
    return list(stream_rows(path, tally))


def stream_rows(path, tally: Tally | None = None):
    store = open_store(str(path.parent))
    size = path.stat().st_size
    groups = parquet.row_groups(store, path.name, size, None, "text", str(path))
    return parquet.parquet_documents(
        store, path.name, size, None, 0, len(groups), str(path), tally if tally is not None else Tally(), ReadOptions()
    )


def expected(rows: list[bytes | None], tally: Tally) -> list[list[str]]:
    """What reading each row whole gives: its non-blank lines, cut by ``checked``; a row that is
    null, not UTF-8 or holds a line over MAX_LINE_BYTES is one bad record."""

    def docs():
        for number, row in enumerate(rows, 1):
            if row is None:
                yield Bad(-1, f"row {number} has no text in column 'text'")
                continue
            try:
                text = row.decode("utf-8")
            except UnicodeDecodeError:
                yield Bad(-1, f"row {number}: invalid UTF-8")
                continue
            if max(map(len, row.split(b"\n"))) > formats.MAX_LINE_BYTES:
                yield Bad(-1, f"row {number}: a line longer than ...")
                continue
            lines = [line for line in text.split("\n") if line.strip()]
            if lines:
                yield lines

    return list(checked(docs(), "x", tally, ReadOptions(max_bad_share=1.0), ""))


@pytest.fixture
def small_limits(monkeypatch):
    """Parts of 50 characters, lines of at most 200 bytes, windows of 16 bytes, batches of 3 rows."""
    monkeypatch.setattr(formats, "MAX_DOCUMENT_CHARS", 50)
    monkeypatch.setattr(parquet, "MAX_DOCUMENT_CHARS", 50, raising=False)
    monkeypatch.setattr(formats, "MAX_LINE_BYTES", 200)
    monkeypatch.setattr(parquet, "MAX_LINE_BYTES", 200, raising=False)
    monkeypatch.setattr(parquet, "_WINDOW", 16, raising=False)
    monkeypatch.setattr(parquet, "_BATCH", 3, raising=False)


# -- Parquet: a long row is streamed, never made one string --------------------------------------
def test_a_long_parquet_row_is_never_one_python_string(tmp_path, monkeypatch):
    """Issue 17: one 60 MB Parquet row took 731 MiB: to_pylist made the row one string, then
    split it into a list of lines, before cutting it into parts. Here a row of 16 MB with parts
    of 64 Ki characters: what Python holds at any time stays near a part, not near the row
    (before: 60 MiB; now: 2 MiB)."""
    monkeypatch.setattr(formats, "MAX_DOCUMENT_CHARS", 1 << 16)
    monkeypatch.setattr(parquet, "MAX_DOCUMENT_CHARS", 1 << 16, raising=False)
    monkeypatch.setattr(parquet, "_WINDOW", 1 << 16, raising=False)
    line = "Parquet 行的文字 line of text, 中文和 English mixed " * 3
    row = "\n".join(f"{n} {line}" for n in range(16_000_000 // len(line.encode()))).encode()
    write_rows(tmp_path / "big.parquet", [b"a short row", row, b"another"])
    del row
    tally = Tally()
    tracemalloc.start()
    try:
        count = chars = 0
        for doc in stream_rows(tmp_path / "big.parquet", tally):
            count += 1
            chars += sum(map(len, doc))
            del doc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count > 100 and tally.documents == 3 and tally.documents_cut == 1
    assert peak < 12 << 20, f"reading the row held {peak / 2**20:.1f} MiB of Python objects at once"


def test_a_bad_parquet_row_costs_that_row_only(tmp_path, small_limits):
    """A null row, a row that is not UTF-8 (short, or long and streamed) and a long row with an
    over-long line are each one bad record named by its row; the rows around them are read."""
    rows = [
        b"one",
        None,
        b"two \xff bad",
        b"three",
        ("x" * 60 + "\n").encode() * 3 + b"\xe4\xb8",
        b"y" * 300,
        "四 five".encode(),
    ]
    tally = Tally()
    docs = read_rows_all(tmp_path, rows, tally)
    assert docs == [["one"], ["three"], ["四 five"]]
    assert tally.bad == 4 and tally.documents == 3
    assert [e.split(": ", 1)[1].split(" ")[:2] for e in tally.examples] == [
        ["row", "2"],
        ["row", "3:"],
        ["row", "5:"],
        ["row", "6:"],
    ]


def read_rows_all(tmp_path, rows, tally, row_group_size=1 << 20):
    path = tmp_path / "rows.parquet"
    write_rows(path, rows, row_group_size)
    store = open_store(str(tmp_path))
    size = path.stat().st_size
    groups = parquet.row_groups(store, path.name, size, None, "text", str(path))
    return list(
        parquet.parquet_documents(
            store, path.name, size, None, 0, len(groups), str(path), tally, ReadOptions(max_bad_share=1.0)
        )
    )


_LINE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40) | st.sampled_from(["", " ", "\t", "\u3000"])


@st.composite
def parquet_rows(draw) -> list[bytes | None]:
    rows = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["text", "text", "text", "null", "bad", "longline"]))
        if kind == "null":
            rows.append(None)
            continue
        lines = draw(st.lists(_LINE, max_size=draw(st.sampled_from([3, 12]))))
        if kind == "longline":
            lines.insert(draw(st.integers(0, len(lines))), "z" * draw(st.integers(150, 260)))
        data = "\n".join(lines).encode()
        if kind == "bad":
            at = draw(st.integers(0, len(data)))
            data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xe4\xb8"])) + data[at:]
        rows.append(data)
    return rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=parquet_rows(), row_group_size=st.integers(1, 6))
def test_streamed_parquet_rows_are_the_documents_whole_rows_give(tmp_path, small_limits, rows, row_group_size):
    """Invariants (a), (b), (d) for Parquet: the streamed reader yields exactly the parts of each
    row that reading it whole and cutting it gives (same lines, same parts, same order), counts
    each row once (cut once when cut), and each bad row as one bad record."""
    want_tally, got_tally = Tally(), Tally()
    want = expected(rows, want_tally)
    got = read_rows_all(tmp_path, rows, got_tally, row_group_size)
    assert got == want
    assert all(sum(map(len, doc)) <= 50 or len(doc) == 1 for doc in got)
    assert (got_tally.documents, got_tally.documents_cut, got_tally.bad) == (
        want_tally.documents,
        want_tally.documents_cut,
        want_tally.bad,
    )


# -- causal_lm: a document's ids are arrays, not lists of Python ints -------------------------------
def test_causal_lm_tokenizes_a_long_document_into_arrays(tmp_path):
    """causal_lm encoded a document as lists of Python ints (over 36 bytes a token: 150 MB for a
    part of 4 Mi Chinese characters); now as int32 arrays, a group of lines at a time (before:
    26 MiB for this document of 500,000 tokens; now: 6 MiB)."""
    from fleet_jobs.causal_lm import tokenizer as module
    from fleet_jobs.causal_lm.tokenizer import from_bert
    from fleet_jobs.text.tokenizers import native
    from fleet_jobs.text.tokenizers.tokenization import BertTokenizer

    if native.available() is None:
        pytest.skip("the C tokenizer core is not built here (in Python, tokenizing holds its tokens as strings)")

    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 500)]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"[unused{i}]" for i in range(300)] + chars) + "\n",
        encoding="utf-8",
    )
    tokenizer = from_bert(BertTokenizer.from_file(str(vocab)), str(vocab), "", "")
    rng = np.random.default_rng(1)
    document = ["".join(rng.choice(chars, 100)) for _ in range(5000)]  # 500,000 tokens, ids 305..804
    tokenizer.encode([document[:10]])  # warm up caches outside the measure
    tracemalloc.start()
    try:
        [ids] = tokenizer.encode([document])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ids) == 500_000 and min(ids) >= 305
    assert getattr(module, "LINE_GROUP_CHARS", 1 << 18) <= 1 << 18
    assert peak < 12 << 20, f"tokenizing the document held {peak / 2**20:.1f} MiB of Python objects at once"


# -- the bert job, dupe_factor > 1: the item's kept token ids ------------------------------------
def test_bert_keeps_at_most_64_mb_of_an_items_token_ids_in_memory():
    """dupe_factor > 1 keeps the item's token ids (about 4 bytes a token) to build its examples
    again. A compressed file is one item however big, so they spill to a file beyond a limit;
    at 256 MB that limit alone was most of the 300 MB a worker may take."""
    from fleet_jobs.bert.spill import SpillingBatches

    assert SpillingBatches().limit <= 64 << 20


def test_causal_lm_tokenizer_json_ids_are_encode_batchs(tmp_path):
    """A tokenizer.json encodes without offsets (``encode_batch_fast``: 860 MB at the peak of a
    4 Mi-character part with them, 718 without): the ids must be encode_batch's, byte for byte."""
    from tokenizers import ByteLevelBPETokenizer, Tokenizer

    from fleet_jobs.causal_lm.tokenizer import from_json

    samples = [str(ROOT / "corpus" / f"sample_{lang}.txt") for lang in ("zh", "en")]
    bpe = ByteLevelBPETokenizer()
    bpe.train(samples, vocab_size=2000, show_progress=False, special_tokens=["<|endoftext|>"])
    bpe.save(str(tmp_path / "bpe.json"))
    tokenizer = Tokenizer.from_file(str(tmp_path / "bpe.json"))
    documents = []
    for path in samples:
        with open(path, encoding="utf-8") as f:
            documents += [[line for line in block.split("\n") if line.strip()] for block in f.read().split("\n\n")]
    documents = [d for d in documents if d][:60] + [["  leading spaces", "trailing  ", "\tend\t", "中文 mixed"]]
    want = [e.ids for e in tokenizer.encode_batch(["\n".join(d) for d in documents], add_special_tokens=False)]
    got = from_json(tokenizer, "bpe.json", "", "").encode(documents)
    assert got == want
