"""Progress for a log rather than a terminal: `fleet local` with its output going to a file (nohup,
a batch job, a Kubernetes pod) says how far the run is at a steady interval, one plain line each,
and so does each worker in its log (a VM's console): what it has done since it started.

A live bar redraws one line in place, which a file keeps as a heap of carriage returns or, with
rich, not at all; so without a terminal this takes its place. A line comes every ``every`` seconds
(``FLEET_PROGRESS_SECONDS``, 30 by default; a run shorter than that prints only its summary, and a
refusal stays one line), and the rate and ETA count only the bytes converted since this command
started, so a resumed run does not claim the speed of the work it found done::

    progress: items 3/10 (1 failed) · 12.3 of 40.0 MB (31%) · 2.1 MB/s · ETA 13 s

A run with stages gives its items per stage instead (``map 4/4 · shards 1/2``): the bytes count
only the map's input. A worker knows only its own work, which costs it no request to tell::

    progress: 5 items done here (1 failed) · 320.0 MB · 3.1 MB/s · on item 00012

(the run's own progress, from every lease, is `fleet status`'s: a fleet of VMs each reading the
whole run every 30 s would pay for it in requests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

DEFAULT_EVERY = 30.0  # seconds between two lines: a log a day long keeps about 3,000 of them


def every_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """The interval ``FLEET_PROGRESS_SECONDS`` asks for; the default where it is unset or not a
    positive number (a progress line is advice: a typo must not stop a run)."""
    try:
        value = float(environ.get("FLEET_PROGRESS_SECONDS", ""))
    except ValueError:
        return DEFAULT_EVERY
    return value if value > 0 else DEFAULT_EVERY


@dataclass
class Every:
    """True at most once per ``every`` seconds, the first time ``every`` after ``started``."""

    every: float
    started: float
    _next: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._next = self.started + self.every

    def due(self, now: float) -> bool:
        if now < self._next:
            return False
        self._next = now + self.every
        return True


def worker_line(done: int, failed: int, bytes_done: int, seconds: float, item: str | None) -> str:
    """A worker's own progress since it started ``seconds`` ago, and the item in its hands."""
    scale, unit = _unit(bytes_done)
    parts = [f"{done} item{'s' if done != 1 else ''} done here" + (f" ({failed} failed)" if failed else "")]
    parts.append(f"{bytes_done / scale:,.1f} {unit}")
    if seconds > 0 and bytes_done:
        rate = bytes_done / seconds
        scale, unit = _unit(rate)
        parts.append(f"{rate / scale:.3g} {unit}/s")
    parts.append(f"on item {item}" if item else "idle")
    return "progress: " + " · ".join(parts)


@dataclass
class ProgressLines:
    """Which line to print, and when. ``started``/``start_bytes``: when this command began, and
    the bytes already done then; times are a monotonic clock's seconds."""

    total_bytes: int
    started: float
    start_bytes: int = 0
    every: float = DEFAULT_EVERY
    _clock: Every = field(init=False)

    def __post_init__(self) -> None:
        self._clock = Every(self.every, self.started)

    def line(self, counts: str, bytes_done: int, now: float, live: bool = True) -> str | None:
        """The line to print at ``now`` (None until the interval has passed since the last one).
        ``counts``: the items part (``items 3/10``, or the stages'); ``live``: a worker still
        converts, without which there is no ETA."""
        if not self._clock.due(now):
            return None
        return self.text(counts, bytes_done, now, live)

    def text(self, counts: str, bytes_done: int, now: float, live: bool = True) -> str:
        total = max(self.total_bytes, 0)
        share = f" ({100 * bytes_done / total:.0f}%)" if total else ""
        scale, unit = _unit(total)
        parts = [counts, f"{bytes_done / scale:,.1f} of {total / scale:,.1f} {unit}{share}"]
        span = now - self.started
        gained = bytes_done - self.start_bytes
        if span > 0 and gained > 0:
            rate = gained / span
            scale, unit = _unit(rate)
            parts.append(f"{rate / scale:.3g} {unit}/s")
            if live and bytes_done < total:
                parts.append(f"ETA {_duration((total - bytes_done) / rate)}")
        return "progress: " + " · ".join(parts)


def _unit(size: float) -> tuple[float, str]:
    """The decimal unit a size reads best in: kB below a MB, then MB, GB and TB."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB")):
        if size >= scale:
            return scale, unit
    return 1e3, "kB"


def _duration(seconds: float) -> str:
    """``42 s``, ``7 min 5 s``, ``3 h 20 min``: what a reader of a log takes in at a glance."""
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
