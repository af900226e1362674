"""Is a worker alive? From its heartbeat, and on this machine from its process.

A worker beats at every lease renewal (every TTL/3) and every idle poll, so a beat
older than a TTL means it is gone. On the machine it ran on, its pid says so at
once: `fleet local` killed with SIGKILL leaves beats that look fresh for a minute.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Mapping


def pid_alive(pid: int) -> bool:
    """True while the process runs; a zombie (killed, not yet reaped) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def beat_time(beat: Mapping[str, Any], key: str) -> float:
    """A heartbeat's time field (``started``, ``updated``), 0 where it is missing or no number: a
    heartbeat is advisory, and a malformed one stops no reader."""
    value = beat.get(key)
    try:
        return float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else 0.0
    except ValueError:
        return 0.0


def worker_alive(beat: dict[str, Any], lease_ttl: float, now: float) -> bool:
    if beat.get("state") in ("exited", "stopped"):
        return False
    if now - beat_time(beat, "updated") > lease_ttl + 5:
        return False
    pid = beat.get("pid")
    if beat.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0:
        return pid_alive(pid)
    return True
