"""Local "VMs" for the Compute stand-in: a metadata server and a guest per boot.

Each VM boot gets its own metadata server (instance name, zone, project,
``created-by`` = its MIG, ``instance-template``, the template's metadata
attributes, a token) and its own work folder (a fresh boot disk), and runs
tests/standins/guest.py: an init that runs the template's ``startup-script``
through a runner and, at a stop, signals only that runner and runs the
template's ``shutdown-script``, as GCE's guest environment does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.standins.compute import VM, ComputeStandin, Mig
from tests.standins.guest import kill_tree
from tests.standins.metadata import Instance, MetadataServer

GUEST = Path(__file__).resolve().parent / "guest.py"  # run as a script: stdlib only, no PYTHONPATH


class Guest:
    """One boot of a VM: its init process (tests/standins/guest.py) and its metadata server."""

    def __init__(self, proc: subprocess.Popen, folder: Path, metadata: MetadataServer):
        self.proc, self.folder, self.metadata = proc, folder, metadata

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, preempted: bool) -> None:
        if preempted:
            self.metadata.instance.preempted = True  # what a shutdown script can read
        if self.alive():
            self.proc.terminate()

    def power_off(self) -> None:
        if self.alive():
            kill_tree(self.proc.pid, include_root=True)
        self.proc.wait()

    def script_exit(self) -> int | None:
        try:
            return int((self.folder / "startup-exit").read_text())
        except (OSError, ValueError):
            return None


class LocalVMs:
    def __init__(self, root: Path, env: dict[str, str], project_number: str = "123456789012"):
        self.root, self.env, self.project_number = root, env, project_number
        self.boots: list[Path] = []  # every boot's folder, in order
        self.tokens: set[str] = set()  # every token a VM's metadata server handed out

    def __call__(self, standin: ComputeStandin, vm: VM, mig: Mig, template: dict) -> Guest:
        props = template["properties"]
        attributes = {i["key"]: i.get("value", "") for i in props.get("metadata", {}).get("items", [])}
        attributes["created-by"] = f"projects/{self.project_number}/{mig.scope}/instanceGroupManagers/{mig.name}"
        attributes["instance-template"] = f"projects/{self.project_number}/global/instanceTemplates/{mig.template}"
        account = (props.get("serviceAccounts") or [{}])[0]
        server = MetadataServer(
            Instance(
                vm.name,
                standin.project,
                vm.zone,
                attributes,
                self.project_number,
                account.get("email", "default@example.com"),
                tuple(account.get("scopes", ())),
            )
        ).start()
        vm.extra["metadata"] = server
        self.tokens.add(server.instance.token)
        folder = self.root / f"{vm.name}-boot{vm.boot}"
        folder.mkdir(parents=True)
        self.boots.append(folder)
        for key in ("startup-script", "shutdown-script"):
            if key in attributes:
                (folder / key).write_text(attributes[key])
        disk = str(folder / "disk")  # each boot its own disk, as a VM the MIG (re)creates has
        env = {k: v.replace("{disk}", disk) for k, v in self.env.items()}  # e.g. FLEET_PYTHON={disk}/venv/...
        env.update(GCE_METADATA_HOST=server.host, FLEET_WORK_DIR=disk)
        console = open(folder / "console.log", "wb")
        try:
            proc = subprocess.Popen(
                [sys.executable, str(GUEST), str(folder)],
                env=env,
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            console.close()
        return Guest(proc, folder, server)

    def gone(self, standin: ComputeStandin, vm: VM) -> None:
        server = vm.extra.pop("metadata", None)
        if server is not None:
            server.stop()

    def console(self) -> str:
        return "\n".join(f"--- {b.name}\n" + (b / "console.log").read_text(errors="replace") for b in self.boots)

    def world_writable(self) -> list[str]:
        bad = []
        for boot in self.boots:
            for dirpath, dirnames, filenames in os.walk(boot / "disk"):
                for name in dirnames + filenames:
                    path = os.path.join(dirpath, name)
                    if not os.path.islink(path) and os.stat(path).st_mode & 0o002:
                        bad.append(path)
        return bad
