"""The worker loop a VM (or `fleet local`) runs: claim, convert, commit, leave.

Each worker process visits the items in its own shuffled order, so many
workers do not all contend for the same lease object, and stops when every
item is done or failed. While it converts an item a thread renews the lease;
if renewal finds the lease taken over, the conversion is stopped at the next
document and its work discarded, so a stale worker never commits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import random
import signal
import socket
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import BinaryIO, Iterable, Iterator

from fleet.inputs import read_slice
from fleet.job import InputError, ItemContext, Sink, item_seed, load_job
from fleet.lease import Held, Lease, Leases, Lost
from fleet.run import Item, RunSpec, lease_prefix, load_items, load_spec, worker_prefix
from fleet.store import Store, open_store, read_url

log = logging.getLogger("fleet.worker")


class Shutdown(BaseException):
    """SIGTERM (preemption, `fleet down`): give the item back and leave."""


class DirSink(Sink):
    def __init__(self, folder: str):
        self.folder = folder
        self.files: list[tuple[str, str]] = []  # (suffix, local path)

    def open(self, suffix: str) -> BinaryIO:
        if any(s == suffix for s, _ in self.files) or "/" in suffix:
            raise ValueError(f"output suffix {suffix!r} used twice or contains '/'")
        path = os.path.join(self.folder, f"out-{len(self.files)}")
        self.files.append((suffix, path))
        return open(path, "wb")


def output_name(item: str, suffix: str) -> str:
    return f"part-{item}{suffix}"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Renewer(threading.Thread):
    """Renews a held lease every ttl/3 until stopped; flags loss of the lease."""

    def __init__(self, leases: Leases, held: Held):
        super().__init__(daemon=True)
        self.leases, self.held = leases, held
        self.stop = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        interval = max(0.05, self.leases.ttl / 3)
        while not self.stop.wait(interval):
            try:
                self.leases.renew(self.held)
            except Lost:
                self.lost.set()
                return
            except Exception as e:  # a store hiccup: keep trying until the lease would expire
                log.warning("renewing %s failed: %s", self.held.item, e)
                if time.time() > self.held.lease.expires:
                    self.lost.set()
                    return

    def finish(self) -> None:
        self.stop.set()
        self.join()


@dataclass
class Counters:
    items_done: int = 0
    items_failed: int = 0
    items_lost: int = 0
    bytes_done: int = 0
    started: float = field(default_factory=time.time)


class Worker:
    def __init__(self, bucket: str, run: str, name: str | None = None, poll: float | None = None):
        self.store: Store = open_store(bucket)
        self.run = run
        self.spec: RunSpec = load_spec(self.store, run)
        self.items: list[Item] = load_items(self.store, run)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.leases = Leases(self.store, lease_prefix(run), self.name, self.spec.lease_ttl, self.spec.max_attempts)
        self.poll = poll if poll is not None else min(10.0, max(0.2, self.spec.lease_ttl / 6))
        self.output = open_store(self.spec.output)
        self.counters = Counters()
        self.job = load_job(self.spec.job)
        self.config = self.job.parse_config(self.spec.config)
        self.converter = self.job.converter(self.config, read_url)
        self.current: str | None = None

    # -- heartbeat -------------------------------------------------------------
    def beat(self, state: str) -> None:
        body = {"worker": self.name, "host": socket.gethostname(), "pid": os.getpid(), "state": state,
                "item": self.current, "updated": time.time(), **self.counters.__dict__}
        try:
            self.store.write(worker_prefix(self.run) + self.name, json.dumps(body, sort_keys=True).encode())
        except Exception as e:  # a heartbeat is advisory; never let it stop the work
            log.warning("heartbeat failed: %s", e)

    # -- one item ----------------------------------------------------------------
    def _documents(self, item: Item, workdir: str, renewer: _Renewer) -> Iterator[list[str]]:
        for doc in read_slice(item.slice, workdir):
            if renewer.lost.is_set():
                raise Lost(f"item {item.id}: lease taken over")
            yield doc

    def process(self, item: Item, held: Held) -> None:
        self.current = item.id
        self.beat("working")
        t0 = time.time()
        renewer = _Renewer(self.leases, held)
        renewer.start()
        try:
            with tempfile.TemporaryDirectory(prefix=f"fleet-{item.id}-") as workdir:
                sink = DirSink(workdir)
                ctx = ItemContext(item.id, item_seed(self.config_seed(), item.id), item.slice.display)
                stats = dict(self.converter.convert(self._documents(item, workdir, renewer), ctx, sink))
                outputs = []
                for suffix, path in sink.files:
                    if renewer.lost.is_set():
                        raise Lost(f"item {item.id}: lease taken over")
                    name = output_name(item.id, suffix)
                    self.output.upload_file(name, path)
                    outputs.append({"name": name, "size": os.path.getsize(path), "sha256": _sha256(path)})
            renewer.finish()
            if renewer.lost.is_set():
                raise Lost(f"item {item.id}: lease taken over")
            stats.update(input_bytes=item.size, seconds=round(time.time() - t0, 3))
            self.leases.commit(held, outputs, stats)
            self.counters.items_done += 1
            self.counters.bytes_done += item.size
            log.info("item %s done in %.1fs (%s)", item.id, time.time() - t0, item.slice.display)
        except Lost as e:
            renewer.finish()
            self.counters.items_lost += 1
            log.warning("%s; discarding its work", e)
        except InputError as e:
            renewer.finish()
            self.leases.fail(held, str(e), retry=False)
            self.counters.items_failed += 1
            log.error("item %s failed: %s", item.id, e)
        except Shutdown:
            renewer.finish()
            self.leases.release(held)
            raise
        except Exception as e:
            renewer.finish()
            message = f"{item.slice.display}: {type(e).__name__}: {e}".splitlines()[0]
            final = self.leases.fail(held, message, retry=True)
            if final:
                self.counters.items_failed += 1
            log.error("item %s attempt %d failed%s: %s\n%s", item.id, held.lease.attempt,
                      " for good" if final else "", message, traceback.format_exc())
        finally:
            self.current = None

    def config_seed(self) -> int:
        return int(getattr(self.config, "seed", 0) or 0)

    # -- the loop ------------------------------------------------------------------
    def run_until_drained(self) -> Counters:
        """Visit items until all are done or failed.

        One listing per pass gives every lease's generation; a lease is read
        again only when its generation changed, so an idle pass costs one
        list call, and an expired lease is taken over on the generation seen.
        """
        order = list(self.items)
        random.Random(self.name).shuffle(order)
        terminal: set[str] = set()
        known: dict[str, tuple[Lease, int]] = {}
        prefix = lease_prefix(self.run)
        self.beat("starting")
        while True:
            listing = {b.name[len(prefix):]: b.generation for b in self.store.list(prefix)}
            worked = False
            for item in order:
                if item.id in terminal:
                    continue
                current = None
                gen = listing.get(item.id)
                if gen is not None:
                    current = known.get(item.id)
                    if current is None or current[1] != gen:
                        current = self.leases.read(item.id)
                        if current is not None:
                            known[item.id] = current
                    if current is not None:
                        if current[0].terminal:
                            terminal.add(item.id)
                            continue
                        if current[0].live(time.time()):
                            continue
                got = self.leases.claim(item.id, current)
                if isinstance(got, Held):
                    self.process(item, got)
                    worked = True
                    known[item.id] = (got.lease, got.generation)
                    if got.lease.terminal:
                        terminal.add(item.id)
                elif isinstance(got, Lease) and got.terminal:
                    terminal.add(item.id)
            if len(terminal) == len(self.items):
                self.beat("exited")
                return self.counters
            if not worked:
                self.beat("idle")
                time.sleep(self.poll * random.uniform(0.8, 1.2))


def _setup_logging(name: str, log_file: str | None) -> None:
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s {name} %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def _on_sigterm(signum, frame):
    raise Shutdown()


def work_one(bucket: str, run: str, name: str | None = None, log_file: str | None = None) -> int:
    """One worker process until the run is drained; exit code 0 unless it crashed."""
    worker = Worker(bucket, run, name)
    _setup_logging(worker.name, log_file)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        counters = worker.run_until_drained()
    except Shutdown:
        worker.beat("stopped")
        log.info("stopped by SIGTERM")
        return 0
    log.info("drained: %d done, %d failed here", counters.items_done, counters.items_failed)
    return 0


def _child(bucket: str, run: str, name: str, log_file: str | None) -> None:
    raise SystemExit(work_one(bucket, run, name, log_file))


def start_workers(bucket: str, run: str, procs: int, log_dir: str | None = None,
                  prefix: str | None = None) -> list[multiprocessing.process.BaseProcess]:
    """Start worker processes (spawned, so no client state is shared across a fork)."""
    base = prefix or f"{socket.gethostname()}-{uuid.uuid4().hex[:4]}"
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    children = []
    for i in range(procs):
        name = f"{base}-w{i}"
        log_file = os.path.join(log_dir, f"{name}.log") if log_dir else None
        child = ctx.Process(target=_child, args=(bucket, run, name, log_file), name=name)
        child.start()
        children.append(child)
    return children


def stop_workers(children: list, timeout: float = 10.0) -> None:
    """SIGTERM (each gives its item back), then SIGKILL whatever is left."""
    for c in children:
        if c.is_alive():
            with contextlib.suppress(Exception):
                os.kill(c.pid, signal.SIGTERM)
    deadline = time.time() + timeout
    for c in children:
        c.join(max(0.0, deadline - time.time()))
        if c.is_alive():
            c.kill()
            c.join()


def work(bucket: str, run: str, procs: int = 1, log_dir: str | None = None, prefix: str | None = None) -> int:
    """Run `procs` worker processes (one per core is right: conversion is CPU-bound)."""
    if procs == 1:
        name = f"{prefix or socket.gethostname() + '-' + uuid.uuid4().hex[:4]}-w0"
        return work_one(bucket, run, name, os.path.join(log_dir, f"{name}.log") if log_dir else None)
    children = start_workers(bucket, run, procs, log_dir, prefix)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop_workers(children))
    try:
        for c in children:
            c.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if all(c.exitcode == 0 for c in children) else 1
