"""requirements.lock pins exactly what pyproject.toml asks for, with hashes; VMs install nothing else.

Every VM (and the Packer image) installs the lock with `pip --require-hashes`, so VMs booted
an hour apart run the same bytes. This test needs no network: it checks the lock against
pyproject.toml's [project] dependencies. When it fails, make the lock again:

    uv pip compile pyproject.toml --generate-hashes --python-version 3.11 \\
        --python-platform x86_64-manylinux_2_28 --no-config -o requirements.lock

(Python 3.11: Debian 12's, what the VMs run.)
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from fleet.gce.config import DEFAULT_CODE_PATHS, tomllib

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
PYPROJECT = ROOT / "pyproject.toml"
TOP = "fleet (pyproject.toml)"
# What the lock is made for (its header's --python-version / --python-platform): a requirement whose
# marker excludes this environment (tomli on Python < 3.11) is rightly absent from it.
VM = {
    "python_version": "3.11",
    "python_full_version": "3.11.2",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def parse_lock(text: str) -> dict[str, dict]:
    """name -> {version, hashes, via}: uv's / pip-compile's format (a pin, its --hash lines, '# via' lines)."""
    entries: dict[str, dict] = {}
    current = None
    in_via = False
    for line in text.splitlines():
        m = PIN.match(line)
        if m:
            current = entries.setdefault(
                canonicalize_name(m.group(1)), {"version": m.group(2), "hashes": [], "via": set()}
            )
            in_via = False
            continue
        stripped = line.strip()
        if current is None or not stripped:
            continue
        if stripped.startswith("--hash="):
            current["hashes"].append(stripped.removeprefix("--hash=").rstrip(" \\"))
        elif stripped.startswith("# via"):
            rest = stripped.removeprefix("# via").strip()
            in_via = not rest
            if rest:
                current["via"].add(rest)
        elif in_via and stripped.startswith("#   "):
            current["via"].add(stripped.removeprefix("#").strip())
        else:
            in_via = False
    return entries


def problems(pyproject: str, lock: str) -> list[str]:
    """Where the lock and pyproject.toml disagree; empty when they agree."""
    wanted = [Requirement(r) for r in tomllib.loads(pyproject)["project"]["dependencies"]]
    wanted = [r for r in wanted if r.marker is None or r.marker.evaluate(VM)]
    entries = parse_lock(lock)
    out = []
    names = set()
    for req in wanted:
        name = canonicalize_name(req.name)
        names.add(name)
        entry = entries.get(name)
        if entry is None:
            out.append(f"{req}: in pyproject.toml, not in the lock")
        elif not req.specifier.contains(entry["version"], prereleases=True):
            out.append(f"{req}: the lock pins {entry['version']}")
        elif TOP not in entry["via"]:
            out.append(f"{req}: the lock does not say it comes from pyproject.toml")
    for name, entry in entries.items():
        if not entry["hashes"] or not all(h.startswith("sha256:") for h in entry["hashes"]):
            out.append(f"{name}: no sha256 hashes")
        if TOP in entry["via"] and name not in names:
            out.append(f"{name}: the lock has it from pyproject.toml, which no longer lists it")
        for parent in entry["via"] - {TOP}:
            if canonicalize_name(parent.split()[0]) not in entries:
                out.append(f"{name}: needed by {parent}, which is not in the lock")
        if not entry["via"]:
            out.append(f"{name}: nothing in the lock needs it")
    return out


def test_the_lock_matches_pyproject_and_has_hashes():
    assert problems(PYPROJECT.read_text(), LOCK.read_text()) == []
    assert "--generate-hashes" in LOCK.read_text().split("\n", 3)[1]  # the command that made it, in its header
    assert "requirements.lock" in DEFAULT_CODE_PATHS  # it travels in the code snapshot, to every VM


def test_a_lock_that_disagrees_is_caught():
    pyproject, lock = PYPROJECT.read_text(), LOCK.read_text()
    added = pyproject.replace('"tenacity>=8.2",', '"tenacity>=8.2",\n    "requests-toolbelt>=1",')
    assert problems(added, lock) == ["requests-toolbelt>=1: in pyproject.toml, not in the lock"]
    raised = pyproject.replace('"numpy>=1.24"', '"numpy>=99"')
    assert [p for p in problems(raised, lock) if p.startswith("numpy")] == [
        f"numpy>=99: the lock pins {parse_lock(lock)['numpy']['version']}"
    ]
    dropped = pyproject.replace('    "zstandard>=0.22",\n', "")
    assert problems(dropped, lock) == ["zstandard: the lock has it from pyproject.toml, which no longer lists it"]
    unhashed = re.sub(r"(?m)^(zstandard==\S+) \\\n(    --hash=\S+ \\\n)*    --hash=\S+\n", r"\1\n", lock)
    assert unhashed != lock and problems(pyproject, unhashed) == ["zstandard: no sha256 hashes"]


def test_a_requirement_for_other_pythons_only_is_not_asked_of_the_lock():
    pyproject, lock = PYPROJECT.read_text(), LOCK.read_text()
    assert "python_version < '3.11'" in pyproject  # tomli, for fleet.toml on Python 3.10
    assert "tomli" not in parse_lock(lock)
    assert problems(pyproject, lock) == []
    everywhere = pyproject.replace("\"tomli>=1.1; python_version < '3.11'\"", '"tomli>=1.1"')
    assert problems(everywhere, lock) == ["tomli>=1.1: in pyproject.toml, not in the lock"]
