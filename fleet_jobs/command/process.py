"""One run of a program for one item: kept by a subreaper, watched, ended whole, its output
read to a bounded tail.

The program runs under reaper.py, a process of its own that is a child subreaper: everything
the program starts stays below it, a ``setsid`` daemon or a double fork included, and it ends
them all before it exits (see its docstring for why a keeper rather than the worker). The
watcher here wakes a few times a second to call ``ctx.checkpoint`` (which raises once the
item's lease is lost) and to enforce the timeout; then, as for a Shutdown (SIGTERM, Ctrl-C)
raised in the worker's main thread while it waits, it sends the keeper SIGTERM, and the keeper
ends the tree (SIGTERM, SIGKILL after the grace period) and exits.

Nothing the program prints goes to disk: stdout is /dev/null, as the docs promise (nothing
reads it), and stderr is a pipe read in big chunks by a thread that keeps its last TAIL_BYTES,
for the failure message. A program that prints hundreds of MB costs neither scratch disk nor
memory, and is not slowed by the reader.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from fleet.job import InputError, ItemInput

POLL = 0.2  # seconds between looks at the program, the lease and the clock
STDIN_CHUNK = 4 << 20  # bytes read from the store per write to the program's stdin
READ_CHUNK = 1 << 20  # bytes asked for per read of the program's stderr
TAIL_LINES = 20  # lines of stderr kept for the lease
TAIL_BYTES = 4096  # at most this much of the end of stderr is kept for them
LINE_CHARS = 300  # a longer line is cut
KEEPER_SLACK = 30.0  # seconds beyond the grace the keeper may take to end the tree before it is killed
READER_WAIT = 5.0  # seconds to wait for stderr's end once the keeper is gone
KEEPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")


MARK = "FLEET_COMMAND_OF"  # in each program's environment: the pid of the worker that started it


class TimedOut(Exception):
    def __init__(self, stderr_tail: list[str] | None = None):
        super().__init__()
        self.stderr_tail = stderr_tail or []


@dataclass
class Finished:
    returncode: int
    seconds: float
    stderr_tail: list[str] = field(default_factory=list)


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


# Looked up here, in the worker, not in the forked child: a dlopen after fork can deadlock on a
# loader lock that another thread (the lease renewer) held at the fork.
_PRCTL = _prctl()


def _die_with_parent() -> None:
    """In the keeper, before exec (Linux): SIGKILL when the worker dies, even by SIGKILL. That
    reaches the keeper and the program, not what it started: those are found by sweep_orphans."""
    if _PRCTL is not None:
        with contextlib.suppress(Exception):
            _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def stop(keeper: subprocess.Popen, grace: float) -> None:
    """Have the keeper end the program's tree (SIGTERM, SIGKILL after ``grace``) and wait for it;
    a keeper that does not exit in time is killed, and the program with it (its death signal)."""
    if keeper.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            keeper.send_signal(signal.SIGTERM)
        try:
            keeper.wait(grace + KEEPER_SLACK)
        except subprocess.TimeoutExpired:
            keeper.kill()
            keeper.wait()


class _Tail(threading.Thread):
    """Reads a pipe to its end, keeping only its last TAIL_BYTES."""

    def __init__(self, fd: int):
        super().__init__(daemon=True)
        self.fd, self.kept, self.total = fd, b"", 0
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            while data := os.read(self.fd, READ_CHUNK):
                with self.lock:
                    self.total += len(data)
                    self.kept = (self.kept + data)[-TAIL_BYTES:] if len(data) < TAIL_BYTES else data[-TAIL_BYTES:]
        except OSError:
            pass
        finally:
            os.close(self.fd)

    def lines(self) -> list[str]:
        with self.lock:
            return tail_lines(self.kept, cut=self.total > len(self.kept))


class _Feeder(threading.Thread):
    """Streams the item's bytes to the program's stdin from the store, a chunk at a time; a
    program that stops reading early (exits, closes stdin) just ends the stream."""

    def __init__(self, item: ItemInput, pipe):
        super().__init__(daemon=True)
        self.item, self.pipe = item, pipe
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            at = self.item.start
            while at < self.item.end:
                data = self.item.read(at, min(self.item.end, at + STDIN_CHUNK))
                if not data:
                    raise InputError(
                        f"{self.item.display}: ends before byte {self.item.end} (planned); "
                        "plan a new run for the new contents"
                    )
                self.pipe.write(data)
                at += len(data)
        except (BrokenPipeError, ValueError):
            pass  # the program stopped reading (or was stopped): what it read is its business
        except BaseException as e:  # InputError, a store error: the item's attempt fails with it
            self.error = e
        finally:
            with contextlib.suppress(OSError, ValueError):
                self.pipe.close()


def run(
    argv: list[str],
    *,
    cwd: str | None,
    env: dict[str, str],
    checkpoint: Callable[[], None],
    timeout: float,
    grace: float,
    stdin_from: ItemInput | None = None,
) -> Finished:
    """Run ``argv`` to its end and return its exit code (negative: the signal that ended it) and
    the last lines of its stderr; every process it started has ended by then.

    Raises TimedOut after ``timeout`` seconds (0: none); whatever ``checkpoint`` raises (a lost
    lease) and a Shutdown arriving meanwhile go through, the program's tree ended first."""
    t0 = time.monotonic()
    err_r, err_w = os.pipe()
    with contextlib.suppress(OSError, AttributeError):  # fewer, bigger reads (Linux); the default 64 kB is fine too
        fcntl.fcntl(err_r, fcntl.F_SETPIPE_SZ, READ_CHUNK)
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-I", "-S", KEEPER, repr(float(grace)), *argv],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err_w,
            stdin=subprocess.PIPE if stdin_from is not None else subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            close_fds=True,
        )
    except BaseException:
        os.close(err_r)
        raise
    finally:
        os.close(err_w)
    stderr = _Tail(err_r)
    stderr.start()
    try:
        feeder = None
        if stdin_from is not None:
            feeder = _Feeder(stdin_from, keeper.stdin)
            feeder.start()
        while True:
            try:
                keeper.wait(POLL)
                break
            except subprocess.TimeoutExpired:
                pass
            checkpoint()
            if timeout and time.monotonic() - t0 > timeout:
                raise TimedOut()
        if feeder is not None:
            feeder.join(grace + 5)
            if feeder.error is not None:  # the program did not get all of its input
                raise feeder.error
        assert keeper.stdout is not None  # stdout=PIPE
        said = keeper.stdout.read().strip()
        stderr.join(READER_WAIT)
        code = int(said) if said.lstrip(b"-").isdigit() else keeper.returncode  # no code: the keeper died
        return Finished(code, time.monotonic() - t0, stderr.lines())
    except BaseException as e:
        stop(keeper, grace)
        if isinstance(e, TimedOut):
            stderr.join(READER_WAIT)
            raise TimedOut(stderr.lines()) from None
        raise
    finally:
        if keeper.stdout is not None:
            keeper.stdout.close()


def tail_lines(data: bytes, cut: bool) -> list[str]:
    """The last lines of the end of a program's stderr: at most TAIL_LINES lines of at most
    LINE_CHARS characters each, decoded leniently; ``cut``: data is not the whole of it, so its
    first line is probably cut and left out."""
    lines = data.decode("utf-8", "replace").splitlines()
    if cut and lines:
        lines = lines[1:]
    lines = [line.rstrip() for line in lines]
    lines = [line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "..." for line in lines if line]
    return lines[-TAIL_LINES:]


def signal_name(returncode: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(-returncode).name
    return f"signal {-returncode}"


def walk_files(folder: str) -> Iterator[tuple[str, str]]:
    """(relative path with '/', path) of every entry under folder that is not a folder, sorted."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = os.path.join(dirpath, name)
            yield os.path.relpath(path, folder).replace(os.sep, "/"), path


def sweep_orphans() -> int:
    """Stop the programs that workers of this machine left running when they died without
    stopping them (SIGKILL, the OOM killer): found by the worker pid in their environment
    (MARK), which no longer runs; each is killed with its process group. Linux (/proc) only."""
    me, killed = os.getpid(), 0
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    prefix = MARK.encode() + b"="
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                owner = next((v[len(prefix) :] for v in f.read().split(b"\0") if v.startswith(prefix)), b"")
        except OSError:
            continue
        if not owner.isdigit() or int(owner) == me or _running(int(owner)):
            continue
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
            killed += 1
    return killed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
