"""The extra Python packages a run names: installed once per machine, pinned by hash.

A run's ``requirements_file`` (pip requirements, every line with ``--hash``) is pinned
by its sha256 in run.json like any ``*_file`` option, so every machine installs the
same bytes. The packages go into a virtual environment of their own, named by that
digest, under a per-user cache: the first worker of a machine builds it (``pip install
--require-hashes``) under a file lock while the others wait, and a marker written last
says it is complete, so a machine that died mid-install builds it again. The command
then finds that environment's ``python3`` and scripts first on its PATH. It is kept
apart from the fleet's own environment: a package the command needs cannot change the
fleet's dependencies, nor theirs its own.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys

from fleet.job import ConfigError

DONE = ".fleet-installed"


def cache_root() -> str:
    """Where the environments live: FLEET_COMMAND_ENVS, else the user's cache folder
    (on a VM, the workers' home under /var/lib/fleet, kept across reboots of the VM)."""
    explicit = os.environ.get("FLEET_COMMAND_ENVS")
    if explicit:
        return explicit
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "fleet", "command-envs")


def environment(requirements: bytes, label: str) -> str:
    """The folder of a virtual environment holding exactly these requirements, made at the
    first call on this machine (by this Python version); ConfigError if pip refuses them."""
    key = hashlib.sha256(requirements + sys.version.encode()).hexdigest()[:16]
    root = cache_root()
    venv = os.path.join(root, key)
    if os.path.exists(os.path.join(venv, DONE)):
        return venv
    try:
        os.makedirs(root, exist_ok=True)
        lock = open(os.path.join(root, f"{key}.lock"), "w")
    except OSError as e:
        raise ConfigError(f"{label}: cannot make the package cache {root}: {e.strerror}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers of this machine wait for the first
        if os.path.exists(os.path.join(venv, DONE)):
            return venv
        shutil.rmtree(venv, ignore_errors=True)  # half made by a worker that died
        listed = os.path.join(root, f"{key}.txt")
        with open(listed, "wb") as f:
            f.write(requirements)
        _step([sys.executable, "-m", "venv", venv], label, "cannot make a virtual environment")
        python = os.path.join(venv, "bin", "python")
        _step(
            [
                python,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-input",
                "--disable-pip-version-check",
                "--require-hashes",
                "-r",
                listed,
            ],
            label,
            "pip could not install it (--require-hashes)",
        )
        with open(os.path.join(venv, DONE), "w") as f:
            f.write(hashlib.sha256(requirements).hexdigest() + "\n")
    return venv


def _step(argv: list[str], label: str, what: str) -> None:
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
    if result.returncode != 0:
        said = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        errors = [line for line in said if line.upper().startswith("ERROR")]
        raise ConfigError(f"{label}: {what}: {(errors or said or ['exit code %d' % result.returncode])[-1]}")
