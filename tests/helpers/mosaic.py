"""mosaicml-streaming's own writer and reader, run in a child process for tests/test_mds.py.

    python tests/helpers/mosaic.py read REMOTE CACHE OUT.npz
        every sample of ``StreamingDataset(remote=REMOTE, local=CACHE, shuffle=False)``, in order,
        stacked per column into OUT.npz (str columns as an array of str); the columns of other
        values (``json``: lists of field values) into OUT.json, a list per column
    python tests/helpers/mosaic.py write IN.npz COLUMNS_JSON COMPRESSION SIZE_LIMIT FOLDER
        ``MDSWriter`` over the rows of IN.npz (row i of every array), its columns' encodings
        given as JSON, COMPRESSION "none" or streaming's name
    python tests/helpers/mosaic.py serve
        either of those per line of stdin (a JSON list: the command and its arguments), answered
        with a line on stdout (``{"error": null}``, or the traceback): ``Child`` keeps one such
        process per test process, which imports streaming (and torch: 5-6 s of CPU) once, not
        once per read or write

The package is installed without its dependencies (the README's test command): it pins numpy below
2.2 and pulls torchvision, which does not import beside the project's torch build. Its top-level
``streaming`` imports its vision datasets, and through them torchvision, though nothing of that
reads or writes MDS: a child process gets an empty ``torchvision`` (the names those modules
import at load), so that the real MDSWriter and StreamingDataset run, and the stub stays out of the
tests' own interpreter.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import json
import os
import selectors
import subprocess
import sys
import tempfile
import traceback
import types
from typing import IO

import numpy as np


def _stub(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class _Unused:
    """What streaming's vision modules subclass or call at import; never used to read MDS."""


def _without_torchvision() -> None:
    functional = _stub("torchvision.transforms.functional", to_tensor=_Unused)
    transforms = _stub("torchvision.transforms", functional=functional)
    datasets = _stub("torchvision.datasets", VisionDataset=_Unused)
    _stub("torchvision", datasets=datasets, transforms=transforms)


def read(remote: str, cache: str, out: str) -> None:
    from streaming import StreamingDataset

    dataset = StreamingDataset(remote=remote, local=cache, shuffle=False, batch_size=1)
    rows = [dataset[i] for i in range(len(dataset))]
    names = sorted(rows[0]) if rows else []
    arrays = [n for n in names if isinstance(rows[0][n], (np.ndarray, str))]
    np.savez(out, **{name: np.array([row[name] for row in rows]) for name in arrays}, __length__=np.array(len(rows)))
    with open(out + ".json", "w") as f:
        json.dump({name: [row[name] for row in rows] for name in names if name not in arrays}, f)


def write(rows_path: str, columns: str, compression: str, size_limit: str, folder: str) -> None:
    from streaming import MDSWriter

    data = np.load(rows_path, allow_pickle=False)
    encodings = json.loads(columns)
    n = len(data[next(iter(encodings))])
    with MDSWriter(
        out=folder,
        columns=encodings,
        compression=None if compression == "none" else compression,
        size_limit=int(size_limit),
    ) as writer:
        for i in range(n):
            writer.write(
                {name: (str(data[name][i]) if code == "str" else data[name][i]) for name, code in encodings.items()}
            )


COMMANDS = {"read": read, "write": write}


def serve() -> None:
    answers, sys.stdout = sys.stdout, sys.stderr  # (what the library prints cannot be taken for an answer)
    for line in sys.stdin:
        command, *args = json.loads(line)
        try:
            COMMANDS[command](*args)
            error = None
        except Exception:
            error = traceback.format_exc()
        print(json.dumps({"error": error}), file=answers, flush=True)


class Child:
    """``python mosaic.py serve``, started at the first call and ended at this process's exit.
    ``call("read", ...)`` fails the test with the child's traceback, or its stderr if it died."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.stderr: IO[str] = tempfile.TemporaryFile("w+")  # (a pipe nobody reads until the end could fill)
        atexit.register(self.close)

    def call(self, *args: str, timeout: float = 300) -> None:
        if self.process is None or self.process.poll() is not None:
            self.stderr.seek(0)
            self.stderr.truncate()
            self.process = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                text=True,
            )
        process = self.process
        assert process.stdin and process.stdout
        process.stdin.write(json.dumps(args) + "\n")
        process.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            ready = selector.select(timeout)
        answer = process.stdout.readline() if ready else ""
        if not answer:
            process.kill()
            process.wait()
            self.stderr.seek(0)
            raise AssertionError(f"mosaic.py {args[0]}: no answer (timed out or died)\n{self.stderr.read()[-3000:]}")
        error = json.loads(answer)["error"]
        assert error is None, error[-3000:]

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.communicate(timeout=30)  # (stdin closed: its loop ends)


if __name__ == "__main__":
    _without_torchvision()
    if sys.argv[1] == "serve":
        serve()
    else:
        COMMANDS[sys.argv[1]](*sys.argv[2:])
