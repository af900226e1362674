"""Code versions: a content hash of the code a run is planned with.

A run pins this version so that a fleet never mixes two versions of the
converter in one output (outputs are a pure function of code and input).
"""

from __future__ import annotations

import hashlib
import os

PACKAGES = ("fleet", "jobs")


def project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code_files(root: str | None = None) -> list[str]:
    """Source files of the fleet and its jobs, relative to the project root, sorted."""
    root = root or project_root()
    found = []
    for package in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
            for fn in filenames:
                if fn.endswith(".py"):
                    found.append(os.path.relpath(os.path.join(dirpath, fn), root).replace(os.sep, "/"))
    return sorted(found)


def code_version(root: str | None = None) -> str:
    root = root or project_root()
    h = hashlib.sha256()
    for rel in code_files(root):
        with open(os.path.join(root, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]
