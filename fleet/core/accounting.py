"""What became of every file under a run's inputs: read, or skipped with a reason, with the bytes
of each, so that they add up: the bytes found = the bytes read + the bytes skipped.

A file nobody reads must never vanish without a word: a README a job leaves out on purpose and a
``.lz4`` shard it cannot read look alike unless each is counted under its reason. The account is
made at plan time (fleet.core.sources), kept in the run's spec and carried to summary.json,
manifest.json and `fleet status`; the terminal shows one line per reason.

Bounded whatever the corpus (a folder of a million hidden files, or of a million extensions): per
reason a count of files and bytes and the first NAMES names only, and at most REASONS reasons, the
others counted together under OTHER with their reasons beside the names kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

NAMES = 5  # names kept (and shown) per reason
REASONS = 50  # reasons kept apart; the rest are counted under OTHER
OTHER = "other reasons"

# The core's own reasons (a job gives its own: fleet.job.Job.skip_reason).
HIDDEN = "a hidden name (starts with '.' or '_')"
EMPTY = "an empty file, nothing to convert"
NOT_REGULAR = "not a regular file (a FIFO, socket or device)"
BROKEN_LINK = "a broken symbolic link"
LINK_LOOP = "a symbolic link loop"
FOLDER_AGAIN = "a folder already read (a symbolic link loop or a second link to it)"
SAME_FILE = "planned once (a second name, a link, of a file read)"
NAMED_TWICE = "named twice: planned once"
OUTPUT_FOLDER = "this run's output folder"
REJECTED = "not input to this job"  # a job that says no without saying why (Job.accepts only)


@dataclass
class Skipped:
    """The files skipped for one reason: how many, their bytes, the first few names."""

    files: int = 0
    bytes: int = 0
    names: list[str] = field(default_factory=list)


@dataclass
class InputAccount:
    """Every file found under the inputs, read or skipped (by reason), with its bytes."""

    files_read: int = 0
    bytes_read: int = 0
    skipped: dict[str, Skipped] = field(default_factory=dict)

    def read(self, size: int) -> None:
        self.files_read += 1
        self.bytes_read += size

    def skip(self, name: str, reason: str, size: int = 0, files: int = 1) -> None:
        """``files`` skipped for ``reason``, of ``size`` bytes together, under ``name`` (a file, or a
        folder skipped whole: 'old-run/' with the count and bytes of every file in it)."""
        self._count(reason, files, size, [name])

    def add(self, other: "InputAccount") -> None:
        self.files_read += other.files_read
        self.bytes_read += other.bytes_read
        for reason, row in other.skipped.items():
            self._count(reason, row.files, row.bytes, row.names)

    def _count(self, reason: str, files: int, size: int, names: list[str]) -> None:
        if reason not in self.skipped and len(self.skipped) >= REASONS:
            names, reason = [f"{name} ({reason})" for name in names], OTHER
        row = self.skipped.setdefault(reason, Skipped())
        row.files += files
        row.bytes += size
        row.names += names[: NAMES - len(row.names)]

    @property
    def files_skipped(self) -> int:
        return sum(row.files for row in self.skipped.values())

    @property
    def bytes_skipped(self) -> int:
        return sum(row.bytes for row in self.skipped.values())

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, its identity in plain sight: files and bytes found, read, skipped (by reason)."""
        return {
            "files": self.files_read + self.files_skipped,
            "bytes": self.bytes_read + self.bytes_skipped,
            "read": {"files": self.files_read, "bytes": self.bytes_read},
            "skipped": {
                "files": self.files_skipped,
                "bytes": self.bytes_skipped,
                "reasons": {
                    reason: {"files": row.files, "bytes": row.bytes, "names": list(row.names)}
                    for reason, row in sorted(self.skipped.items())
                },
            },
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "InputAccount":
        """From ``to_dict``'s form; {} (a run planned before accounts were kept) gives an empty one."""
        d = d or {}
        read = d.get("read") or {}
        reasons = (d.get("skipped") or {}).get("reasons") or {}
        return cls(
            int(read.get("files", 0)),
            int(read.get("bytes", 0)),
            {
                reason: Skipped(int(r.get("files", 0)), int(r.get("bytes", 0)), list(r.get("names") or []))
                for reason, r in reasons.items()
            },
        )

    def lines(self) -> list[str]:
        """One line per reason, most bytes first: the count, the bytes, the first names, the reason."""
        out = []
        for reason, row in sorted(self.skipped.items(), key=lambda kv: (-kv[1].bytes, -kv[1].files, kv[0])):
            more = row.files - len(row.names)
            names = ", ".join(row.names) + (f" and {more:,} more" if more > 0 and row.names else "")
            out.append(f"{row.files:,} file{'s' if row.files != 1 else ''} ({size_text(row.bytes)}): {names}: {reason}")
        return out

    def line(self) -> str:
        """The whole in one line: read and skipped, files and bytes."""
        return (
            f"{self.files_read:,} read ({size_text(self.bytes_read)}), {self.files_skipped:,} skipped "
            f"({size_text(self.bytes_skipped)}) of {self.files_read + self.files_skipped:,} files found "
            f"({size_text(self.bytes_read + self.bytes_skipped)})"
        )


def size_text(n: int) -> str:
    """Bytes for a person: exact below a kilobyte, else in kB, MB or GB."""
    if n < 1000:
        return f"{n:,} byte{'s' if n != 1 else ''}"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} bytes"
