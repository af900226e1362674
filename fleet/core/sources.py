"""Finding a run's input objects: files and folders (local or gs://) named as input, each
object planned once and pinned to the version found.

Once means once per file, not per name: a symbolic link, a hard link or the same folder
named twice all reach one inode, and its bytes are read once. Inside a folder the job says
which files are input (``Job.accepts``: a text job skips READMEs); hidden files ('.', '_')
and the outputs or run state of another fleet run, named in a warning, never are. What is in
an object is the job's business: this module never reads one.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Callable, Iterable, Iterator

from fleet.job import InputError, Source, printable
from fleet.core.layout import RUNS, SPEC, STATE_DIR
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
    if "summary.json" in entries and any(e.startswith("part-") for e in entries):
        return "the outputs of a fleet run: it holds summary.json and part-* files"
    if folder.rstrip("/").rsplit("/", 1)[-1] == RUNS.rstrip("/") and any(exists(f"{e}/{SPEC}") for e in entries):
        return f"the run state of a fleet bucket: it holds {RUNS}*/{SPEC}"
    return None


def _skip_output(display: str, why: str) -> None:
    _warn(f"{display}: {why}; skipped (not corpus)")


def _warn(message: str) -> None:
    log.warning("warning: %s", message)  # on stderr even where logging is not set up (logging.lastResort)


def _readable(path: str, display: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise InputError(f"{display}: cannot read it ({e.strerror or e})") from None


def _walk(root: str, exclude: tuple[str, ...], accept: Callable[[str], bool] = every_file
          ) -> Iterator[tuple[str, os.stat_result, str]]:
    """Input files under a folder, following symbolic links to files and folders: (name, stat,
    real path). A folder reached twice (a link loop, or two links to one folder) is read once; a
    broken or looping link, a FIFO or a device is named in a warning and skipped.

    The real path of an entry that is no link is its folder's real path and its name: resolving
    each of a corpus of many small files costs a system call per part of its path."""
    seen: set[tuple[int, int]] = set()

    def visit(folder: str, rel: str) -> Iterator[tuple[str, os.stat_result, str]]:
        st = os.stat(folder)
        real_folder = os.path.realpath(folder)
        if (st.st_dev, st.st_ino) in seen:
            _warn(f"{printable(folder)}: a folder already read (a symbolic link loop or a second link to it); "
                  "read once")
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
            _skip_output(printable(folder), why)
            return
        for entry in entries:
            if entry.startswith((".", "_")):
                continue
            path = os.path.join(folder, entry)
            name = f"{rel}{entry}"
            try:
                link = stat.S_ISLNK(os.lstat(path).st_mode)
            except OSError:  # gone since the listing: os.stat below names it
                link = True
            real = os.path.realpath(path) if link else os.path.join(real_folder, entry)
            if any(real == x or real.startswith(x + os.sep) for x in exclude):
                continue
            try:
                st = os.stat(path) if link else os.lstat(path)
            except OSError as e:
                target = os.readlink(path) if os.path.islink(path) else "?"
                why = "a symbolic link loop" if e.errno == 40 else f"a broken symbolic link (to {target})" \
                    if os.path.islink(path) else e.strerror
                _warn(f"{printable(path)}: {printable(why)}; skipped")
                continue
            if stat.S_ISDIR(st.st_mode):
                yield from visit(path, name + "/")
            elif not accept(name):
                continue
            elif not stat.S_ISREG(st.st_mode):
                _warn(f"{printable(path)}: not a regular file (a FIFO, socket or device); skipped")
            else:
                yield name, st, real

    yield from visit(root, "")


def find_sources(paths: list[str], exclude: list[str] = (), accept: Callable[[str], bool] = every_file
                 ) -> list[Source]:
    """Expand files and folders (local or gs://) into input objects, in a stable order.

    Each file is planned once, however often it is named (directly, inside a named
    folder, or through links): the same corpus twice would be converted twice. Paths
    under ``exclude`` (the output folder of `fleet local`) are never inputs. ``accept(name)``
    says which files inside a folder are input (``Job.accepts``)."""
    found: list[Source] = []
    seen: dict[object, str] = {}  # (device, inode) of a local file, or a URL -> how it was first found
    excluded = tuple(os.path.realpath(x) for x in exclude)

    def add(inp: Source, key: object) -> None:
        if key in seen:
            if seen[key] != inp.display:
                _warn(f"{inp.display}: the same file as {seen[key]}; planned once")
            else:
                _warn(f"{inp.display}: named twice; planned once")
            return
        seen[key] = inp.display
        found.append(inp)

    for path in paths:
        if path.startswith("gs://"):
            root, prefix = split_url(path)
            store = open_store(root)
            blob = store.stat(prefix) if prefix else None
            if blob is not None:
                add(Source(root, prefix, blob.size, blob.version), f"{root}/{prefix}")
                continue
            folder = prefix + "/" if prefix else ""
            listed = list(store.list(folder))
            skipped = _gcs_outputs(path, [b.name[len(folder):] for b in listed])
            blobs = [b for b in listed if b.size > 0 and not _hidden(rel := b.name[len(folder):]) and accept(rel)
                     and not any(rel.startswith(s) for s in skipped)]
            if not blobs:
                raise InputError(f"{path}: no input files there")
            for b in blobs:
                add(Source(root, b.name, b.size, b.version), f"{root}/{b.name}")
            continue
        if "://" in path and not path.startswith("file://"):
            raise InputError(f"{path}: unsupported URL (inputs are local paths or gs://BUCKET/PATH)")
        local = os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)
        if os.path.isfile(local):
            st = os.stat(local)
            inp = Source(os.path.dirname(local), os.path.basename(local), st.st_size, file_version(st))
            _readable(local, inp.display)
            add(inp, (st.st_dev, st.st_ino))  # a hard or symbolic link to a file planned already: once
        elif os.path.isdir(local):
            files = [(Source(local, rel, st.st_size, file_version(st)), st, real)
                     for rel, st, real in _walk(local, excluded, accept)]
            if not files:
                raise InputError(f"{printable(path)}: no input files there")
            for inp, st, real in files:
                if any(real == x or real.startswith(x + os.sep) for x in excluded):
                    continue  # a link into the output folder
                _readable(real, inp.display)
                add(inp, (st.st_dev, st.st_ino))
        elif os.path.islink(local):
            raise InputError(f"{printable(path)}: a broken symbolic link (to {printable(os.readlink(local))})")
        elif os.path.exists(local):
            raise InputError(f"{printable(path)}: not a regular file or folder")
        else:
            raise InputError(f"{printable(path)}: no such file or folder")
    return found


def _gcs_outputs(path: str, names: list[str]) -> list[str]:
    """The folders (relative prefixes ending in /) under a gs:// input folder that hold another
    fleet run's outputs or run state, each named in a warning; the outermost only."""
    present = set(names)
    entries: dict[str, set[str]] = {}  # folder ("" or "a/b/") -> the names directly in it
    for name in names:
        parts = name.split("/")
        for depth in range(len(parts)):
            entries.setdefault("".join(p + "/" for p in parts[:depth]), set()).add(parts[depth])
    skipped: list[str] = []
    for folder in sorted(entries):
        if any(folder.startswith(s) for s in skipped):
            continue
        why = fleet_output(folder, entries[folder], lambda rel, f=folder: f + rel in present)
        if why is None:
            continue
        if not folder:
            raise InputError(f"{path}: {why}, not a corpus; name its files to read them")
        _skip_output(f"{path.rstrip('/')}/{folder.rstrip('/')}", why)
        skipped.append(folder)
    return skipped
