"""Worker processes: one per core, each running fleet.core.spawner's Worker until the run is
drained; a fresh interpreter, so that no client state is shared across a fork (`fleet work`, whose
bucket's client has its pools and threads), or for `fleet local`, whose bucket is a folder, a fork
of the command's process (below); SIGTERM and Ctrl-C
give the item in hand back; the exit code says whether a process crashed (1) or said why in one
line (2), or found the run drained (3, a success).

`fleet work --procs N` lets its other processes go when one finds the run drained: the drain is
confirmed and the run's files written by then (fleet.core.spawner.Worker.end_run), so a SIGUSR1
ends the sleep of those idle between sweeps, which would each wait for the same word. It used to list the run
itself whenever a process left, spares included, and SIGTERM the others, one of them perhaps
in the middle of writing the run's files.

A store that stops answering (``Unavailable``: an outage, beyond the storage client's own
retries) is ridden out here, with backoff, for up to ``FLEET_OUTAGE_MINUTES`` (30): a worker
that left would take its VM with it for good, and an outage of a few minutes would shrink the
fleet for the rest of the run. The platform's time limit on the VM still ends it. Once the store
answers, the item in hand is given back (no attempt spent) and the claim loop starts afresh.

A worker is started as ``python -c`` by subprocess, not by multiprocessing's spawn: spawn also
starts a resource tracker process (for semaphores and shared memory, which no worker uses: one
that does gets its own, started on first use), pickles the parent's state to the child, and
runs the parent's main script again in it. Each is a Python start or an import of CPU on
every `fleet local`, and a worker needs only its arguments and the parent's sys.path.
This module imports the worker's code (spawner, attempt) only where a worker runs, so the
process that starts workers does not load it.

`fleet local` forks its workers instead: the command has already loaded what a worker needs (the
job's modules, numpy, a tokenizer library, fleet's own), which a fresh interpreter imports again,
0.3-0.5 s of CPU a worker. Only from a process with no other thread (``can_fork``): `fleet.local`
in a notebook, whose kernel has threads, starts fresh interpreters as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Callable, Mapping

from fleet.core.progress import every_from_env, worker_line

if TYPE_CHECKING:
    from fleet.core.spawner import Worker

log = logging.getLogger("fleet.worker")

DRAINED_EXIT = 3  # a worker process that found the run drained (fleet work: a success, and a signal to its siblings)
OUTAGE_ENV = "FLEET_OUTAGE_MINUTES"
DEFAULT_OUTAGE_MINUTES = 30.0
# The longest wait between two tries in an outage (jittered exponential backoff up to it): a
# minute. A knob for tests that scale an outage down to seconds, where a minute's backoff would
# be most of their time; not a setting for a fleet.
BACKOFF_ENV = "FLEET_OUTAGE_BACKOFF_SECONDS"
DEFAULT_BACKOFF_SECONDS = 60.0


def _env_number(name: str, default: float, ok: Callable[[float], bool], want: str) -> float:
    """A number from the environment, ``default`` where unset; a typo, NaN or a value ``ok`` refuses
    is a ValueError naming the variable and what to give."""
    value = os.environ.get(name, "").strip()
    try:
        number = float(value) if value else default
    except ValueError:
        number = math.nan
    if not ok(number):
        raise ValueError(f"{name}={value!r}: give {want}")
    return number


def outage_limit() -> float:
    """Seconds a worker waits for an unreachable store before it gives up (exit code 2)."""
    minutes = _env_number(
        OUTAGE_ENV, DEFAULT_OUTAGE_MINUTES, lambda m: m >= 0, "the minutes a worker waits for an unreachable bucket"
    )
    return minutes * 60


def _backoff_max() -> float:
    return _env_number(
        BACKOFF_ENV, DEFAULT_BACKOFF_SECONDS, lambda s: s > 0, "the longest wait between tries in an outage, in seconds"
    )


def riding_out(limit: float):
    """Call a function until it gets past the store's outage (Unavailable), with jittered exponential
    backoff up to a minute (many workers come back at once), for at most ``limit`` seconds; then the
    last Unavailable is raised. Each try is itself the storage client's retries."""
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

    from fleet.core.store import Unavailable

    def note(state) -> None:
        log.warning(
            "the bucket is unreachable (%s); trying again in %.0f s (gives up %.0f min after the outage began)",
            state.outcome.exception(),
            state.next_action.sleep,
            limit / 60,
        )

    return Retrying(
        retry=retry_if_exception_type(Unavailable),
        wait=wait_random_exponential(multiplier=1, max=_backoff_max()),
        stop=stop_after_delay(limit),
        before_sleep=note,
        reraise=True,
    )


def _back_from_outage(worker) -> None:
    """The store answers again: give back the item the outage interrupted (its lease unchanged, so
    no attempt is spent; taken by another meanwhile, nothing is written)."""
    from fleet.core.layout import spec_name

    worker.store.stat(spec_name(worker.run))  # raises Unavailable while the outage lasts
    held, worker.holding = worker.holding, None
    if held is not None:
        try:
            worker.runner.release(held)
        except BaseException:
            worker.holding = held
            raise
        log.info("the bucket answers again; item %s given back", held.item)


def _setup_logging(name: str, log_file: str | None) -> None:
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s {name} %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def _on_sigterm(signum, frame):
    # Once only: a second SIGTERM (a VM's shutdown signals every process, and startup.sh forwards
    # its own), or SIGTERM after Ctrl-C (fleet local stops its workers), must not interrupt the
    # release of the item being given back. A handler that does nothing, not SIG_IGN: a signal
    # already pending when the handler changes would otherwise raise "ignored due to race condition".
    signal.signal(signal.SIGTERM, _ignore)
    signal.signal(signal.SIGINT, _ignore)
    from fleet.core.attempt import SHIELD, Shutdown  # loaded by work_one, which set this handler

    # Noted before anything is raised: a claim in flight raises it when it has returned (the lease then
    # known, and given back); and a Shutdown raised inside a finalizer, which Python prints and drops
    # ("Exception ignored"), is raised again by the next claim instead of being lost.
    SHIELD.pending = True
    if SHIELD.depth:
        return
    raise Shutdown()


def _ignore(signum, frame):
    pass


def _unraisable(previous):
    """sys.unraisablehook for a worker: a Shutdown raised inside a finalizer is no error to print
    ("Exception ignored ... Shutdown" at the user), since _on_sigterm noted the stop before raising
    it; anything else goes to the hook that was there."""

    def hook(unraisable) -> None:
        from fleet.core.attempt import Shutdown

        if not isinstance(unraisable.exc_value, Shutdown):
            previous(unraisable)

    return hook


def _quiet_signals() -> None:
    """SIGTERM, Ctrl-C and SIGUSR1 ignored from here on, for a worker that holds nothing any more.
    The first of them to land while the handlers are replaced raises its Shutdown here (the
    worker's handlers raise once, then ignore): it says nothing now and is swallowed."""
    from fleet.core.attempt import Shutdown

    for _ in range(2):
        try:
            signal.signal(signal.SIGTERM, _ignore)
            signal.signal(signal.SIGINT, _ignore)
            signal.signal(signal.SIGUSR1, _ignore)
            return
        except Shutdown:
            continue


def work_one(
    bucket: str, run: str, name: str | None = None, log_file: str | None = None, standby: int | None = None
) -> int:
    """One worker process until the run is drained; exit code 0 unless it crashed.

    A problem that is the user's, the store's or the machine's (no such run or bucket, 403,
    a bad or changed vocab, an unknown job, a full disk) is one log line and exit code 2,
    never a traceback; an item in hand is given back first."""
    return _work_one(bucket, run, name, log_file, standby)[0]


def _stop_if_sleeping(worker) -> None:
    """SIGUSR1 (from `fleet work`: a sibling found the run drained): a worker asleep between idle
    sweeps holds nothing and leaves now; one at work, or writing the run's files, goes on."""
    from fleet.core.attempt import SHIELD, Shutdown

    if worker.sleeping and not SHIELD.depth:
        raise Shutdown()


class _Life:
    """What a worker process has made so far, for _work_one to undo whichever line it stops on."""

    def __init__(self) -> None:
        self.worker: Worker | None = None
        self.progress: _ProgressLog | None = None
        self.result: tuple[int, bool] | None = None

    def end(self) -> None:
        if self.progress is not None:
            self.progress.stop.set()
        if self.worker is not None:
            self.worker.close()


def _work_one(bucket: str, run: str, name: str | None, log_file: str | None, standby: int | None) -> tuple[int, bool]:
    """work_one's exit code, and whether the worker left because it found the run drained.

    The worker's handlers turn the first SIGTERM or Ctrl-C into a Shutdown, and ignore the rest.
    Where it lands decides what it means: the places that hold a lease (a claim, an item, the drain
    loop) catch it and give the item back; on any other line the worker holds nothing, and the
    catch here, whose try begins before the handlers exist, makes it a plain stop. It once came
    between the drain loop's end and the quieting of the handlers: a traceback and exit 1 for a
    worker that held nothing (tests/test_run_state.py sends one at every line of this module)."""
    from fleet.core.attempt import SHIELD, Shutdown

    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    life = _Life()
    hook = sys.unraisablehook
    sys.unraisablehook = _unraisable(hook)
    try:
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
            signal.signal(signal.SIGINT, _on_sigterm)  # Ctrl-C reaches every process of the group: same as SIGTERM
            # SIGUSR1's default would kill a worker still starting (see _stop_if_sleeping)
            signal.signal(signal.SIGUSR1, _ignore)
            life.result = _live(bucket, run, name, log_file, standby, life)
        finally:
            # Leaving: nothing is held any more, so a SIGTERM now (`fleet local` stops its workers once the
            # run is finished) must not interrupt the scratch sweep with a Shutdown and a traceback.
            _quiet_signals()
    except Shutdown:  # (the handlers are quiet now: _on_sigterm quieted them before it raised)
        log.info("stopped by a signal; it held nothing")
        if life.result is None:
            life.result = 0, life.worker is not None and life.worker.found_drained
    finally:
        life.end()
        SHIELD.pending = False  # (the worker is gone: nothing of this process claims for it any more)
        sys.unraisablehook = hook
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    return life.result


def _live(
    bucket: str, run: str, name: str | None, log_file: str | None, standby: int | None, life: _Life
) -> tuple[int, bool]:
    """The worker's life from its making to the run's drain, under the signal handlers _work_one set."""
    import gc

    from fleet.core.attempt import Environment, Shutdown, environmental
    from fleet.core.errors import ConfigError, JobNotFound
    from fleet.core.run import PlanError
    from fleet.core.spawner import Worker
    from fleet.core.store import StoreError, Unavailable

    try:
        limit = outage_limit()
        _setup_logging(name or "worker", log_file)  # (what riding out says before the worker is made)
        worker = life.worker = riding_out(limit)(Worker, bucket, run, name, standby=standby)
    except ValueError as e:
        _setup_logging(name or "worker", log_file)
        log.error("cannot start: %s", e)
        return 2, False
    except Shutdown:
        return 0, False
    except (PlanError, ConfigError, JobNotFound, StoreError) as e:
        _setup_logging(name or "worker", log_file)
        log.error("cannot start: %s", e)
        return 2, False
    except OSError as e:
        _setup_logging(name or "worker", log_file)
        log.error("cannot start: %s", environmental(e) or e)
        return 2, False
    try:
        # In the try: a SIGTERM as the worker sets up (`fleet local` stops a worker whose sibling
        # finished the run as it started) is a stop like any other, not a traceback.
        _setup_logging(worker.name, log_file)
        signal.signal(signal.SIGUSR1, lambda signum, frame: _stop_if_sleeping(worker))
        life.progress = _ProgressLog(worker)
        life.progress.start()
        # What the worker loaded lives as long as it does (modules, the job's vocab and tokenizer): kept
        # out of the collector's reach, so its full collections no longer walk them while items convert.
        gc.freeze()
        while True:
            try:
                counters = worker.run_until_drained()
                break
            except Unavailable as e:
                log.warning("the bucket is unreachable (%s): waiting for it, up to %.0f min", e, limit / 60)
                riding_out(limit)(_back_from_outage, worker)
    except Shutdown:
        if worker.stopped_after_the_end():  # (the fleet deleted once the run ended: a done boot)
            worker.mark_idle(False)
            worker.beat("exited")
            return 0, True
        held = worker.holding
        if held is not None and held.lease.live(time.time()):
            try:  # the signal came after the claim, before process() could give it back
                worker.runner.release(held)
            except StoreError as e:  # (in an outage: then its lease expires)
                log.warning("item %s not given back: %s", held.item, e)
        worker.mark_idle(False)
        worker.beat("stopped")
        log.info("stopped by a signal; items given back")
        return 0, False
    except Environment as e:
        log.error("stopped: %s", e)
        worker.mark_idle(False)
        worker.beat("stopped")
        return 2, False
    except Unavailable as e:  # unreachable for longer than the limit
        log.error("stopped: the bucket was unreachable for over %.0f min (%s): %s", limit / 60, OUTAGE_ENV, e)
        return 2, False
    except StoreError as e:  # retries (fleet.core.store.gcs) are spent: the store is gone or refuses us
        log.error("stopped: %s", e)
        worker.beat("stopped")
        return 2, False
    except OSError as e:
        reason = environmental(e)
        if reason is None:
            raise
        log.error("stopped: %s", reason)
        return 2, False
    log.info("drained: %d done, %d failed here", counters.items_done, counters.items_failed)
    return 0, worker.found_drained


class _ProgressLog(threading.Thread):
    """A line in the worker's log at a steady interval (fleet.core.progress): what it has done
    since it started and the item in its hands, read from its counters, at no request."""

    def __init__(self, worker: Worker):
        super().__init__(daemon=True, name="progress")
        self.worker = worker
        self.every = every_from_env()
        self.stop = threading.Event()

    def run(self) -> None:
        w = self.worker
        while not self.stop.wait(self.every):
            c = w.counters
            log.info(worker_line(c.items_done, c.items_failed, c.bytes_done, time.time() - w.started, w.runner.current))


def _child(bucket: str, run: str, name: str, log_file: str | None, standby: int | None = None) -> None:
    """A worker process's body. A crash says which worker it was above its traceback and exits 1,
    as multiprocessing's children did."""
    try:
        code, found_drained = _work_one(bucket, run, name, log_file, standby)
        if code == 0 and found_drained:
            code = DRAINED_EXIT
        # Ignored by the kernel from here: the interpreter's finalisation would put back the default,
        # which kills, and `fleet work` signals the others when one leaves drained.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    except SystemExit:
        raise
    except BaseException:
        import traceback

        sys.stderr.write(f"Process {name}:\n")
        traceback.print_exc()
        code = 1
    raise SystemExit(code)


# What a worker process runs: the parent's sys.path (so a job it can import, the child can), then _child.
_CHILD_CODE = (
    "import sys; from json import loads; a = loads(sys.argv[1]); sys.path[:] = a['path']; "
    "from fleet.core.processes import _child; _child(*a['args'])"
)


# fleet calls no BLAS routine and runs a process per core, yet numpy's OpenBLAS starts a thread per
# core when numpy is imported, and they spin before they sleep: 0.1-0.15 s of CPU in every process
# here (`python -c "import numpy"`: 0.34 s, 0.18-0.24 s with one thread). Values a user set win.
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def one_blas_thread(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the BLAS pools at one thread, unless it says otherwise."""
    return {**ONE_BLAS_THREAD, **environ}


def can_fork() -> bool:
    """Whether this process may start its workers by fork: Linux, and no thread but this one,
    Python's or a native library's (a fork copies only the calling thread, so a lock another
    held would stay held in the child: a notebook's kernel, a storage client's pool, a BLAS pool
    the user asked for with OPENBLAS_NUM_THREADS)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no /proc: not Linux (macOS forks badly once its frameworks are loaded)
        return False


class _Forked:
    """The calls WorkerProcess makes of a ``subprocess.Popen``, for a child made by ``os.fork``:
    ``pid``, ``poll``, ``wait`` (the exit code, -N when signal N ended it) and ``kill``."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def _reaped(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped already (a SIGCHLD handler of the caller's): its code is lost
                self.returncode = 1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._reaped(os.WNOHANG)

    def wait(self) -> int:
        code = self._reaped(0)
        assert code is not None
        return code

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _fork_child(args: tuple) -> _Forked:
    """``_child(*args)`` in a forked copy of this process, which leaves by ``os._exit`` (never by
    this process's own exit: its atexit calls, finalizers and buffered output are the parent's).
    The child starts as a fresh interpreter would: default SIGTERM and Ctrl-C until the worker
    sets its own, stdin at /dev/null, the BLAS pools at one thread (for a numpy imported later)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return _Forked(pid)
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.update(one_blas_thread(os.environ))
        _child(*args)
    except SystemExit as e:  # how _child always leaves, with an int
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # (a Ctrl-C before the worker set its handlers)
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


class WorkerProcess:
    """A started worker process, as `fleet local` and `fleet work` watch and stop it: ``pid``,
    ``exitcode`` (None while it runs; -N when signal N ended it), ``is_alive``, ``join``,
    ``kill``, and ``sentinel``, a file descriptor that turns readable when the process ends (the
    read end of a pipe whose write end only the child holds).

    ``fork``: a copy of this process (``os.fork``), which has the modules this one loaded (the
    job's, numpy, fleet's) and imports none of them again; otherwise a fresh interpreter."""

    def __init__(self, name: str, args: tuple, fork: bool = False):
        read, write = os.pipe()
        try:
            if fork:
                self.popen: subprocess.Popen | _Forked = _fork_child(args)
            else:
                flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]  # (no stub; multiprocessing uses it)
                cmd = [sys.executable, *flags, "-c", _CHILD_CODE, json.dumps({"path": sys.path, "args": args})]
                # stdin as a spawned child has it: nothing to read (a worker never asks the terminal).
                self.popen = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, pass_fds=(write,), env=one_blas_thread(os.environ)
                )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self.name = name
        self.sentinel = read
        weakref.finalize(self, os.close, read)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        """Until the process ends, or ``timeout`` seconds: one wait on the sentinel, not a poll."""
        if timeout is not None and self.popen.poll() is None:
            with selectors.DefaultSelector() as selector:
                selector.register(self.sentinel, selectors.EVENT_READ)
                if not selector.select(max(0.0, timeout)):
                    return
        self.popen.wait()  # ended (or asked to wait for it): reaped at once

    def kill(self) -> None:
        self.popen.kill()


def start_workers(
    bucket: str,
    run: str,
    procs: int,
    log_dir: str | None = None,
    prefix: str | None = None,
    standby: int | None = None,
    fork: bool = False,
) -> list[WorkerProcess]:
    """Start worker processes: fresh interpreters, so that no client state is shared across a
    fork; or, with ``fork`` where this process may (``can_fork``), copies of it, which start
    with its modules loaded, the worker's own code included."""
    base = prefix or f"{socket.gethostname()}-{uuid.uuid4().hex[:4]}"
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    fork = fork and can_fork()
    if fork:  # loaded once here, not once in each child
        import fleet.core.attempt
        import fleet.core.spawner  # noqa: F401
    children = []
    for i in range(procs):
        name = f"{base}-w{i}"
        log_file = os.path.join(log_dir, f"{name}.log") if log_dir else None
        children.append(WorkerProcess(name, (bucket, run, name, log_file, standby), fork=fork))
    return children


def wait_for_exit(children: list[WorkerProcess], timeout: float) -> None:
    """Until one of the running children ends, or ``timeout`` seconds."""
    with selectors.DefaultSelector() as selector:
        for c in children:
            if c.is_alive():
                selector.register(c.sentinel, selectors.EVENT_READ)
        if selector.get_map():
            selector.select(timeout)


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


def work(
    bucket: str,
    run: str,
    procs: int = 1,
    log_dir: str | None = None,
    prefix: str | None = None,
    standby: int | None = None,
    drained_file: str | None = None,
) -> int:
    """Run `procs` worker processes (one per core is right: conversion is CPU-bound). ``drained_file``:
    created when one of them found the run drained (a listing of every lease and marker said so),
    so that the caller (startup.sh) need not list the run again to know."""
    if procs == 1:
        name = f"{prefix or socket.gethostname() + '-' + uuid.uuid4().hex[:4]}-w0"
        code, found = _work_one(bucket, run, name, os.path.join(log_dir, f"{name}.log") if log_dir else None, standby)
        if found:
            _say_drained(drained_file)
        return code
    children = start_workers(bucket, run, procs, log_dir, prefix, standby)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop_workers(children))
    try:
        pending = list(children)
        while pending:
            for c in list(pending):
                c.join(0.2)
                if c.is_alive():
                    continue
                pending.remove(c)
                if c.exitcode == DRAINED_EXIT:
                    _say_drained(drained_file)
                    # It listed every lease and marker: the others that sleep between idle sweeps
                    # leave now, and do not list the run again each; one writing the run's files
                    # finishes them (a SIGTERM would leave the run without them).
                    for other in pending:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(other.pid, signal.SIGUSR1)
    except KeyboardInterrupt:  # Ctrl-C reached the children too: they give their items back
        stop_workers(children)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    # A SIGUSR1 kills only a process that holds nothing: one still starting (before its handler is
    # set) or leaving (the interpreter's finalisation puts the default back): both are fine.
    benign = (-signal.SIGTERM, -signal.SIGUSR1, DRAINED_EXIT)
    failed = [c.exitcode for c in children if c.exitcode and c.exitcode not in benign]
    if not failed:
        return 0
    return 2 if all(code == 2 for code in failed) else 1  # 2: each said why in one line (work_one)


def _say_drained(path: str | None) -> None:
    if path:
        with contextlib.suppress(OSError):  # advisory: without it, the standbys or the last VM out end the fleet
            open(path, "w").close()
