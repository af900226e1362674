"""The inside of one local "VM": an init that runs the startup script as GCE's guest agent does.

    python tests/standins/guest.py FOLDER

FOLDER holds ``startup-script`` and, if the template has one, ``shutdown-script``.
What it models (Google's guest environment, Debian 12):

- The startup script is run by a *runner* process (google_metadata_script_runner
  in the oneshot unit google-startup-scripts.service, ``KillMode=process``). The runner
  reads the script's stdout and stderr (one pipe) to its end, and writes each line as
  ``startup-script: LINE`` to its own stdout, which the unit sends to the journal and the
  serial console (``StandardOutput=journal+console``): here FOLDER/journal and this init's
  stdout (the VM's console.log). What the script writes elsewhere (a file) reaches neither.
- At a stop (SIGTERM to this init: ``deleteInstances``, MIG deletion, Spot
  preemption, ``maxRunDuration``) only the runner gets SIGTERM, and it dies of
  it; the startup script and its children get nothing. Then the
  ``shutdown-script`` runs; when it ends the VM powers off: SIGKILL to every
  process of the VM. The stand-in powers the VM off itself (SIGKILL to this init's
  whole tree) when the window of the stop ends first.
- This init is a child subreaper, so a process that double-forks or calls setsid
  stays inside the VM and dies at power-off, as on a real machine.

The runner's exit status goes to FOLDER/startup-exit (the VM idles on after it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
# google_metadata_script_runner (guest-agent's runCmd), reduced to what matters here: run the script
# with stdout and stderr on one pipe, log each line until the pipe's end, report the status, and die
# of SIGTERM (Python's default action for it) without passing it on. Its stdout is the unit's, which
# systemd copies to the journal and the console (journal+console): both are written here.
RUNNER = (
    "import subprocess, sys\n"
    "journal = open(sys.argv[2], 'ab', buffering=0)\n"
    "script = subprocess.Popen(['bash', sys.argv[1]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)\n"
    "for line in script.stdout:\n"
    "    entry = b'startup-script: ' + line.rstrip(b'\\n') + b'\\n'\n"
    "    journal.write(b'google_metadata_script_runner: ' + entry)\n"
    "    sys.stdout.buffer.write(entry)\n"
    "    sys.stdout.flush()\n"
    "sys.exit(script.wait())\n"
)


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, from /proc (parents before children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def kill_tree(root: int, include_root: bool = False) -> None:
    """SIGKILL everything below ``root`` (which must be a subreaper, so orphans stay below it)."""
    for _ in range(200):
        kids = descendants(root)
        if not kids:
            break
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    if include_root:
        try:
            os.kill(root, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(folder: Path) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(time.time()))
    env = dict(os.environ)
    runner = os.posix_spawn(
        sys.executable, [sys.executable, "-c", RUNNER, str(folder / "startup-script"), str(folder / "journal")], env
    )
    shutdown_pid: int | None = None
    shutdown_script = folder / "shutdown-script"
    runner_alive = True
    while True:
        while True:  # reap: the runner, the shutdown script, and any orphan handed to us
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == runner:
                runner_alive = False
                (folder / "startup-exit").write_text(str(os.waitstatus_to_exitcode(status)))
            elif pid == shutdown_pid:
                print(f"guest: shutdown-script exited {os.waitstatus_to_exitcode(status)}; powering off", flush=True)
                kill_tree(os.getpid())
                return 0
        if stop and shutdown_pid is None:
            print("guest: stopping: SIGTERM to the startup script's runner only", flush=True)
            if runner_alive:
                os.kill(runner, signal.SIGTERM)
            if not shutdown_script.exists():
                print("guest: no shutdown-script; powering off", flush=True)
                kill_tree(os.getpid())
                return 0
            shutdown_pid = os.posix_spawn("/bin/bash", ["bash", str(shutdown_script)], env)
        time.sleep(0.05)


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
