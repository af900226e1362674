"""A fault-injecting HTTP proxy to put in front of fake-gcs-server.

Point ``STORAGE_EMULATOR_HOST`` at it and the storage client sees, on a share
of its requests, what Cloud Storage and the network do now and then:

- ``429``, ``500``, ``503``: an error answer; the request never reached the server.
- ``drop``: the connection closes before any answer; the request never reached the server.
- ``lost``: the request is applied by the server, then the connection closes
  before the answer (so a conditional create retried by the client sees 412
  on an object it wrote itself).

Besides random faults it follows a script: the first N requests that match
a rule get a given fault (to make, say, the lost-create case certain rather
than likely), and it answers 403 to requests that match a ``forbid`` rule (a
bucket or object the worker may not read). Loopback only; a thread per connection.

    proxy = FaultProxy(upstream, rate=0.2).start()   # proxy.url -> STORAGE_EMULATOR_HOST
    FaultProxy(upstream, script=[(is_conditional_create, "lost", 3)])
    ...
    proxy.stop(); proxy.counts                        # {"requests": .., "429": .., "lost": ..}

Run alone: ``python tests/standins/faultproxy.py --upstream http://127.0.0.1:P --rate 0.05``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import threading
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

FAULTS = ("429", "500", "503", "drop", "lost")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
}

Rule = Callable[[str, str], bool]  # (method, path with query) -> matches


def is_conditional_create(method: str, path: str) -> bool:
    """A multipart upload with ifGenerationMatch=0: how leases are claimed."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    return method == "POST" and "/upload/" in path and query.get("ifGenerationMatch") == ["0"]


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        rate: float = 0.0,
        faults: tuple[str, ...] = FAULTS,
        seed: int = 0,
        script: list[tuple[Rule, str, int]] = (),
        forbid: Rule | None = None,
        guard: Callable[[str, str, dict, bytes], tuple[int, dict] | None] | None = None,
    ):
        split = urllib.parse.urlsplit(upstream)
        if split.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"upstream {upstream!r}: loopback only")
        unknown = (set(faults) | {fault for _, fault, _ in script}) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        self.upstream = (split.hostname, split.port or 80)
        self.rate, self.faults = rate, tuple(faults)
        self.script = [[rule, fault, count] for rule, fault, count in script]
        self.forbid = forbid
        self.guard = guard  # (method, path, headers, body) -> an answer instead of forwarding (tests/standins/iam.py)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.lost_paths: list[str] = []  # requests applied upstream whose answer was withheld
        self.statuses: list[tuple[str, str, int]] = []  # (method, path, upstream status) of forwarded requests
        self._server: ThreadingHTTPServer | None = None

    # -- decisions ------------------------------------------------------------------
    def _decide(self, method: str, path: str) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            if self.forbid and self.forbid(method, path):
                fault = "403"
            else:
                entry = next((e for e in self.script if e[2] > 0 and e[0](method, path)), None)
                if entry:
                    entry[2] -= 1
                    fault = entry[1]
                elif self.rate and self._rng.random() < self.rate:
                    fault = self._rng.choice(self.faults)
                else:
                    return None
            self.counts[fault] += 1
            return fault

    # -- life -------------------------------------------------------------------------
    def start(self, port: int = 0) -> "FaultProxy":
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FaultProxy":
        return self if self._server else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format, *args):  # quiet
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionError, TimeoutError):  # the client hung up (or we dropped it): nothing to tell
            pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _drop(self) -> None:
        """Close without an answer; RST rather than FIN so the client cannot mistake it for an answer."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _answer(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int) -> None:
        reason = {403: "forbidden", 429: "rateLimitExceeded", 500: "backendError", 503: "backendError"}[status]
        message = {
            403: "Access denied (fault proxy)",
            429: "Too many requests (fault proxy)",
            500: "Internal error (fault proxy)",
            503: "Service unavailable (fault proxy)",
        }[status]
        body = json.dumps(
            {"error": {"code": status, "message": message, "errors": [{"reason": reason, "message": message}]}}
        ).encode()
        self._answer(status, body, [("Content-Type", "application/json")])

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        for attempt in (1, 2):  # a pooled upstream connection may have gone stale
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            try:
                self._upstream.request(self.command, self.path, body=body, headers=headers)
                resp = self._upstream.getresponse()
                data = resp.read()
            except (ConnectionError, http.client.HTTPException):
                self._upstream.close()
                self._upstream = None
                if attempt == 2:
                    raise
                continue
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            return resp.status, kept, data
        raise AssertionError("unreachable")

    def _handle(self) -> None:
        body = self._body()
        if self.owner.guard is not None:
            answer = self.owner.guard(self.command, self.path, dict(self.headers.items()), body)
            if answer is not None:
                self._answer(answer[0], json.dumps(answer[1]).encode(), [("Content-Type", "application/json")])
                return
        fault = self.owner._decide(self.command, self.path)
        if fault in ("403", "429", "500", "503"):
            self._error(int(fault))
            return
        if fault == "drop":
            self._drop()
            return
        status, headers, data = self._forward(body)
        with self.owner._lock:
            self.owner.statuses.append((self.command, self.path, status))
            if fault == "lost":
                self.owner.lost_paths.append(f"{self.command} {self.path} -> {status}")
        if fault == "lost":
            self._drop()
            return
        self._answer(status, data, headers)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self._upstream is not None:
                self._upstream.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="fake-gcs-server URL, e.g. http://127.0.0.1:4443")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.05, help="share of requests that get a fault")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    proxy = FaultProxy(args.upstream, args.rate, tuple(args.faults.split(",")), args.seed).start(args.port)
    print(proxy.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.stop()
        print(dict(proxy.counts))


if __name__ == "__main__":
    main()
