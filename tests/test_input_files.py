"""Which files are inputs: each input byte read once, and only corpus files read (issue 17).

A hard link is the same file under a second name: planned once, like a symbolic link.
READMEs, licences and build files in an input folder are not corpus, with or without an
extension (a WikiExtractor shard such as ``wiki_00`` has none and is). The outputs and run
state of another fleet run inside an input folder are not corpus either: skipped, named.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_jobs.text.inputs import find_corpus
from fleet_jobs.text.inputs.names import corpus_file


def names(paths) -> list[str]:
    return [f.name for f in find_corpus([str(p) for p in paths])]


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- 7. hard links ----------------------------------------------------------------------------------
def test_a_hard_link_to_an_input_is_planned_once_with_a_warning(tmp_path, caplog):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one\n\ntwo\n")
    os.link(tmp_path / "in" / "a.txt", tmp_path / "in" / "b.txt")
    assert names([tmp_path / "in"]) == ["a.txt"]
    said = [w for w in warnings(caplog) if "b.txt" in w]
    assert len(said) == 1 and "the same file as" in said[0] and "a.txt" in said[0] and "planned once" in said[0]


def test_a_hard_link_named_beside_its_folder_is_planned_once(tmp_path, caplog):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one\n")
    os.link(tmp_path / "in" / "a.txt", tmp_path / "elsewhere.txt")
    assert len(find_corpus([str(tmp_path / "in"), str(tmp_path / "elsewhere.txt")])) == 1
    assert any("elsewhere.txt: the same file as" in w for w in warnings(caplog))


# -- 8. what is not corpus ------------------------------------------------------------------------------
NOT_CORPUS = [
    "README",
    "LICENSE",
    "Makefile",
    "COPYING",
    "NOTICE",
    "AUTHORS",
    "CHANGELOG",
    "Dockerfile",
    "readme.txt",
    "License.txt",
    "COPYING.txt",
    "notice.md",
    "changelog.jsonl",
    "LICENCE",
    "CONTRIBUTING",
    "sha256sums.txt",
    "AA/README",
    "Makefile.gz",
]
CORPUS = ["wiki_00", "AA/wiki_01", "a.txt", "readme_corpus.txt", "licenses_dataset.jsonl", "b.jsonl.gz"]


def test_readmes_licences_and_build_files_are_skipped_and_wiki_shards_kept(tmp_path):
    for name in NOT_CORPUS + CORPUS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"text\n")
    assert sorted(names([tmp_path])) == sorted(CORPUS)


def test_a_readme_named_on_the_command_line_is_read(tmp_path):
    (tmp_path / "README").write_text("the user asked for it\n")
    assert names([tmp_path / "README"]) == ["README"]


def _fleet_local_output(folder: Path) -> None:
    """What `fleet local` leaves in its OUT_DIR."""
    (folder / ".fleet" / "runs" / "local" / "leases").mkdir(parents=True)
    (folder / ".fleet" / "runs" / "local" / "run.json").write_text("{}")
    (folder / "summary.json").write_text('{\n "items": 2\n}\n')
    (folder / "part-00000.txt").write_text("0.1 abc\n")
    (folder / "part-00001.parquet").write_bytes(b"PAR1")


def _run_state(bucket: Path) -> None:
    """What `fleet plan --bucket FOLDER` leaves in a bucket folder."""
    (bucket / "runs" / "wiki" / "leases").mkdir(parents=True)
    (bucket / "runs" / "wiki" / "run.json").write_text("{}")
    (bucket / "runs" / "wiki" / "items.jsonl").write_text('{"id": "00000"}\n')
    (bucket / "runs" / "wiki" / "leases" / "00000").write_text('{"state": "done"}')


def test_another_runs_outputs_inside_an_input_folder_are_skipped_and_named(tmp_path, caplog):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one\n")
    (tmp_path / "in" / "old-out").mkdir()
    _fleet_local_output(tmp_path / "in" / "old-out")
    _run_state(tmp_path / "in")
    assert names([tmp_path / "in"]) == ["a.txt"]
    said = warnings(caplog)
    assert sum("old-out" in w for w in said) == 1, said
    assert sum(os.path.join("in", "runs") in w for w in said) == 1, said
    assert all("skipped" in w for w in said), said


def test_a_folder_that_is_only_another_runs_outputs_is_one_line(tmp_path):
    from fleet.job import InputError

    _fleet_local_output(tmp_path)
    with pytest.raises(InputError, match="the outputs of a `fleet local` run: it holds .fleet/, not a corpus"):
        find_corpus([str(tmp_path)])


def test_on_gcs_readmes_and_another_runs_outputs_and_state_are_skipped(gcs_bucket, caplog):
    from fleet.core.store import open_store

    store = open_store(f"gs://{gcs_bucket}")
    for name in [
        "data/wiki_00",
        "data/AA/wiki_01",
        "data/a.txt",
        "data/README",
        "data/LICENSE.txt",
        "data/Makefile",
        "data/out/summary.json",
        "data/out/part-00000.txt",
        "data/runs/wiki/run.json",
        "data/runs/wiki/items.jsonl",
        "data/runs/wiki/leases/00000",
    ]:
        store.write(name, b"text\n")
    found = find_corpus([f"gs://{gcs_bucket}/data"])
    assert sorted(f.name for f in found) == ["data/AA/wiki_01", "data/a.txt", "data/wiki_00"]
    said = warnings(caplog)
    assert sum("data/out" in w for w in said) == 1 and sum("data/runs" in w for w in said) == 1, said


# -- the invariant: every file (inode) under the inputs is planned exactly once --------------------------
TREES = st.lists(
    st.tuples(
        st.sampled_from(["file", "hard", "sym", "dirlink"]),
        st.sampled_from(["", "x/", "x/y/", "z/"]),
        st.integers(0, 30),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=TREES, name_twice=st.booleans())
def test_every_inode_under_the_inputs_is_planned_once(tmp_path_factory, tree, name_twice):
    root = tmp_path_factory.mktemp("tree")
    files: list[Path] = []
    for i, (kind, folder, pick) in enumerate(tree):
        (root / folder).mkdir(parents=True, exist_ok=True)
        path = root / folder / f"f{i}.txt"
        if kind == "file" or not files:
            path.write_text(f"document {i}\n")
            files.append(path)
        elif kind == "hard":
            os.link(files[pick % len(files)], path)
        elif kind == "sym":
            path.symlink_to(files[pick % len(files)])
        else:
            (root / folder / f"d{i}").symlink_to(root / ["x", "z", "x/y"][pick % 3], target_is_directory=True) if (
                root / ["x", "z", "x/y"][pick % 3]
            ).is_dir() else None
    named = [str(root), str(root)] if name_twice else [str(root)]
    found = find_corpus(named)
    inodes = [os.stat(os.path.join(f.url, f.name)).st_ino for f in found]
    assert sorted(inodes) == sorted({p.stat().st_ino for p in files})


@given(
    stem=st.sampled_from(sorted(NOT_CORPUS)),
    case=st.lists(st.booleans(), min_size=20, max_size=20),
    ext=st.sampled_from(["", ".txt", ".md", ".jsonl", ".json", ".gz", ".txt.zst", ".in"]),
    folder=st.sampled_from(["", "AA/", "x/y/"]),
    shard=st.integers(0, 99),
)
def test_known_non_corpus_names_are_never_taken_and_wiki_shards_always_are(stem, case, ext, folder, shard):
    cased = "".join(c.upper() if up else c for c, up in zip(stem, case))
    assert not corpus_file(f"{folder}{cased}{ext}")
    assert corpus_file(f"{folder}wiki_{shard:02d}") and corpus_file(f"{folder}wiki_{shard:02d}.bz2")
