"""Coverage-guided fuzzing of the input layer with atheris (not run by the test suite).

Arbitrary bytes are read as each line format, whole and cut into items by the real planner;
the reader must never raise (the bad share is not judged here), every part must be a bounded
piece of one document, and cutting must not change what is read (the same lines, the same bad
records): tests/test_input_invariants.py's properties, on inputs coverage finds.

    pip install atheris
    python tests/fuzz/atheris_inputs.py -atheris_runs=200000      # or -max_total_time=600
"""

from __future__ import annotations

import io
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from fleet.core.store.local import LocalStore
    from fleet_jobs.text.inputs import ReadOptions, Tally, formats, iter_documents, plan_ranges, ranges

FORMATS = ["text", "jsonl", "cirrus", "wikiextractor"]
STORE = tempfile.mkdtemp(prefix="atheris-inputs-")
OPTIONS = ReadOptions(max_bad_share=1.0)


def read(data: bytes, fmt: str, target: int | None) -> tuple[list[list[str]], int]:
    tally = Tally()
    if target is None:
        return list(iter_documents(io.BytesIO(data), fmt, "none", "f", 0, tally, OPTIONS)), tally.bad
    with open(os.path.join(STORE, "f"), "wb") as f:
        f.write(data)
    parts = []
    for start, end, _ in plan_ranges(LocalStore(STORE), "f", len(data), fmt, target):
        parts += iter_documents(io.BytesIO(data[start:end]), fmt, "none", "f", start, tally, OPTIONS)
    return parts, tally.bad


def one(raw: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(raw)
    fmt = FORMATS[fdp.ConsumeIntInRange(0, 3)]
    formats.MAX_DOCUMENT_CHARS = fdp.ConsumeIntInRange(1, 64)
    formats.MAX_LINE_BYTES = fdp.ConsumeIntInRange(16, 128)
    formats._BLOCK = fdp.ConsumeIntInRange(1, formats.MAX_LINE_BYTES)
    ranges._SCAN = fdp.ConsumeIntInRange(1, 64)
    ranges._SHORT = fdp.ConsumeIntInRange(1, 128)
    target = fdp.ConsumeIntInRange(1, 256)
    data = fdp.ConsumeBytes(fdp.remaining_bytes())
    whole, bad = read(data, fmt, None)
    parts, items_bad = read(data, fmt, target)
    for part in parts:
        assert part and (sum(map(len, part)) <= formats.MAX_DOCUMENT_CHARS or len(part) == 1), part
    assert [x for p in parts for x in p] == [x for p in whole for x in p], (fmt, target, data)
    assert bad == items_bad, (fmt, target, data)
    if fmt != "text":
        assert parts == whole, (fmt, target, data)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
