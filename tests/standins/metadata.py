"""A GCE metadata server for one "VM": identity, attributes and a service-account token.

Like the real one it answers only requests carrying ``Metadata-Flavor: Google``
and marks its answers with the same header; ``?recursive=true`` gives JSON.
Each VM gets its own server (its own port), as each real VM sees only itself.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

ROOT = "/computeMetadata/v1/"


@dataclass
class Instance:
    name: str
    project: str
    zone: str
    attributes: dict[str, str]
    project_number: str = "123456789012"
    email: str = "fleet-worker@example.iam.gserviceaccount.com"
    scopes: tuple[str, ...] = ()
    token: str = field(default_factory=lambda: "ya29.standin-" + uuid.uuid4().hex)
    preempted: bool = False
    id: str = field(default_factory=lambda: str(uuid.uuid4().int % 10**19))


class _Handler(BaseHTTPRequestHandler):
    server: "MetadataServer"

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body, json_body: bool = False) -> None:
        data = (json.dumps(body) if json_body else str(body)).encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/json" if json_body else "application/text")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, "Missing required header: Metadata-Flavor")
        url = urlparse(self.path)
        recursive = parse_qs(url.query).get("recursive", ["false"])[0] == "true"
        if not url.path.startswith(ROOT):
            return self._send(404, "not found")
        value = self.server.lookup(url.path[len(ROOT) :].rstrip("/"), recursive)
        if value is None:
            return self._send(404, "not found")
        self.server.record(url.path[len(ROOT) :])
        self._send(200, value, json_body=not isinstance(value, str))

    do_POST = do_GET  # google-auth may POST for bound tokens


class MetadataServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, instance: Instance):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.instance = instance
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        """What GCE_METADATA_HOST takes: host:port, no scheme."""
        return f"127.0.0.1:{self.server_address[1]}"

    def start(self) -> "MetadataServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def record(self, path: str) -> None:
        with self._lock:
            self.requests.append(path)

    def lookup(self, path: str, recursive: bool):
        i = self.instance
        account = {"aliases": ["default"], "email": i.email, "scopes": list(i.scopes)}
        flat = {
            "instance/name": i.name,
            "instance/hostname": f"{i.name}.{i.zone}.c.{i.project}.internal",
            "instance/id": i.id,
            "instance/zone": f"projects/{i.project_number}/zones/{i.zone}",
            "instance/preempted": "TRUE" if i.preempted else "FALSE",
            "project/project-id": i.project,
            "project/numeric-project-id": i.project_number,
            "instance/service-accounts/default/email": i.email,
            "instance/service-accounts/default/scopes": "\n".join(i.scopes),
        }
        if path in flat:
            return flat[path]
        if path == "instance/service-accounts/default/token":
            return {"access_token": i.token, "expires_in": 3599, "token_type": "Bearer"}
        if path == "instance/service-accounts/default":
            return account if recursive else "aliases\nemail\nscopes\ntoken\n"
        if path == "instance/service-accounts":
            return {"default": account, i.email: account} if recursive else f"default/\n{i.email}/\n"
        if path == "instance/attributes":
            return dict(i.attributes) if recursive else "".join(k + "\n" for k in i.attributes)
        if path.startswith("instance/attributes/"):
            return i.attributes.get(path[len("instance/attributes/") :])
        return None
