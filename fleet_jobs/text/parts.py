"""The documents of an item of several small files (a grouped item: ``ItemInput.parts``), read
file by file as if each were an item of its own.

Each file is read, judged (``--max-bad-share``) and counted alone, so what a run says of a file
does not depend on the files it was grouped with: its bad records name it, its row of the
manifest (``ItemInput.count``) holds its documents and bad records, and a file that cannot be
read at all (gone or changed since the plan, or not in its format: more bad records than the
share allows) fails alone. That file's failure is one line naming it, kept in the item's stats
(``files_failed``, ``failed_files``) and in its row; the item goes on with the next file, so
nothing else of the group is lost. Documents a file handed on before it failed stay (the bad
share is judged as a file is read, as in any item), as a compressed file's documents before a
break do. A file the store refuses to serve (a 403: access, not data) fails the attempt instead,
naming the file: the item is retried, and after its attempts fails whole, for
``--retry-failed`` once access is fixed, rather than be done without that file. A file always
ends a document: no document spans two files.

Small files of a bucket are read ahead by a few threads (on ``gs://`` each is a request of its
own), within a bound of bytes held; local ones are read in turn (threads only contend for the
interpreter there: linejob's item of 5,000 one-line files took 0.53-0.64 s of CPU with them,
0.44-0.47 s without); bigger ones and Parquet files are read as an item's are.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator

from fleet.job import InputError, ItemFailed, ItemInput, StoreError, printable

from fleet_jobs.text.inputs import ReadOptions, Slice, Tally, read_slice
from fleet_jobs.text.inputs.places import Place

READ_AHEAD_FILES = 32  # files read ahead at most
READ_AHEAD_BYTES = 16 << 20  # bytes of them held at most
IN_MEMORY = 4 << 20  # a file up to this size is read into memory (ahead); a bigger one is downloaded
READERS = 8  # threads reading ahead
MAX_FAILED_SHOWN = 20  # one-line errors of failed files an item's stats keep (all are counted)


def item_slice(item: ItemInput) -> Slice:
    """The slice an item's input (or one file of a grouped item) is (the inverse of job._piece)."""
    return Slice(
        item.url,
        item.name,
        item.start,
        item.end,
        item.meta.get("format", "text"),
        item.meta.get("compression", "none"),
        item.version,
        bool(item.meta.get("cuts_document")),
        0,
    )


class GroupReading:
    """Reads a grouped item's files in order: ``documents`` hands on their documents, counting
    each file's into ``part.count`` (``documents_key``: the name its documents are counted
    under, as the item's stats name them) and its reading into the item's ``tally``."""

    def __init__(
        self,
        item: ItemInput,
        workdir: str,
        options: ReadOptions,
        tally: Tally,
        documents_key: str,
        checkpoint: Callable[[], None],
        every: int,
    ):
        self.item, self.workdir, self.options, self.tally = item, workdir, options, tally
        self.documents_key = documents_key
        self.checkpoint, self.every = checkpoint, every  # called at each file and every ``every`` documents
        self.failed: list[str] = []

    def documents(self, places: list[Place] | None = None) -> Iterator[list[str]]:
        n = 0  # documents of the item handed on: the ordinal of the next one
        checkpoint, every = self.checkpoint, self.every
        for part, data in read_ahead(self.item.parts):
            checkpoint()
            own = Tally()
            docs = 0
            try:
                for doc in read_slice(item_slice(part), self.workdir, own, self.options, places, n, data()):
                    docs += 1
                    n += 1
                    if not n % every:
                        checkpoint()
                    yield doc
            except InputError as e:
                message = printable(str(e)).splitlines()[0] if str(e) else f"{part.display}: unreadable"
                if part.file not in message:  # the reader's errors name the file; make sure
                    message = f"{part.display}: {message}"
                self.failed.append(message)
                # Its bad records are in its one line, as a failed item's are: none is "skipped".
                part.count({"files_failed": 1, self.documents_key: docs})
                continue
            except StoreError as e:  # not the file's fault (a 403 while IAM changes spread): the item is
                # retried, and after its attempts fails whole, with the file named, for --retry-failed
                raise ItemFailed(f"{part.display}: {type(e).__name__}: {e}".splitlines()[0]) from None
            part.count({self.documents_key: docs, **own.counts()})
            self.tally.absorb(own)

    def stats(self) -> dict:
        """The item's counters of failed files (none: nothing to add)."""
        if not self.failed:
            return {}
        return {"files_failed": len(self.failed), "failed_files": self.failed[:MAX_FAILED_SHOWN]}


def read_ahead(parts: list[ItemInput]) -> Iterator[tuple[ItemInput, Callable[[], bytes | None]]]:
    """Each part, in order, with a call that gives its bytes: those of a small file read ahead
    by threads (raising what the read raised: InputError for a file gone or changed), None for
    one that read_slice reads itself (bigger, or Parquet)."""

    def small(part: ItemInput) -> bool:
        return part.meta.get("format") != "parquet" and part.end - part.start <= IN_MEMORY

    if not any("://" in part.url for part in parts):  # local files: threads would only contend for the GIL
        for part in parts:
            yield part, (part.read_all if small(part) else _none)
        return

    pending: deque[tuple[ItemInput, Future | None]] = deque()
    held = 0
    with ThreadPoolExecutor(READERS, thread_name_prefix="fleet-read-ahead") as pool:
        try:
            todo = iter(parts)
            nxt = next(todo, None)
            while nxt is not None or pending:
                while (
                    nxt is not None
                    and len(pending) < READ_AHEAD_FILES
                    and (not pending or not small(nxt) or held + nxt.end - nxt.start <= READ_AHEAD_BYTES)
                ):
                    if small(nxt):
                        pending.append((nxt, pool.submit(nxt.read_all)))
                        held += nxt.end - nxt.start
                    else:
                        pending.append((nxt, None))
                    nxt = next(todo, None)
                part, future = pending.popleft()
                if future is not None:
                    held -= part.end - part.start
                yield part, (future.result if future is not None else _none)
        finally:
            for _, future in pending:
                if future is not None:
                    future.cancel()


def _none() -> None:
    return None
