"""``--dedup near`` (issue 32): the signatures (fleet_jobs.text.stages.near), the stages' records
(fleet_jobs.text.stages.clusters) held to a brute-force forest, and real ``fleet local`` runs
over a corpus with planted copies, held to exact Jaccard computed pair by pair.

The corpus: distinct base documents of random words (no two near each other), then planted near
copies (1% of the words changed), look-alikes (40% changed), exact copies, a page copied 30
times, and documents shorter than a shingle; shuffled, in three files.
"""

from __future__ import annotations

import glob
import io
import json
import os
import random
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from fleet.cli.local import LocalResult, run_local
from fleet.core.stage import item_key, item_span
from fleet.job import ConfigError, StageOptions, load_job
from fleet_jobs.text.stages import clusters, near
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab

THRESHOLD = 0.8


# -- words, shingles, signatures -------------------------------------------------------------------


def test_words_fold_case_width_punctuation_and_digits_and_split_cjk():
    assert near.words("Hello, WORLD! ８０８ apples_and 3.14") == ["hello", "world", "0", "apples", "and", "0", "0"]
    assert near.words("東京は2024年。Ｅｎｇｌｉｓｈ") == ["東", "京", "は", "0", "年", "english"]
    assert near.words(" ... --- ") == []


def test_a_document_shorter_than_a_shingle_is_one_shingle_of_all_its_words():
    assert len(near.shingles("three short words", 5)) == 1
    assert np.array_equal(near.shingles("Three, short WORDS!", 5), near.shingles("three short words", 5))
    assert not np.array_equal(near.shingles("three short words", 5), near.shingles("three short verbs", 5))
    assert len(near.shingles("!!!", 5)) == 0


def _word(n: int) -> str:
    """A word of letters for a number (digits would all read as one word: ``near.words`` folds them)."""
    out = ""
    while True:
        n, r = divmod(n, 26)
        out += chr(97 + r)
        if not n:
            return out


@given(st.text(st.characters(codec=None, exclude_categories=()), max_size=200), st.integers(1, 7))
@settings(max_examples=300)
def test_the_shingles_of_the_numpy_path_are_those_of_the_words_one_by_one(text, ngram):
    """``shingles`` classes code points and hashes every word at once; ``words`` + ``word_hash`` is
    the definition: over any text (every script, digits, marks, surrogates) the sets are equal."""
    assert np.array_equal(near.shingles(text, ngram), near.word_shingles(near.words(text), ngram))


def test_the_numpy_path_on_the_sample_corpus_and_words_made_of_digits_and_scripts():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("sample_en.txt", "sample_zh.txt"):
        text = open(os.path.join(root, "corpus", name), encoding="utf-8").read()[:200_000]
        assert np.array_equal(near.shingles(text, 5), near.word_shingles(near.words(text), 5))
    for text in ("i18n w123 ab1c2 ½ 東京は2024年 ٣٤abc 𠀀𠀁 x", "1 2 3", "-", "a"):
        assert np.array_equal(near.shingles(text, 3), near.word_shingles(near.words(text), 3)), text


@given(st.lists(st.text(st.characters(codec=None, exclude_categories=()), max_size=60), max_size=12), st.integers(1, 6))
@settings(max_examples=200)
def test_a_batch_of_texts_gets_the_signatures_of_each_text_alone(texts, ngram):
    """``signatures`` signs a batch in a few array operations: each text's signature (and word
    count) is the one it gets alone, wherever it sits in the batch; a text with no word gets None."""
    sigs, counts = near.signatures(texts, ngram, 24)
    for text, sig, count in zip(texts, sigs, counts):
        alone = near.shingles(text, ngram)
        assert count == len(near.words(text))
        assert (sig is None) == (len(alone) == 0)
        if sig is not None:
            assert np.array_equal(sig, near.signature(alone, 24))


def test_a_long_text_in_a_batch_is_signed_in_chunks_like_alone(monkeypatch):
    monkeypatch.setattr(near, "_CHUNK", 50)
    texts = [" ".join(_random_words(random.Random(i), n)) for i, n in enumerate((3, 400, 20, 1000, 2))]
    sigs, _ = near.signatures(texts, 5, 112)
    assert all(np.array_equal(sig, near.signature(near.shingles(t, 5), 112)) for t, sig in zip(texts, sigs))


def _random_words(rng: random.Random, n: int, vocabulary: int = 5000) -> list[str]:
    return [_word(rng.randrange(vocabulary)) for _ in range(n)]


@given(st.integers(0, 2**32 - 1), st.floats(0.0, 0.6))
@settings(max_examples=40)
def test_the_sketch_estimates_the_exact_jaccard_within_a_few_standard_errors(seed, change):
    """The estimate from 8-bit sketches of 112 MinHash values is unbiased: over generated pairs it
    stays within 5 standard errors of the exact Jaccard of the same shingles."""
    rng = random.Random(seed)
    a = _random_words(rng, rng.randrange(50, 400))
    b = [w if rng.random() >= change else "x" + _word(rng.randrange(10**6)) for w in a]
    sa, sb = near.shingles(" ".join(a), 5), near.shingles(" ".join(b), 5)
    exact = near.jaccard(sa, sb)
    hashes = 112
    estimate = near.estimated_similarity(
        near.sketch(near.signature(sa, hashes)), near.sketch(near.signature(sb, hashes))
    )
    se = max(np.sqrt(max(exact * (1 - exact), 0.02) / hashes), 0.02)
    assert abs(estimate - exact) <= 5 * se, (exact, estimate)


def test_equal_shingle_sets_have_equal_signatures_keys_and_sketches_on_any_chunking(monkeypatch):
    text = " ".join(_random_words(random.Random(1), 9000))
    sig = near.signature(near.shingles(text, 5), 112)
    monkeypatch.setattr(near, "_CHUNK", 7)  # the minimum does not depend on how the shingles are cut
    assert np.array_equal(near.signature(near.shingles(text, 5), 112), sig)
    assert near.band_keys(sig, 14, 8) == near.band_keys(sig.copy(), 14, 8)
    assert near.estimated_similarity(near.sketch(sig), near.sketch(sig)) == 1.0


def test_min_equal_grows_with_the_threshold_and_one_is_every_byte():
    counts = [near.min_equal(t / 100, 112) for t in range(1, 101)]
    assert counts == sorted(counts) and counts[-1] == 112 and counts[0] >= 1


@pytest.mark.parametrize(
    "params, message",
    [
        (near.NearParams(threshold=0.0), "near_threshold 0.0: give a number in (0, 1]"),
        (near.NearParams(threshold=1.5), "near_threshold 1.5"),
        (near.NearParams(threshold=float("nan")), "near_threshold nan"),
        (near.NearParams(ngram=0), "near_ngram 0: give 1 or more words"),
        (near.NearParams(bands=14, rows=0), "near_bands 14x0"),
        (near.NearParams(bands=200, rows=8), "at most 1024"),
    ],
)
def test_parameters_out_of_range_are_refused_naming_the_option(params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        params.check()


def test_bands_are_given_as_bands_x_rows():
    assert near.parse_bands("14x8") == (14, 8) and near.parse_bands(" 20X5 ") == (20, 5)
    for bad in ("14", "x8", "14x", "a x b", "14*8", "-1x8"):
        with pytest.raises(ValueError, match="give bands x rows"):
            near.parse_bands(bad)


# -- the stages' records, held to a brute-force forest ----------------------------------------------


def _through(records, step, **kw) -> list[tuple[int, bytes]]:
    """One stage: its records sorted by (key, value), as the shuffle hands them over, through ``step``."""
    out: list[tuple[int, bytes]] = []
    step(sorted(records), emit=lambda k, v: out.append((k, v)), **kw)
    return out


def _pipeline(links: dict[int, list[int]], near_items: int = 3):
    """Links (node -> earlier nodes it is near) through near_links, the jumps and near_clusters."""
    counts = clusters.NearCounts()
    records = [(clusters.node_key(d), clusters._EDGE.pack(e, clusters.NEAR, d)) for d, es in links.items() for e in es]
    records = _through(records, clusters.parents)
    linked = len({d for d, es in links.items() if es})
    assert len(records) == 2 * linked  # an info and a query a dropped document: no more, whatever the shape
    for _ in range(clusters.JUMPS):
        records = _through(records, clusters.jump)
        assert len(records) == 2 * linked
    out = _through(records, clusters.members, near_items=near_items, counts=counts)
    assert len(out) == linked + counts.clusters
    members = {}
    for key, value in out:
        item = key * near_items >> 64
        m = next(clusters.read_members([(key, value)]))
        assert key == item_key(item, near_items, m.ordinal)
        members[clusters.node_id(item, m.ordinal)] = m
    return members, counts


@st.composite
def forests(draw):
    """Documents 0..n-1 (nodes over a few map items) and, for some, links to earlier documents."""
    n = draw(st.integers(1, 60))
    nodes = sorted({clusters.node_id(draw(st.integers(0, 4)), draw(st.integers(0, 50))) for _ in range(n)})
    links = {}
    for i, node in enumerate(nodes[1:], 1):
        if draw(st.booleans()):
            links[node] = draw(st.lists(st.sampled_from(nodes[:i]), min_size=1, max_size=3))
    return nodes, links


@given(forests())
@settings(max_examples=150)
def test_every_linked_document_is_dropped_under_the_root_of_its_tree(forest):
    """Dropped = has a link to an earlier document; parent = the earliest; cluster = the kept root
    its parent chain ends at; every root with members gets its record with the cluster's size."""
    nodes, links = forest
    parent = {d: min(es) for d, es in links.items()}

    def root(d):
        while d in parent:
            d = parent[d]
        return d

    def depth(d):
        return 0 if d not in parent else 1 + depth(parent[d])

    members, counts = _pipeline(links)
    deep = sum(1 for d in parent if depth(d) > 2**clusters.JUMPS)
    assert {d for d, m in members.items() if m.dropped} == set(parent)
    assert counts.unresolved == deep
    sizes = {}
    for d in parent:
        sizes[root(d)] = sizes.get(root(d), 1) + 1
    if not deep:
        assert all(members[d].root == root(d) for d in parent)
        assert {d: m.size for d, m in members.items() if not m.dropped} == sizes
        assert counts.clusters == len(sizes) and counts.largest == max(sizes.values(), default=0)


def test_a_chain_deeper_than_the_jumps_is_dropped_and_counted_unresolved():
    chain = {clusters.node_id(0, i): [clusters.node_id(0, i - 1)] for i in range(1, 2**clusters.JUMPS + 6)}
    members, counts = _pipeline(chain)
    assert all(m.dropped for d, m in members.items() if d != clusters.node_id(0, 0))
    assert len([m for m in members.values() if m.dropped]) == len(chain)
    assert counts.unresolved == 5


def test_a_bucket_of_100000_copies_links_each_to_the_first_in_bounded_memory():
    """Every copy compares with at most BUCKET_KEEP kept sketches; the bucket streams."""
    sketch = bytes(range(112))
    n = 100_000
    records = ((7, clusters.band_record(clusters.node_id(0, i), clusters.NEAR, sketch)) for i in range(n))
    counts = clusters.NearCounts()
    first = clusters.node_id(0, 0)
    links = 0

    def emit(key, value):
        nonlocal links
        earlier, _kind, _node = clusters._EDGE.unpack(value)
        assert earlier == first
        links += 1

    tracemalloc.start()
    clusters.bucket_links(records, near.min_equal(THRESHOLD, 112), emit, counts)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert links == counts.links == n - 1
    assert counts.compared <= clusters.BUCKET_KEEP * n
    assert peak < 2 << 20, peak  # the records are never held: ~200 MB if they were


def test_item_key_sends_each_ordinal_to_its_item_in_order():
    for items in (1, 3, 7, 1000):
        for item in {0, items // 2, items - 1}:
            keys = [item_key(item, items, o) for o in (0, 1, 2, item_span(items) - 1)]
            assert keys == sorted(keys) and all(k * items >> 64 == item for k in keys)
    with pytest.raises(ValueError):
        item_key(0, 2, item_span(2))


# -- real runs over planted copies ------------------------------------------------------------------


def _change(rng: random.Random, words: list[str], share: float) -> list[str]:
    out = list(words)
    for i in rng.sample(range(len(out)), max(1, round(len(out) * share))):
        out[i] = "new" + _word(rng.randrange(10**9))
    return out


def _lines(words: list[str]) -> list[str]:
    return [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(files, documents in corpus order with their kind, the documents exact Jaccard drops)."""
    rng = random.Random(32)
    base = [_random_words(rng, rng.randrange(80, 160)) for _ in range(120)]
    docs = [("base", b) for b in base]
    docs += [("near", _change(rng, b, 0.01)) for b in base[:30]]
    docs += [("lookalike", _change(rng, b, 0.4)) for b in base[30:50]]
    docs += [("exact", list(b)) for b in base[50:65]]
    page = _random_words(rng, 100)
    docs += [("page", list(page)) for _ in range(30)]
    docs += [("short", _random_words(rng, 3)) for _ in range(10)] + [("short", ["one", "two"])] * 3
    rng.shuffle(docs)
    folder = tmp_path_factory.mktemp("near-corpus")
    files = []
    for f in range(3):
        path = folder / f"in-{f}.txt"
        path.write_text("".join("\n".join(_lines(w)) + "\n\n" for _k, w in docs[f::3]), encoding="utf-8")
        files.append(str(path))
    order = [d for f in range(3) for d in docs[f::3]]  # plan order: file by file
    texts = ["\n".join(_lines(w)) for _k, w in order]
    sets = [near.shingles(t, 5) for t in texts]
    dropped = {
        j
        for j in range(len(order))
        if any(len(sets[j]) and near.jaccard(sets[i], sets[j]) >= THRESHOLD for i in range(j))
    }
    return files, order, texts, dropped


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, planted) -> str:
    _files, _order, texts, _dropped = planted
    path = str(tmp_path_factory.mktemp("near-vocab") / "vocab.txt")
    write_vocab(train_vocab((line for t in texts for line in t.split("\n")), 2000), path)
    return path


def _run(inputs, out, vocab, workers=1, item_bytes=9_000, shards=0, dedup="near", **more) -> LocalResult:
    console = Console(file=io.StringIO(), width=200)
    settings_ = {"vocab_file": vocab, "max_seq_length": "64", **{k: str(v) for k, v in more.items()}}
    result = run_local(
        inputs,
        str(out),
        "electra_zh_en",
        workers,
        settings_,
        item_bytes=item_bytes,
        console=console,
        stage_options=StageOptions(shards, dedup),
        lease_ttl=20,
    )
    assert result.exit_code == 0, console.file.getvalue()
    assert result.status.done == result.status.items
    return result


def _bytes(out) -> dict[str, bytes]:
    return {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(os.path.join(str(out), "part-*")))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, planted, vocab):
    files, order, texts, dropped = planted
    base = tmp_path_factory.mktemp("near-runs")
    kept = base / "kept.txt"
    kept.write_text("".join(t + "\n\n" for j, t in enumerate(texts) if j not in dropped), encoding="utf-8")
    return {
        "near": _run(files, base / "near", vocab, near_clusters="true"),
        "both": _run(files, base / "both", vocab, workers=2, item_bytes=4_000, dedup="exact,near"),
        "shards": _run(files, base / "shards", vocab, shards=2),
        "shards2": _run(files, base / "shards2", vocab, workers=2, item_bytes=25_000, shards=2),
        "kept": _run([str(kept)], base / "kept", vocab, dedup="", shards=2),
    }, base


def _sidecar(out) -> list[dict]:
    return [json.loads(line) for p in sorted(glob.glob(os.path.join(str(out), "*.near.jsonl"))) for line in open(p)]


def _place(order_files, line) -> int:
    """The document's index in plan order, from its sidecar line (file and byte offset)."""
    return order_files[(os.path.basename(line["file"]), line["offset"])]


def _index(planted) -> dict[tuple[str, int], int]:
    files, order, texts, _dropped = planted
    index, j = {}, 0
    for f in files:
        at = 0
        for block in open(f, encoding="utf-8").read().split("\n\n"):
            if block.strip():
                index[(os.path.basename(f), at)] = j
                j += 1
            at += len(block.encode()) + 2
    assert j == len(order)
    return index


def test_near_copies_and_exact_copies_are_dropped_and_look_alikes_kept(planted, runs):
    files, order, texts, dropped = planted
    kinds = [k for k, _w in order]
    assert len(dropped) == 30 + 15 + 29 + 2  # one of each planted pair (the later), the page's copies, "one two"
    assert all(kinds[j] != "lookalike" for j in dropped)
    lines = _sidecar(runs[1] / "near")
    index = _index(planted)
    got = {_place(index, line) for line in lines if not line["kept"]}
    assert got == dropped  # what exact Jaccard drops, pair by pair: no more, no less
    clusters_ = {}
    for line in lines:
        clusters_.setdefault(line["cluster"], []).append(line)
    for members in clusters_.values():  # one kept document a cluster, the earliest, and its size
        kept = [m for m in members if m["kept"]]
        assert len(kept) == 1 and kept[0]["size"] == len(members)
        assert _place(index, kept[0]) == min(_place(index, m) for m in members)
    summary = runs[0]["near"].summary
    assert summary["near_documents_dropped"] == len(dropped)
    assert summary["near_bytes_dropped"] == sum(len(texts[j].encode()) for j in dropped)
    assert summary["near_documents_kept"] == summary["documents"] == len(order) - len(dropped)
    assert summary["near_clusters"] == len(clusters_)
    assert summary["near_cluster_size_max"] == max(map(len, clusters_.values())) == 30  # the page's copies
    assert summary["near_documents_short"] == 13
    manifest = json.load(open(runs[1] / "near" / "manifest.json"))
    assert manifest["stages"]["near_clusters"]["near_cluster_size_max"] == 30
    assert manifest["stages"]["near"]["near_documents_dropped"] == len(dropped)


def test_exact_near_counts_the_exact_copies_apart_and_drops_the_same(planted, runs):
    _files, order, texts, dropped = planted
    both, alone = runs[0]["both"].summary, runs[0]["near"].summary
    assert both["dedup_documents_dropped"] + both["near_documents_dropped"] == len(dropped)
    assert both["dedup_documents_dropped"] == 15 + 29 + 2  # the exact copies, the page's and "one two"
    assert both["documents"] == alone["documents"] and both["examples"] == alone["examples"]


def test_the_result_is_a_run_over_the_kept_documents_whatever_the_workers_and_items(runs):
    results, base = runs
    shards = _bytes(base / "shards")
    assert len(shards) == 2
    assert _bytes(base / "shards2") == shards  # 2 workers, items 3x as big: the same bytes
    assert _bytes(base / "kept") == shards  # and those of a plain run over just the kept documents


def test_near_clusters_without_dedup_near_is_refused_by_fleet_local_before_any_work(planted, vocab, tmp_path):
    """Job.stages is asked even without stage options, so an option that needs one is refused."""
    from tests.helpers.cli import fleet_in_process

    out = tmp_path / "out"
    proc = fleet_in_process(
        "local", *planted[0], str(out), "--set", f"vocab_file={vocab}", "--set", "near_clusters=true"
    )
    assert proc.returncode == 2
    assert "option near_clusters: give --dedup near" in proc.stderr + proc.stdout
    assert not glob.glob(str(out / "part-*"))


def test_plan_refuses_bad_near_options_in_one_line(planted, vocab, tmp_path):
    job = load_job("electra_zh_en")
    for settings_, options, message in [
        ({"near_threshold": "0"}, StageOptions(0, "near"), "option near_threshold 0.0: give a number in (0, 1]"),
        ({"near_bands": "14x"}, StageOptions(0, "near"), "option near_bands '14x': give bands x rows"),
        ({"near_ngram": "0"}, StageOptions(0, "near"), "option near_ngram 0"),
        ({"near_clusters": "true"}, StageOptions(0, ""), "option near_clusters: give --dedup near"),
        ({"near_clusters": "true"}, StageOptions(2, "near"), "option near_clusters: not with --shards"),
        ({}, StageOptions(0, "fuzzy"), "--dedup 'fuzzy': unknown mode"),
    ]:
        config = job.parse_config({"vocab_file": vocab, **settings_})
        with pytest.raises(ConfigError) as e:
            job.stages(config, options, 4)
        assert str(e.value).startswith(message), str(e.value)
        assert "\n" not in str(e.value)


# -- worker deaths, and fleet status --verify --------------------------------------------------------

KILL_PAUSES = {"FLEET_TEST_PAUSE": "claimed=0.5,uploaded=0.6"}


def _plan_near(bucket: str, run: str, files: list[str], vocab: str, ttl: float) -> None:
    from fleet.core.run import PlanRequest, plan

    plan(
        bucket,
        PlanRequest(
            run=run,
            job="electra_zh_en",
            inputs=files,
            output=f"{bucket}/out-{run}",
            code_version="test",
            settings={"vocab_file": vocab, "max_seq_length": "64"},
            lease_ttl=ttl,
            max_attempts=10,
            item_bytes=40_000,
            stage_options=StageOptions(0, "exact,near"),
        ),
    )


def _committed(bucket: str, run: str) -> dict[str, str]:
    """Name -> sha256 of everything the run committed (outputs, records between stages), names
    without the run's; not the indexes, which pin object versions that differ between runs."""
    from tests.helpers.procs import committed

    return {
        k.replace(f"runs/{run}/", "").replace(f"out-{run}", "out"): v
        for k, v in committed(bucket, run).items()
        if not k.endswith(".index")
    }


def test_sigkills_in_the_near_stages_leave_the_bytes_of_a_clean_run(planted, vocab, tmp_path):
    """Workers killed after writing band records, on taking a rereading "near" item, and after
    writing its outputs: every committed byte (records between stages, outputs) is the clean run's."""
    from fleet.core.run import load_items
    from fleet.core.spawner import Worker
    from fleet.core.store import open_store
    from tests.helpers.procs import kill_at_pauses

    files = planted[0]
    bucket = str(tmp_path / "bucket")
    os.makedirs(bucket)
    _plan_near(bucket, "clean", files, vocab, ttl=30)
    solo = Worker(bucket, "clean", "solo", poll=0.05)
    try:
        solo.run_until_drained()
    finally:
        solo.close()
    expected = _committed(bucket, "clean")

    _plan_near(bucket, "chaos", files, vocab, ttl=2.0)
    stage_of = {i.id: i.meta.get("stage", "map") for i in load_items(open_store(bucket), "chaos")}
    targets = [("uploaded", "near_bands_exact"), ("claimed", "near"), ("uploaded", "near")]
    kill_at_pauses(bucket, "chaos", 2, str(tmp_path / "logs"), KILL_PAUSES, targets, stage_of.get, lambda _p: 0.25)
    assert _committed(bucket, "chaos") == expected


def test_verify_names_a_lost_near_output_and_the_rerun_makes_the_same_bytes(planted, vocab, tmp_path):
    """`fleet status --verify` covers near's stages: a deleted output of the rereading stage is
    named and reopened, and the resumed run writes it again, byte for byte."""
    from tests.helpers.cli import fleet_in_process

    out = tmp_path / "out"
    _run(planted[0], out, vocab, item_bytes=40_000, near_clusters="true")
    before = _bytes(out)
    victim = sorted(n for n in before if n.endswith(".tfrecord"))[1]
    os.remove(out / victim)
    proc = fleet_in_process("status", str(out), "--verify")
    assert victim in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    _run(planted[0], out, vocab, item_bytes=40_000, near_clusters="true")
    assert _bytes(out) == before
