"""fleet.core.layout owns every object name under runs/<run>/, and startup.sh agrees with it.

startup.sh spells no name: it fills in the templates the launch puts in the metadata
(fleet-paths). Here its own code (load_paths and at, cut out of the script) resolves them for
any run, instance and boot, and must give exactly fleet.core.layout's names.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.core import layout
from fleet.gce import compute_requests
from fleet.core.run import check_run_name, list_runs
from fleet.core.store import open_store

STARTUP = Path(__file__).resolve().parent.parent / "startup" / "startup.sh"

runs = st.text("abcXYZ019-_.", min_size=1, max_size=40).filter(lambda r: not r.startswith("."))
instances = st.from_regex(r"\A[a-z][-a-z0-9]{0,40}[a-z0-9]\Z")
boots = st.from_regex(r"\A[0-9a-f]{12}\Z")


def _functions(*names: str) -> str:
    """The definitions of startup.sh's functions NAMES (each from `name() {` to its closing `}`)."""
    text = STARTUP.read_text()
    out = [re.search(r"^declare -A PATHS=\(\).*$", text, re.M).group(0)]
    for name in names:
        found = re.search(rf"^{re.escape(name)}\(\) \{{.*?^\}}$", text, re.M | re.S)
        assert found, f"startup.sh has no function {name}"
        out.append(found.group(0))
    return "\n".join(out)


def _resolve(
    run: str, instance: str, boot: str, finished: int, version: str = "0123456789abcdef", sha: str = "ab" * 32
) -> dict[str, str]:
    """What startup.sh's own code makes of the run's fleet-paths metadata."""
    script = (
        _functions("load_paths", "at", "at_into")
        + """
set -euo pipefail
load_paths "$1"
INSTANCE=$2 BOOT=$3 VERSION=$5
for key in boot log final failed failed-now stop; do printf '%s\\t%s\\n' "$key" "$(at "$key" "$4")"; done
printf 'code-manifest\\t%s\\n' "$(at code-manifest)"
printf 'code-object\\t%s\\n' "$(at code-object "$6")"
at_into name code-object "$6"  # (at without a subshell, as the code fetch names its objects)
[[ $name == "$(at code-object "$6")" ]] || { echo "at_into differs: $name" >&2; exit 1; }
"""
    )
    out = subprocess.run(
        ["bash", "-c", script, "startup", layout.vm_paths_text(run), instance, boot, str(finished), version, sha],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("\t") for line in out.splitlines())


@settings(max_examples=25, deadline=None)
@given(runs, instances, boots, st.integers(0, 10**6))
def test_startup_sh_writes_exactly_the_names_fleet_layout_gives(run, instance, boot, finished):
    check_run_name(run)
    assert _resolve(run, instance, boot, finished) == {
        "boot": layout.boot_name(run, instance, boot),
        "log": layout.log_name(run, instance),
        "final": layout.final_prefix(run),
        "failed": layout.failed_name(run, finished, instance, boot),
        "failed-now": layout.failed_prefix(run, finished),
        "stop": layout.stop_name(run),
        "code-manifest": layout.code_manifest_name("0123456789abcdef"),
        "code-object": layout.code_object_name("ab" * 32),
    }


def test_startup_sh_spells_no_object_name_and_uses_only_keys_the_launch_gives():
    code = [line.split(" #")[0] for line in STARTUP.read_text().splitlines() if not line.lstrip().startswith("#")]
    assert not [
        line
        for line in code
        if "runs/" in line
        or "stopped.json" in line
        or "final/" in line
        or "code/objects" in line
        or "manifest.sha256" in line
    ]  # (its local $WORK_DIR/code/ is its own)
    used = set(re.findall(r"\$\(at ([a-z-]+)|\bat_into \w+ ([a-z-]+)", "\n".join(code)))
    used = {a or b for a, b in used}
    required = set(re.search(r"for key in ([a-z -]+); do \[\[ -n \$\{PATHS", "\n".join(code)).group(1).split())
    assert used == required == set(layout.vm_paths("r"))


def test_the_template_hands_startup_sh_the_run_s_names():
    spec = compute_requests.FleetSpec(
        run="r1",
        bucket="gs://b",
        code_version="0" * 16,
        template="fleet-r1",
        machine_type="e2-standard-4",
        image="img",
        service_account="",
        startup_script="#!",
    )
    items = {i.key: i.value for i in compute_requests.template_resource(spec).properties.metadata.items}
    assert items[compute_requests.MD_PATHS] == layout.vm_paths_text("r1")


def test_a_damaged_paths_metadata_is_refused():
    script = _functions("load_paths") + '\nload_paths "$1"'
    for bad in (
        "",
        "boot=runs/r/boots/{instance}-{boot}\n",
        layout.vm_paths_text("r").replace("log=", "log=a b"),
        layout.vm_paths_text("r") + "x=$(reboot)\n",
    ):
        assert subprocess.run(["bash", "-c", script, "startup", bad]).returncode != 0, bad


@settings(max_examples=50, deadline=None)
@given(runs)
def test_every_name_is_the_run_s_own(run):
    """Under runs/<run>/, distinct, and no run's names lie under another run's prefix (runs r and r1)."""
    check_run_name(run)
    names = [
        layout.spec_name(run),
        layout.items_name(run),
        layout.lease_prefix(run),
        layout.final_prefix(run),
        layout.released_prefix(run),
        layout.worker_prefix(run),
        layout.idle_prefix(run),
        layout.launch_name(run),
        layout.log_prefix(run),
        layout.boots_prefix(run),
        layout.failed_prefix(run),
        layout.stop_name(run),
    ]
    assert len(set(names)) == len(names)
    assert all(n.startswith(layout.run_prefix(run)) for n in names)
    assert not any(n.startswith(layout.run_prefix(run + "x")) for n in names)
    assert layout.run_of_spec(layout.spec_name(run)) == run
    assert layout.run_of_spec(layout.items_name(run)) is None


def test_list_runs_finds_the_runs_by_their_specs(tmp_path):
    store = open_store(str(tmp_path))
    for name in (
        layout.spec_name("a"),
        layout.spec_name("b.2"),
        layout.lease_prefix("c") + "00001",
        layout.run_prefix("d") + "x/run.json",
    ):
        store.write(name, b"{}")
    assert list_runs(store) == ["a", "b.2"]


def _strings(tree: ast.AST) -> list[str]:
    """The string literals of a module (f-strings' literal parts too), docstrings left out."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_no_other_fleet_module_spells_a_run_s_object_name():
    """(It finds the old run_prefix family, and the launch record's and logs' names in gcp.py.)"""
    names = (
        "runs/",
        "run.json",
        "items.jsonl",
        "leases/",
        "final/",
        "released/",
        "workers/",
        "idle/",
        "launch.json",
        "logs/",
        "boots/",
        "failed-boots",
        "stopped.json",
    )
    spelled = {}
    for path in sorted((STARTUP.parent.parent / "fleet").glob("*.py")):
        if path.name != "layout.py":
            found = [
                s for s in _strings(ast.parse(path.read_text())) if any(n in s for n in names) and " " not in s
            ]  # a name, not a message about one
            if found:
                spelled[path.name] = found
    assert spelled == {}
