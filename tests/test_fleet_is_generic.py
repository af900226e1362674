"""fleet/ is the generic layer (issue 18): it knows input objects and byte ranges, never text.

The text formats, the cutting of files at document boundaries, the corpus-name filter and the
read options are the text layer's (fleet_jobs/text/inputs, fleet_jobs.text.job.TextJob). These tests fail
if a module under fleet/ imports the text layer or any job (discovery in fleet/core/discovery.py excepted),
if the old fleet/inputs comes back, or if the fleet reads its input options instead of handing
them to the job.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
from pathlib import Path

import pytest

from fleet.job import ConfigError, InputError, Job, Piece, Source
from fleet.core.run import PlanRequest, load_items, load_spec, plan
from fleet.core.sources import find_sources
from fleet.core.store import open_store
from tests.helpers.linejob import JOB as LINEJOB

FLEET = Path(__file__).resolve().parent.parent / "fleet"
# Modules that are text formats (or the old home of them): the fleet imports none.
TEXT_MODULES = ("fleet.inputs", "fleet_jobs.text", "fleet_jobs")
DISCOVERY = {("core/discovery.py", "fleet_jobs")}  # fleet/core/discovery.py finds jobs by scanning the jobs package


def imports(path: Path) -> list[str]:
    """Every module a file imports, wherever in it (a function's lazy import too), absolute."""
    package = ".".join(path.relative_to(FLEET.parent).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return out


def test_no_module_under_fleet_imports_a_text_format_module_or_a_job():
    bad = []
    for path in sorted(FLEET.rglob("*.py")):
        for module in imports(path):
            hit = next((t for t in TEXT_MODULES if module == t or module.startswith(t + ".")), None)
            if hit and (str(path.relative_to(FLEET)), module) not in DISCOVERY:
                bad.append(f"fleet/{path.relative_to(FLEET)} imports {module}")
    assert not bad, "\n".join(bad)
    assert not (FLEET / "inputs").exists(), "the text readers live in fleet_jobs/text/inputs"


def test_the_import_walk_sees_lazy_and_relative_imports(tmp_path):
    # The check above is only as good as its walk: a lazy import inside a function and a relative
    # import both count.
    pkg = FLEET / "core" / "store"
    probe = pkg / "_probe_for_test.py"
    try:
        probe.write_text("def f():\n    from ..inputs import formats\n    import fleet_jobs.text.job\n")
        got = imports(probe)
    finally:
        probe.unlink()
    assert "fleet.core.inputs.formats" in got and "fleet_jobs.text.job" in got


@dataclasses.dataclass
class NoOptions:
    pass


class WholeFiles(Job):
    """A job that is not about text: every file an item, its read options its own."""

    name = "wholefiles"
    config_type = NoOptions

    def check_read(self, read):
        if read.get("keep_titles"):
            raise ConfigError("--keep-titles: this job reads no titles")
        return {"mine": read.get("mine", 1)}

    def converter(self, config, opener):
        raise NotImplementedError  # (planning only)


WHOLE = WholeFiles()


def test_the_run_keeps_what_the_job_made_of_its_read_options(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "README").write_bytes(b"not text to a text job, input to this one")
    (inputs / "data.bin").write_bytes(bytes(range(256)))
    (inputs / ".hidden").write_bytes(b"never input")
    bucket = str(tmp_path / "b")
    spec, items, _ = plan(
        bucket,
        PlanRequest(
            run="r",
            job="tests.test_fleet_is_generic:WHOLE",
            inputs=[str(inputs)],
            output=str(tmp_path / "o"),
            code_version="v",
            read={"text_column": "body"},
        ),
    )
    assert spec.read == {"mine": 1}
    assert sorted(i.name for i in items) == ["README", "data.bin"] and all(i.start == 0 for i in items)
    assert [i.id for i in load_items(open_store(bucket), "r")] == [i.id for i in items]
    with pytest.raises(ConfigError, match="^--keep-titles: this job reads no titles$"):
        plan(
            bucket,
            PlanRequest(
                run="r2",
                job="tests.test_fleet_is_generic:WHOLE",
                inputs=[str(inputs)],
                output=str(tmp_path / "o2"),
                code_version="v",
                read={"keep_titles": True},
            ),
        )


@pytest.mark.parametrize(
    "read,message",
    [
        ({"max_bad_share": 2.0}, "--max-bad-share 2: give 0 to 1 (a share of the records)"),
        ({"max_bad_share": float("nan")}, "--max-bad-share nan: give 0 to 1 (a share of the records)"),
        ({"text_column": ""}, "--text-column '': give the name of a JSON field or Parquet column"),
        ({"colour": "red"}, "read option 'colour': a text job knows keep_titles, max_bad_share, text_column"),
    ],
)
def test_a_text_job_checks_its_read_options_at_plan_time_in_one_line(tmp_path, read, message):
    (tmp_path / "a.txt").write_text("a\n")
    with pytest.raises(ConfigError) as e:
        plan(
            str(tmp_path / "b"),
            PlanRequest(
                run="r",
                job="tests.helpers.linejob:JOB",
                inputs=[str(tmp_path / "a.txt")],
                output=str(tmp_path / "o"),
                code_version="v",
                read=read,
            ),
        )
    assert str(e.value) == message
    assert not (tmp_path / "b").exists()  # refused before anything is written


def test_a_text_job_stores_its_read_options_complete_as_runs_before_did(tmp_path):
    # A run planned by the commit before (RunSpec.read = asdict(ReadOptions)) must compare equal,
    # so that `fleet local` resumes it.
    (tmp_path / "a.txt").write_text("a\n\nb\n")
    spec, _, _ = plan(
        str(tmp_path / "b"),
        PlanRequest(
            run="r",
            job="tests.helpers.linejob:JOB",
            inputs=[str(tmp_path / "a.txt")],
            output=str(tmp_path / "o"),
            code_version="v",
            read={"keep_titles": True},
        ),
    )
    assert spec.read == {"text_column": "text", "keep_titles": True, "max_bad_share": 0.5}
    assert load_spec(open_store(str(tmp_path / "b")), "r").read == spec.read


def test_sources_take_every_file_but_hidden_ones_and_other_runs_state(tmp_path, caplog):
    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    (root / "README.md").write_text("x")
    (root / "sub" / "image.png").write_bytes(b"\x89PNG")
    (root / "_SUCCESS").write_text("")
    (root / ".cache").write_text("x")
    done = root / "old-run"
    (done / ".fleet").mkdir(parents=True)
    (done / "part-00000.txt").write_text("x")
    with caplog.at_level(logging.WARNING):
        found = find_sources([str(root)])
    assert sorted(s.name for s in found) == ["README.md", "sub/image.png"]
    assert all(isinstance(s, Source) and s.version for s in found)
    assert any("old-run" in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
    # The job's filter applies inside folders only: a file named on its own is always taken.
    with pytest.raises(InputError, match="no input files there"):
        find_sources([str(root)], accept=LINEJOB.accepts)
    assert [s.name for s in find_sources([str(root / "README.md")], accept=LINEJOB.accepts)] == ["README.md"]


def test_sources_on_gcs_skip_hidden_objects(gcs_bucket):
    store = open_store(f"gs://{gcs_bucket}")
    for name in ("data/a.bin", "data/_SUCCESS", "data/.keep", "data/sub/b.bin"):
        store.write(name, b"x")
    assert [s.name for s in find_sources([f"gs://{gcs_bucket}/data"])] == ["data/a.bin", "data/sub/b.bin"]


def test_a_plan_names_the_piece_sizes_the_job_gives(tmp_path):
    class Halves(WholeFiles):
        def cut(self, source, item_bytes, config, read):
            mid = source.size // 2
            return [Piece(0, mid, meta={"half": 1}), Piece(mid, source.size, size=7, meta={"half": 2})]

    import tests.test_fleet_is_generic as me

    me.HALVES = Halves()
    try:
        (tmp_path / "f").write_bytes(b"0123456789")
        _, items, _ = plan(
            str(tmp_path / "b"),
            PlanRequest(
                run="r",
                job="tests.test_fleet_is_generic:HALVES",
                inputs=[str(tmp_path / "f")],
                output=str(tmp_path / "o"),
                code_version="v",
            ),
        )
    finally:
        del me.HALVES
    assert [(i.start, i.end, i.size, i.meta) for i in items] == [(0, 5, 5, {"half": 1}), (5, 10, 7, {"half": 2})]
    assert os.path.basename(items[0].file) == "f"
