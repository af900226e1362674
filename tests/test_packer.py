"""The Packer template parses as HCL2 and bakes exactly what startup.sh looks for."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import hcl2
import pytest

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "images" / "packer" / "fleet-worker.pkr.hcl"
STARTUP = ROOT / "startup" / "startup.sh"


def unquote(value):
    """python-hcl2 keeps string literals quoted and interpolations as ${...}."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def plain(value):
    """Strip python-hcl2's quoting from keys and strings, whichever version wrote it."""
    if isinstance(value, dict):
        return {unquote(k): plain(v) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return unquote(value)


@pytest.fixture(scope="module")
def packer() -> dict:
    with open(TEMPLATE) as f:
        return plain(hcl2.load(f))


def startup_default(pattern: str) -> str:
    m = re.search(pattern, STARTUP.read_text(), re.M)
    assert m, pattern
    return m.group(1)


def test_template_builds_an_image_family_with_googlecompute(packer):
    plugin = packer["packer"][0]["required_plugins"][0]["googlecompute"]
    assert plugin["source"] == "github.com/hashicorp/googlecompute"
    source = packer["source"][0]["googlecompute"]["worker"]
    assert source["image_family"] == "${var.image_family}" and source["source_image_project_id"] == ["debian-cloud"]
    variables = {k: v for block in packer["variable"] for k, v in block.items()}
    assert variables["image_family"]["default"] == "fleet-worker"
    assert "default" not in variables["project_id"]  # the one thing a user must say
    assert packer["build"][0]["sources"] == ["source.googlecompute.worker"]


def test_image_holds_what_startup_sh_expects(packer):
    local = packer["locals"][0]
    assert local["python"] == startup_default(r"^PY=\$\{FLEET_PYTHON:-([^}]+)\}")
    venv = str(Path(local["python"]).parent.parent)
    assert local["stamp_file"] == startup_default(r"^STAMP=(\S+)").replace("$VENV", venv)
    provisioners = packer["build"][0]["provisioner"]
    uploads = {}
    for p in provisioners:
        for kind, body in p.items():
            if kind == "file":
                src = body["source"].replace("${path.root}", str(TEMPLATE.parent))
                uploads[body["destination"]] = Path(src).resolve()
    # No tokenizer C core: it travels with the code (setup.py builds it where fleet is installed).
    assert uploads == {"/tmp/startup.sh": STARTUP, "/tmp/requirements.lock": ROOT / "requirements.lock"}
    assert all(path.is_file() for path in uploads.values())
    shell = [line for p in provisioners for kind, body in p.items() if kind == "shell" for line in body["inline"]]
    install = [line for line in shell if "startup.sh" in line and "FLEET_INSTALL_ONLY=/tmp/requirements.lock" in line]
    assert install and "FLEET_PYTHON=${local.python}" in install[0]
    # ...and startup.sh does have that install-only mode, using the same stamp.
    text = STARTUP.read_text()
    assert 'install_deps "$FLEET_INSTALL_ONLY"' in text and 'echo "$want" >"$STAMP"' in text
    assert "--require-hashes" in text  # exactly the lock, as every VM that installs at boot
    # ...and installs nothing else there: no compiler (the image never builds the C core).
    assert text.split('install_deps "$FLEET_INSTALL_ONLY"')[1].split("exit 0")[0].strip() == ""
    assert not [line for line in shell if "native" in line or "gcc" in line]


def test_template_states_the_packer_version_it_needs(packer):
    # required_plugins and `packer init` (the build command in docs/gcp.md) need Packer 1.7 or later.
    assert packer["packer"][0]["required_version"] == ">= 1.7.0"


@pytest.mark.skipif(
    not shutil.which("packer"), reason="no packer binary (Debian's `packer` package; .ci/run installs it)"
)
def test_packer_fmt_check_passes():
    proc = subprocess.run(["packer", "fmt", "-check", "-diff", str(TEMPLATE.parent)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
