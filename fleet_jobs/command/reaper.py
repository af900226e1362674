"""The keeper of one item's program: a child subreaper that starts it and, before it exits
itself, ends every process the program started, whatever session it put itself in.

process.run starts it as ``python -I -S reaper.py GRACE PROGRAM...`` (standard library only,
so it starts in milliseconds). As a child subreaper (Linux prctl), a process orphaned below it
(a double fork, a ``setsid`` daemon whose parent exited) is reparented to it instead of init,
so the program's whole tree stays its descendants, found by their parent links in /proc. Its
only children are the item's, so once waitpid says it has none, none is left, and it may reap
whatever it finds. The worker is not made the subreaper itself: there, reaping orphans would
race subprocess's waits for the worker's own children, and it would have to tell the item's
processes from theirs.

It ends them when the program exits (what it left running is not wanted) and when it gets
SIGTERM from the worker (timeout, lost lease, give-back): SIGTERM to each, SIGKILL after GRACE
seconds to what is left, until all are reaped. Then it writes the program's exit code (negative:
the signal that ended it) on its stdout; the program's own stdout is /dev/null, and its stderr
is the keeper's, a pipe the worker reads. Without /proc or prctl (not Linux) it falls back to
the program's process group, which a setsid child leaves. The program gets SIGKILL if the
keeper dies; what it started then is found by process.sweep_orphans, by the MARK in its
environment.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
TICK = 0.05  # seconds between looks at what is left
SLACK = 10.0  # seconds after SIGKILL before it gives up on a process that will not go (a zombie init never reaps)


_stop_asked = False  # SIGTERM came: the worker wants the item ended


def _ask_stop(signum, frame) -> None:
    # A flag, not an exception: one raised between two statements could skip the ending.
    global _stop_asked
    _stop_asked = True


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


def descendants(root: int) -> list[int] | None:
    """The live (not zombie) processes below ``root``, by their parent links; None without /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    children: dict[int, list[tuple[int, bool]]] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append((int(name), fields[0] != b"Z"))
    found, todo = [], [root]
    while todo:
        for pid, live in children.get(todo.pop(), ()):
            todo.append(pid)
            if live:
                found.append(pid)
    return found


def _reaped_all() -> bool:
    """Collect every child that has ended; True once none is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _signal(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, sig)


def end_all(group: int, grace: float) -> None:
    """SIGTERM to every process below this one and to the program's ``group``, SIGKILL after
    ``grace`` seconds to what is left, until none is left (or SLACK seconds more: a zombie that
    init never reaps)."""
    me, group_termed = os.getpid(), False
    termed: set[int] = set()
    kill_at = time.monotonic() + grace
    give_up = kill_at + SLACK
    while True:
        done = _reaped_all()
        left = descendants(me) or []
        if done and not left and not _group_alive(group):
            return
        now = time.monotonic()
        if now > give_up:
            return
        if now < kill_at:  # SIGTERM once each: a program may log each one it gets
            if not group_termed:
                _signal(group, signal.SIGTERM, group=True)
                group_termed = True
            for pid in set(left) - termed:
                _signal(pid, signal.SIGTERM)
            termed.update(left)
        else:
            _signal(group, signal.SIGKILL, group=True)
            for pid in left:
                _signal(pid, signal.SIGKILL)
        time.sleep(TICK)


def main(argv: list[str]) -> int:
    grace, program = float(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, _ask_stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the worker, which sends SIGTERM
    prctl = _prctl()  # looked up before the fork: a dlopen in the child could deadlock
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def die_with_keeper() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    child = subprocess.Popen(
        program, stdout=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_keeper, close_fds=True
    )
    with open(os.devnull, "rb") as null:  # the program holds its stdin alone: the worker sees it stop reading
        os.dup2(null.fileno(), 0)
    code = None
    while code is None and not _stop_asked:
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = child.wait(TICK)
    end_all(child.pid, grace)  # a session leader: its pid is its group's id
    if code is not None:
        sys.stdout.write(f"{code}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
