"""``fields=url,id`` (issue 33 item 3): input fields carried into the Parquet and MDS columns and
the provenance sidecar, through real ``fleet local`` runs over JSON Lines and Parquet inputs.

The truth is the input itself: each record's fields, looked up by where the sidecar says the
example's documents come from (a place is checked against its record in tests/test_provenance.py,
where a property also checks that every place carries its own record's fields).
"""

from __future__ import annotations

import glob
import io
import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from fleet.cli.local import run_local
from fleet.job import ConfigError, StageOptions, load_job
from fleet_jobs.text.inputs.places import field_text
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.test_mds import streaming_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SURROGATES = re.compile("[\ud800-\udfff]")


def documents(lang: str) -> list[str]:
    with open(os.path.join(ROOT, "corpus", f"sample_{lang}.txt"), encoding="utf-8") as f:
        return ["\n".join(b.split("\n")[:6]) for b in f.read().split("\n\n") if b.strip()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A JSON Lines file (every 7th record without a url), a Parquet file with url and id columns,
    one without a url column; and the truth: (file, offset or row) -> {url, id} as text."""
    folder = tmp_path_factory.mktemp("fields")
    truth: dict[tuple[str, int], dict] = {}
    en, zh = documents("en"), documents("zh")
    path = str(folder / "a.jsonl")
    with open(path, "wb") as f:
        for i, text in enumerate(en):
            record = {"text": text, "id": i} | ({} if i % 7 == 0 else {"url": f"https://en/{i}"})
            if i == 5:  # half a surrogate pair, escaped: no UTF-8 output holds it, so U+FFFD
                record["url"] = "https://en/5\ud800"
            url = record.get("url")
            truth[(path, f.tell())] = {"url": url.replace("\ud800", "\ufffd") if url else None, "id": str(i)}
            f.write(json.dumps(record, ensure_ascii=i == 5).encode() + b"\n")
    b = str(folder / "b.parquet")
    pq.write_table(
        pa.table({"text": zh[:30], "url": [f"https://zh/{i}" for i in range(30)], "id": list(range(100, 130))}),
        b,
        row_group_size=9,
    )
    truth.update({(b, i): {"url": f"https://zh/{i}", "id": str(100 + i)} for i in range(30)})
    c = str(folder / "c.parquet")
    pq.write_table(pa.table({"text": zh[30:40], "id": [f"z{i}" for i in range(10)]}), c)
    truth.update({(c, i): {"url": None, "id": f"z{i}"} for i in range(10)})
    vocab = str(folder / "vocab.txt")
    write_vocab(train_vocab((line for t in en + zh for line in t.split("\n")), 3000), vocab)
    return [path, b, c], vocab, truth


def run(corpus, out, job: str, stages: StageOptions = StageOptions(), **settings) -> None:
    inputs, vocab, _ = corpus
    console = Console(file=io.StringIO(), width=200)
    values = {"vocab_file": vocab, "max_seq_length": "64", **{k: str(v) for k, v in settings.items()}}
    result = run_local(inputs, str(out), job, 2, values, item_bytes=8_000, console=console, stage_options=stages)
    assert result.exit_code == 0, console.file.getvalue()


def rows(out) -> list[dict]:
    """Every row of a run's Parquet outputs, with its sidecar line when there is one, in output order."""
    got = []
    for path in sorted(glob.glob(os.path.join(str(out), "part-*.parquet"))):
        table = pq.read_table(path).to_pylist()
        sidecar = path[: -len(".parquet")] + ".provenance.jsonl"
        lines = open(sidecar).read().splitlines() if os.path.exists(sidecar) else [None] * len(table)
        assert len(lines) == len(table)
        got += [{**row, "_place": json.loads(line) if line else None} for row, line in zip(table, lines)]
    assert got
    return got


def spans(place: dict) -> list[dict]:
    return place.get("spans", [place])


def truth_of(corpus, place: dict) -> dict:
    return corpus[2][(place["file"], place["offset"] if "offset" in place else place["row"])]


@pytest.mark.parametrize("job, pack", [("causal_lm", False), ("causal_lm", True), ("electra_zh_en", False)])
def test_each_row_carries_the_fields_of_the_documents_it_holds(corpus, tmp_path, job, pack):
    settings = {"pack_documents": str(pack).lower()}
    run(corpus, tmp_path / "f", job, output="parquet", provenance="true", fields="url,id", **settings)
    run(corpus, tmp_path / "plain", job, output="parquet", **settings)
    carried, plain = rows(tmp_path / "f"), rows(tmp_path / "plain")
    several = 0
    for row in carried:
        sources = spans(row["_place"])
        want = [truth_of(corpus, p) for p in sources]
        assert row["url"] == [w["url"] for w in want] and row["id"] == [w["id"] for w in want], row["_place"]
        assert [p["fields"] for p in sources] == want  # the sidecar carries them too
        several += len(sources) > 1
    assert several if pack else not several
    assert {r["url"][0] for r in carried} >= {None, "https://en/1", "https://zh/3", "https://en/5\ufffd"}
    # Carrying fields changes nothing else: the same examples as the run without them.
    assert len(carried) == len(plain)
    for a, b in zip(carried, plain):
        assert {k: v for k, v in a.items() if k not in ("url", "id", "_place")} == {
            k: v for k, v in b.items() if k != "_place"
        }


def test_mds_rows_carry_the_fields_as_parquets_do(corpus, tmp_path):
    run(corpus, tmp_path / "p", "causal_lm", output="parquet", pack_documents="true", fields="url,id")
    run(corpus, tmp_path / "m", "causal_lm", output="mds", pack_documents="true", fields="url,id", compression="zstd")
    assert not glob.glob(os.path.join(str(tmp_path / "p"), "*.provenance.jsonl"))  # fields alone: no sidecar
    want = rows(tmp_path / "p")
    got = streaming_rows(tmp_path / "m", tmp_path)
    assert int(got["__length__"]) == len(want)
    for i, row in enumerate(want):
        np.testing.assert_array_equal(got["input_ids"][i], row["input_ids"])
        assert list(got["url"][i]) == row["url"] and list(got["id"][i]) == row["id"]


def test_fields_go_where_there_is_room_for_them_else_one_line_at_plan_time(corpus):
    _, vocab, _ = corpus
    lm, electra = load_job("causal_lm"), load_job("electra_zh_en")
    refused = {
        "output=tfrecord has no columns": (lm, {"fields": "url"}),
        "output=megatron has no columns": (lm, {"fields": "url", "output": "megatron"}),
        "names an empty field": (lm, {"fields": "url,,id", "output": "parquet"}),
        "names a field twice": (lm, {"fields": "url,url", "output": "parquet"}),
        "'input_ids' is the name of one of the examples' features": (lm, {"fields": "input_ids", "output": "mds"}),
        "option fields: not with pack_documents": (
            electra,
            {"fields": "url", "output": "parquet", "pack_documents": "true"},
        ),
    }
    for message, (job, options) in refused.items():
        with pytest.raises(ConfigError, match=message) as e:
            job.check(job.parse_config({"vocab_file": vocab, **options}), lambda p: open(p, "rb").read())
        assert "\n" not in str(e.value)
    config = lm.parse_config({"vocab_file": vocab, "fields": "url", "output": "parquet"})
    for stages, why in ((StageOptions(2, ""), "--shards"), (StageOptions(0, "exact"), "--dedup")):
        with pytest.raises(ConfigError, match=f"^option fields: not with {why}"):
            lm.stages(config, stages, 3)
    # Where the sidecar takes them, a format with no columns is fine.
    lm.check(
        lm.parse_config({"vocab_file": vocab, "fields": "url", "output": "megatron", "provenance": "true"}),
        lambda p: open(p, "rb").read(),
    )


_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSON)
def test_every_field_value_becomes_text_that_any_utf8_output_holds(value):
    """The invariant half a surrogate pair broke (a Parquet item failed on it): whatever JSON value a
    record's field holds, its text encodes as UTF-8 (Parquet strings, MDS json, the sidecar), a
    string without surrogates is carried as it is, and any other value as its JSON."""
    text = field_text(value)
    if value is None:
        assert text is None
        return
    assert isinstance(text, str)
    text.encode("utf-8")  # strict: no lone surrogate left
    pa.array([[text]], pa.list_(pa.string()))
    whole = not _SURROGATES.search(json.dumps(value, ensure_ascii=False))
    if isinstance(value, str) and whole:
        assert text == value
    elif whole:
        assert json.loads(text) == value
