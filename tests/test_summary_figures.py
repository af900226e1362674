"""Every figure a run's summary gives is named in the docs' table of them (docs/outputs.md, "Every
figure of the summary"), and every key that table names is one the code gives: a counter added to
a job, a stage or the core without a word on what it counts fails here.

One small run of each job and stage, over inputs made to reach the rarer counters too: a bad JSON
record, junk after a gzip stream, a document longer than an item, a grouped file that cannot be
read, a hidden file a command leaves, exact and near copies."""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

import pytest

import fleet
from tests.helpers.trained import bpe_json, wordpiece_vocab

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Every figure of the summary"
# Documented, and reached only by runs too large for a test here: a combine step (thousands of map
# items), and a chain of near copies deeper than 2**5 links.
NOT_REACHED = {"combined_records", "near_chains_unresolved"}


def documented() -> set[str]:
    text = (ROOT / "docs" / "outputs.md").read_text()
    assert SECTION in text
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for row in re.findall(r"^\| (`[^|]+`) \|", section, re.M):
        keys.update(re.findall(r"`([a-z_]+)`", row))
    return keys


def english(n: int) -> list[str]:
    lines = (ROOT / "corpus" / "sample_en.txt").read_text().splitlines()
    return [line for line in lines if line.strip()][:n]


def documents(rng: random.Random) -> list[list[str]]:
    lines = english(400)
    docs = [lines[i : i + 8] for i in range(0, 320, 8)]
    docs.append(list(docs[3]))  # an exact copy
    near = list(docs[5])
    near[2] = near[2] + " and one more"
    docs.append(near)  # a near copy
    rng.shuffle(docs)
    return docs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("figures")
    rng = random.Random(5)
    docs = documents(rng)
    corpus = base / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n\n".join("\n".join(d) for d in docs[:30]) + "\n")
    records = [json.dumps({"text": "\n".join(d)}) for d in docs[30:36]]
    records.insert(2, '{"text": "a record cut short')  # a bad record
    (corpus / "b.jsonl").write_text("\n".join(records) + "\n")
    (corpus / "c.txt.gz").write_bytes(
        gzip.compress(("\n\n".join("\n".join(d) for d in docs[36:]) + "\n").encode()) + b"junk after the stream"
    )
    long_one = base / "long"
    long_one.mkdir()
    (long_one / "one.txt").write_text("\n".join(english(400)) + "\n")  # one document of 30+ kB
    small = base / "small"
    small.mkdir()
    for i, d in enumerate(docs[:12]):
        (small / f"f{i:02d}.txt").write_text("\n".join(d) + "\n")
    (small / "f05.txt").write_bytes(bytes(rng.randrange(128, 256) for _ in range(300)))  # no line is UTF-8
    tokenizers = base / "tokenizers"
    tokenizers.mkdir()
    vocab = wordpiece_vocab(docs, str(tokenizers), 800)
    bpe = bpe_json(docs, str(tokenizers), 600)
    return {"corpus": corpus, "long": long_one, "small": small, "vocab": Path(vocab), "bpe": Path(bpe), "base": base}


def runs(i: dict[str, Path]) -> dict[str, dict]:
    electra = {"job": "electra_zh_en", "options": {"vocab_file": str(i["vocab"])}}
    lm = {"job": "causal_lm", "options": {"tokenizer_file": str(i["bpe"])}}
    blocks = {"job": "causal_lm", "options": {"tokenizer_file": str(i["bpe"]), "max_seq_length": "64"}}
    return {
        "electra": {"inputs": [i["corpus"]], **electra},
        "electra_long": {"inputs": [i["long"]], "item_mb": 0.01, **electra},
        "electra_small_files": {"inputs": [i["small"]], **electra},
        "bert": {"inputs": [i["corpus"]], "job": "bert", "options": {"vocab_file": str(i["vocab"])}},
        "causal_lm": {"inputs": [i["corpus"]], **{**blocks, "options": {**blocks["options"], "last_block": "drop"}}},
        "causal_lm_megatron": {"inputs": [i["corpus"]], **{**lm, "options": {**lm["options"], "output": "megatron"}}},
        "shards": {"inputs": [i["corpus"]], "shards": 2, **blocks},
        "dedup_exact": {"inputs": [i["corpus"]], "dedup": "exact", **electra},
        "dedup_near": {"inputs": [i["corpus"]], "dedup": "near", **electra},
        "command": {
            "inputs": [i["corpus"]],
            "job": "command",
            "options": {"command": "cp {input} {output}/copy && touch {output}/.left"},
        },
    }


def summaries(inputs: dict[str, Path]) -> dict[str, dict]:
    out = {}
    for name, kwargs in runs(inputs).items():
        run = fleet.local(output=inputs["base"] / f"out-{name}", workers=1, **kwargs)
        assert run.status.done == run.status.items, (name, run.status.failures)
        out[name] = run.summary
    return out


def test_the_docs_table_names_every_figure_of_every_summary_and_no_other(inputs):
    """Both ways: each run's keys are in the table, and each key in the table came out of one of
    the runs (but the two that need a larger run, which the code must still spell), so the table is
    neither short of a figure nor holding one that is gone. (One test: the runs are made once.)"""
    table = documented()
    given = summaries(inputs)
    for name, summary in given.items():
        missing = sorted(set(summary) - table)
        assert not missing, f"{name}: summary.json keys the docs do not name ({SECTION}): {missing}"
    assert table - set().union(*given.values()) == NOT_REACHED
    source = "\n".join(p.read_text() for d in ("fleet", "fleet_jobs") for p in (ROOT / d).rglob("*.py"))
    for key in NOT_REACHED:
        assert re.search(rf"\b{key}\b", source), key
