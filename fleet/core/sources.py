"""Finding a run's input objects: files and folders (local or gs://) named as input, each
object planned once and pinned to the version found.

Once means once per file, not per name: a symbolic link, a hard link or the same folder
named twice all reach one inode, and its bytes are read once. Inside a folder the job says
which files are input and why not (``Job.skip_reason``: a text job skips READMEs); hidden files
('.', '_'), empty files and the outputs or run state of another fleet run never are. Every file
found is accounted for (fleet.core.accounting): read, or skipped under its reason, each reason
named in one warning line with a count, the bytes and the first few names. What is in an object
is the job's business: this module never reads one.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from fleet.core.errors import InputError
from fleet.core.item import Source, printable
from fleet.core.accounting import (
    BROKEN_LINK,
    EMPTY,
    FOLDER_AGAIN,
    HIDDEN,
    LINK_LOOP,
    NAMED_TWICE,
    NOT_REGULAR,
    OUTPUT_FOLDER,
    REJECTED,
    SAME_FILE,
    InputAccount,
)
from fleet.core.layout import OUTPUT_PREFIX, RUNS, SPEC, STATE_DIR, SUMMARY
from fleet.core.store import open_store, split_url
from fleet.core.store.local import file_version

log = logging.getLogger("fleet.sources")


def _hidden(name: str) -> bool:
    return any(part.startswith((".", "_")) for part in name.split("/"))


def every_file(name: str) -> bool:
    """The default ``accept``: every file a folder holds is input."""
    return True


def fleet_output(folder: str, entries: Iterable[str], exists: Callable[[str], bool]) -> str | None:
    """Why a folder holds another fleet run's outputs or run state rather than corpus, or None.

    ``entries``: the names directly in it; ``exists(relative name)``: whether a file is there.
    Part files alone do not tell (a Spark or Hugging Face export is named part-00000 too);
    the summary `fleet local` writes beside them, its .fleet/ state, or a bucket's
    runs/<run>/run.json do."""
    entries = set(entries)
    if STATE_DIR in entries:
        return f"the outputs of a `fleet local` run: it holds {STATE_DIR}/"
    if SUMMARY in entries and any(e.startswith(OUTPUT_PREFIX) for e in entries):
        return f"the outputs of a fleet run: it holds {SUMMARY} and {OUTPUT_PREFIX}* files"
    if folder.rstrip("/").rsplit("/", 1)[-1] == RUNS.rstrip("/") and any(exists(f"{e}/{SPEC}") for e in entries):
        return f"the run state of a fleet bucket: it holds {RUNS}*/{SPEC}"
    return None


def _warn(message: str) -> None:
    log.warning("warning: %s", message)  # on stderr even where logging is not set up (logging.lastResort)


def _readable(path: str, display: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise InputError(f"{display}: cannot read it ({e.strerror or e})") from None


def _walk(
    root: str, exclude: tuple[str, ...], skip: Callable[[str], str | None], account: InputAccount
) -> Iterator[tuple[str, os.stat_result, str]]:
    """Input files under a folder, following symbolic links to files and folders: (name, stat,
    real path); every other file found is counted in ``account`` under its reason. A folder
    reached twice (a link loop, or two links to one folder) is read once; a broken or looping
    link, a FIFO or a device, a hidden name, an empty file or one the job does not take (``skip``,
    a reason or None) is skipped. A folder skipped whole (hidden, another run's outputs, the
    output folder) is counted whole: its files and bytes (``_tree``).

    The real path of an entry that is no link is its folder's real path and its name: resolving
    each of a corpus of many small files costs a system call per part of its path."""
    seen: set[tuple[int, int]] = set()

    def visit(folder: str, rel: str) -> Iterator[tuple[str, os.stat_result, str]]:
        st = os.stat(folder)
        real_folder = os.path.realpath(folder)
        if (st.st_dev, st.st_ino) in seen:
            account.skip(printable(folder) + "/", FOLDER_AGAIN, files=0)
            return
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.listdir(folder))
        except OSError as e:
            raise InputError(f"{printable(folder)}: cannot list it ({e.strerror or e})") from None
        why = fleet_output(folder, entries, lambda rel: os.path.isfile(os.path.join(folder, rel)))
        if why is not None:
            if not rel:  # the folder named: say so as the error, not as a warning before "no input files"
                raise InputError(f"{printable(folder)}: {why}, not a corpus; name its files to read them")
            _tree(folder, why + " (not corpus)", account)
            return
        for entry in entries:
            path = os.path.join(folder, entry)
            if entry.startswith((".", "_")):
                _tree(path, HIDDEN, account)
                continue
            name = f"{rel}{entry}"
            try:
                link = stat.S_ISLNK(os.lstat(path).st_mode)
            except OSError:  # gone since the listing: os.stat below names it
                link = True
            real = os.path.realpath(path) if link else os.path.join(real_folder, entry)
            if any(real == x or real.startswith(x + os.sep) for x in exclude):
                _tree(path, OUTPUT_FOLDER, account)
                continue
            try:
                st = os.stat(path) if link else os.lstat(path)
            except OSError as e:
                why = LINK_LOOP if e.errno == 40 else BROKEN_LINK if os.path.islink(path) else e.strerror
                account.skip(printable(path), printable(why or str(e)))
                continue
            if stat.S_ISDIR(st.st_mode):
                yield from visit(path, name + "/")
            elif not stat.S_ISREG(st.st_mode):
                account.skip(printable(path), NOT_REGULAR)
            elif (why := skip(name)) is not None:
                account.skip(printable(path), why, st.st_size)
            elif not st.st_size:
                account.skip(printable(path), EMPTY)
            else:
                yield name, st, real

    yield from visit(root, "")


def _tree(path: str, reason: str, account: InputAccount) -> None:
    """A file or folder skipped whole, counted in ``account``: a folder's regular files and their
    bytes, found without following links (a hidden link to a big folder costs no walk of it)."""
    try:
        st = os.lstat(path)
    except OSError:
        account.skip(printable(path), reason)
        return
    if not stat.S_ISDIR(st.st_mode):
        account.skip(printable(path), reason, st.st_size if stat.S_ISREG(st.st_mode) else 0)
        return
    files = size = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files += 1
                size += st.st_size
    account.skip(printable(path) + "/", reason, size, files)


def skip_of(accept: Callable[[str], bool]) -> Callable[[str], str | None]:
    """A job's yes or no (``Job.accepts``) as a reason or None."""
    return lambda name: None if accept(name) else REJECTED


def find_sources(
    paths: list[str], exclude: Sequence[str] = (), accept: Callable[[str], bool] = every_file
) -> list[Source]:
    """Expand files and folders (local or gs://) into input objects, in a stable order (survey:
    the files skipped, each under its reason, are named in warnings, a line a reason).

    ``accept(name)`` says which files inside a folder are input (``Job.accepts``)."""
    return survey(paths, exclude, skip_of(accept)).sources


@dataclass
class Survey:
    """The inputs found: the objects to read, and the account of every file found (read or skipped)."""

    sources: list[Source]
    account: InputAccount


def _present(present: set[str], folder: str, rel: str) -> bool:
    return folder + rel in present


def survey(
    paths: list[str],
    exclude: Sequence[str] = (),
    skip: Callable[[str], str | None] = skip_of(every_file),
    warn: bool = True,
) -> Survey:
    """Expand files and folders (local or gs://) into input objects, in a stable order, and account
    for every file found: read, or skipped with a reason (with ``warn``, one warning line per
    reason; a plan warns once it is accepted, so that a refusal stays one line: warn_skipped).

    Each file is planned once, however often it is named (directly, inside a named
    folder, or through links): the same corpus twice would be converted twice. Paths
    under ``exclude`` (the output folder of `fleet local`) are never inputs. ``skip(name)``
    says why a file inside a folder is not input, or None (``Job.skip_reason``). A file named
    on its own is always read."""
    found: list[Source] = []
    seen: dict[object, str] = {}  # (device, inode) of a local file, or a URL -> how it was first found
    excluded = tuple(os.path.realpath(x) for x in exclude)
    account = InputAccount()

    def add(inp: Source, key: object, into: InputAccount) -> None:
        if key in seen:
            if seen[key] != inp.display:
                into.skip(f"{inp.display}: the same file as {seen[key]}", SAME_FILE, inp.size)
            else:
                into.skip(inp.display, NAMED_TWICE, inp.size)
            return
        seen[key] = inp.display
        found.append(inp)
        into.read(inp.size)

    def none_there(path: str, here: InputAccount) -> InputError:
        lines = here.lines()
        skipped = (
            f": skipped {'; '.join(lines[:3])}" + (f"; and {len(lines) - 3} more reasons" if len(lines) > 3 else "")
            if lines
            else ""
        )
        return InputError(f"{printable(path)}: no input files there{skipped}")

    for path in paths:
        here = InputAccount()
        if path.startswith("gs://"):
            root, prefix = split_url(path)
            store = open_store(root)
            blob = store.stat(prefix) if prefix else None
            if blob is not None:
                add(Source(root, prefix, blob.size, blob.version), f"{root}/{prefix}", here)
                account.add(here)
                continue
            folder = prefix + "/" if prefix else ""
            listed = list(store.list(folder))
            outputs = _gcs_outputs(path, [b.name[len(folder) :] for b in listed])
            blobs = []
            for b in listed:
                rel, display = b.name[len(folder) :], f"{root}/{b.name}"
                if rel.endswith("/") and not b.size:
                    continue  # a folder's placeholder, no file
                other = next((why for prefix_, why in outputs.items() if rel.startswith(prefix_)), None)
                if other is not None:
                    here.skip(display, other + " (not corpus)", b.size)
                elif _hidden(rel):
                    here.skip(display, HIDDEN, b.size)
                elif (why := skip(rel)) is not None:
                    here.skip(display, why, b.size)
                elif not b.size:
                    here.skip(display, EMPTY)
                else:
                    blobs.append(b)
            if not blobs:
                raise none_there(path, here)
            for b in blobs:
                add(Source(root, b.name, b.size, b.version), f"{root}/{b.name}", here)
            account.add(here)
            continue
        if "://" in path and not path.startswith("file://"):
            raise InputError(f"{path}: unsupported URL (inputs are local paths or gs://BUCKET/PATH)")
        local = os.path.abspath(path[len("file://") :] if path.startswith("file://") else path)
        if os.path.isfile(local):
            st = os.stat(local)
            inp = Source(os.path.dirname(local), os.path.basename(local), st.st_size, file_version(st))
            _readable(local, inp.display)
            add(inp, (st.st_dev, st.st_ino), here)  # a hard or symbolic link to a file planned already: once
        elif os.path.isdir(local):
            files = [
                (Source(local, rel, st.st_size, file_version(st)), st, real)
                for rel, st, real in _walk(local, excluded, skip, here)
            ]
            if not files:
                raise none_there(path, here)
            for inp, st, real in files:
                _readable(real, inp.display)
                add(inp, (st.st_dev, st.st_ino), here)
        elif os.path.islink(local):
            raise InputError(f"{printable(path)}: a broken symbolic link (to {printable(os.readlink(local))})")
        elif os.path.exists(local):
            raise InputError(f"{printable(path)}: not a regular file or folder")
        else:
            raise InputError(f"{printable(path)}: no such file or folder")
        account.add(here)
    if warn:
        warn_skipped(account)
    return Survey(found, account)


def warn_skipped(account: InputAccount) -> None:
    """The files skipped, a warning line per reason (bounded: the first names, the count, the bytes)."""
    for line in account.lines():
        _warn(f"skipped {line}")


def _gcs_outputs(path: str, names: list[str]) -> dict[str, str]:
    """The folders (relative prefixes ending in /) under a gs:// input folder that hold another
    fleet run's outputs or run state, the outermost only, each with why (fleet_output)."""
    present = set(names)
    entries: dict[str, set[str]] = {}  # folder ("" or "a/b/") -> the names directly in it
    for name in names:
        parts = name.split("/")
        for depth in range(len(parts)):
            entries.setdefault("".join(p + "/" for p in parts[:depth]), set()).add(parts[depth])
    skipped: dict[str, str] = {}
    for folder in sorted(entries):
        if any(folder.startswith(s) for s in skipped):
            continue
        why = fleet_output(folder, entries[folder], functools.partial(_present, present, folder))
        if why is None:
            continue
        if not folder:
            raise InputError(f"{path}: {why}, not a corpus; name its files to read them")
        skipped[folder] = why
    return skipped
