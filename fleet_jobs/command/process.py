"""One run of a program for one item: its own process group, watched, stopped whole.

The program starts in a new session, so its process group holds it and every child it
starts (a shell's pipeline, a script's subprocesses): stopping it is SIGTERM to the
group, then SIGKILL after a grace period, and nothing of it is left running. The
watcher wakes a few times a second to call ``ctx.checkpoint`` (which raises once the
item's lease is lost) and to enforce the timeout; a Shutdown (SIGTERM, Ctrl-C) raised
in the worker's main thread while it waits stops the group on the way out too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from fleet.job import InputError, ItemInput

POLL = 0.2  # seconds between looks at the program, the lease and the clock
STDIN_CHUNK = 4 << 20  # bytes read from the store per write to the program's stdin
TAIL_LINES = 20  # lines of stderr kept for the lease
TAIL_BYTES = 4096  # at most this much of the end of stderr is read for them
LINE_CHARS = 300  # a longer line is cut


MARK = "FLEET_COMMAND_OF"  # in each program's environment: the pid of the worker that started it


class TimedOut(Exception):
    pass


@dataclass
class Finished:
    returncode: int
    seconds: float


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


# Looked up here, in the worker, not in the forked child: a dlopen after fork can deadlock on a
# loader lock that another thread (the lease renewer) held at the fork.
_PRCTL = _prctl()


def _die_with_parent() -> None:
    """In the child, before exec (Linux): SIGKILL when the worker dies, even by SIGKILL. That
    reaches the shell only, not what it started: those are found by sweep_orphans."""
    if _PRCTL is not None:
        with contextlib.suppress(Exception):
            _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the program's process group, SIGKILL to what is left after ``grace`` seconds.

    The group is signalled even after its leader exited: a child it left behind in the
    group (a daemonised helper, a pipeline's other half) must not outlive the item."""
    pgid = proc.pid  # a session leader: its pid is its group's id
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(pgid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


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
                    raise InputError(f"{self.item.display}: ends before byte {self.item.end} (planned); "
                                     "plan a new run for the new contents")
                self.pipe.write(data)
                at += len(data)
        except (BrokenPipeError, ValueError):
            pass  # the program stopped reading (or was stopped): what it read is its business
        except BaseException as e:  # InputError, a store error: the item's attempt fails with it
            self.error = e
        finally:
            with contextlib.suppress(OSError, ValueError):
                self.pipe.close()


def run(argv: list[str], *, cwd: str | None, env: dict[str, str], stdout: str, stderr: str,
        checkpoint: Callable[[], None], timeout: float, grace: float,
        stdin_from: ItemInput | None = None) -> Finished:
    """Run ``argv`` to its end and return its exit code (negative: the signal that ended it).

    Raises TimedOut after ``timeout`` seconds (0: none); whatever ``checkpoint`` raises (a lost
    lease) and a Shutdown arriving meanwhile go through, the program's group stopped first."""
    t0 = time.monotonic()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err,
                                stdin=subprocess.PIPE if stdin_from is not None else subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent, close_fds=True)
    try:
        feeder = None
        if stdin_from is not None:
            feeder = _Feeder(stdin_from, proc.stdin)
            feeder.start()
        while True:
            try:
                proc.wait(POLL)
                break
            except subprocess.TimeoutExpired:
                pass
            checkpoint()
            if timeout and time.monotonic() - t0 > timeout:
                raise TimedOut()
        if _group_alive(proc.pid):  # the program is done; what it left running in its group is not wanted
            stop_group(proc, grace)
        if feeder is not None:
            feeder.join(grace + 5)
            if feeder.error is not None:  # the program did not get all of its input
                raise feeder.error
        return Finished(proc.returncode, time.monotonic() - t0)
    except BaseException:
        stop_group(proc, grace)
        raise


def tail(path: str) -> list[str]:
    """The last lines of a program's stderr: at most TAIL_LINES lines of at most LINE_CHARS
    characters each, from at most TAIL_BYTES bytes, decoded leniently."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # the first is probably cut
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
                owner = next((v[len(prefix):] for v in f.read().split(b"\0") if v.startswith(prefix)), b"")
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
