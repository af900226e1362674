"""Local "VMs" for the Compute stand-in: a metadata server and the template's startup script.

Each VM boot gets its own metadata server (instance name, zone, project,
``created-by`` = its MIG, the template's metadata attributes, a token) and its
own work folder (a fresh boot disk), and runs ``bash <startup-script>`` taken
from the template's metadata, as GCE would, in its own process group so that
the stand-in can stop it (SIGTERM, then SIGKILL) or preempt it (SIGKILL).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.standins.compute import VM, ComputeStandin, Mig
from tests.standins.metadata import Instance, MetadataServer


class LocalVMs:
    def __init__(self, root: Path, env: dict[str, str], project_number: str = "123456789012"):
        self.root, self.env, self.project_number = root, env, project_number
        self.boots: list[Path] = []  # every boot's folder, in order
        self.tokens: set[str] = set()  # every token a VM's metadata server handed out

    def __call__(self, standin: ComputeStandin, vm: VM, mig: Mig, template: dict) -> subprocess.Popen:
        props = template["properties"]
        attributes = {i["key"]: i.get("value", "") for i in props.get("metadata", {}).get("items", [])}
        attributes["created-by"] = f"projects/{self.project_number}/{mig.scope}/instanceGroupManagers/{mig.name}"
        account = (props.get("serviceAccounts") or [{}])[0]
        server = MetadataServer(Instance(vm.name, standin.project, vm.zone, attributes, self.project_number,
                                         account.get("email", "default@example.com"),
                                         tuple(account.get("scopes", ())))).start()
        vm.extra["metadata"] = server
        self.tokens.add(server.instance.token)
        folder = self.root / f"{vm.name}-boot{vm.boot}"
        folder.mkdir(parents=True)
        self.boots.append(folder)
        script = folder / "startup-script"
        script.write_text(attributes["startup-script"])
        env = dict(self.env, GCE_METADATA_HOST=server.host, FLEET_WORK_DIR=str(folder / "disk"))
        console = open(folder / "console.log", "wb")
        try:
            return subprocess.Popen(["bash", str(script)], env=env, cwd=folder, stdin=subprocess.DEVNULL,
                                    stdout=console, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            console.close()

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
