"""A bounded sample of a corpus's documents, from every input file, in every format fleet reads.

``check`` must answer in seconds whatever the corpus size, so each file gives at most its
share of a byte budget (of text read) and the whole stops at a time limit. Files are
streamed (ranged reads on ``gs://``, a row group batch at a time for Parquet), so a
500 MB shard costs only the bytes sampled. With no bounds (``math.inf``) it reads every
document, as ``vocab`` does, with the same counting of bad records.

A document holding a lone surrogate (JSON's ``"\\ud800"`` is valid JSON but not text) is a
bad record here, counted with its file, whatever the reader let through: the tools encode
text to UTF-8 (the vocab trainer, the survey's byte counts), which fails on one.
"""

from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass, field
from typing import Iterator

from fleet.job import InputError, Source
from fleet.job import StoreError, StoreFile, open_store

from fleet_jobs.text.inputs import ReadOptions, Tally, describe, file_format, find_corpus, iter_documents
from fleet_jobs.text.inputs.parquet import parquet_documents, row_groups

_MIN_FILE_BYTES = 256 << 10  # a file's share is never smaller than this
_SURROGATE = re.compile("[\ud800-\udfff]")
_EXAMPLES = 3  # bad records described, per file and in all


@dataclass
class Sampled:
    """What the sample covered, for the report's first lines."""

    files: int = 0  # input files found
    files_read: int = 0
    formats: dict[str, int] = field(default_factory=dict)
    bad: int = 0
    bad_examples: list[str] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0


def sample_documents(
    paths: list[str], max_bytes: float, max_seconds: float, options: ReadOptions, sampled: Sampled
) -> Iterator[list[str]]:
    """Documents from each file in turn, each file up to its share of ``max_bytes`` of text;
    stops at ``max_seconds`` (``math.inf`` for both: every document). Raises InputError (naming
    the file) when a file cannot be read or is not the format it looks like."""
    start = time.monotonic()
    files = find_corpus(paths)
    sampled.files = len(files)
    share = max(_MIN_FILE_BYTES, max_bytes / max(1, len(files)))  # (not //: inf // n is nan)
    total = 0
    for inp in files:
        if sampled.files_read and (total >= max_bytes or time.monotonic() - start > max_seconds):
            sampled.timed_out = time.monotonic() - start > max_seconds
            break  # (the first file always gives at least one document)
        sampled.files_read += 1
        tally = Tally()
        taken = 0
        try:
            for number, doc in enumerate(_documents(inp, options, tally, sampled), 1):
                if any(map(_SURROGATE.search, doc)):
                    tally.bad += 1
                    tally.documents -= 1  # (the reader counted it as read)
                    if len(tally.examples) < _EXAMPLES:
                        tally.examples.append(
                            f"{inp.display}: document {number}: a lone surrogate (\\ud800-\\udfff), not text"
                        )
                    continue
                yield doc
                size = sum(len(line) for line in doc)
                taken += size
                total += size
                if taken >= share or time.monotonic() - start > max_seconds:
                    break
        except StoreError as e:
            raise InputError(f"{inp.display}: cannot read ({e})") from None
        except OSError as e:
            raise InputError(f"{inp.display}: cannot read ({e.strerror or e})") from None
        if tally.bad and tally.bad > options.max_bad_share * (tally.records + tally.bad):
            raise InputError(
                f"{inp.display}: {tally.bad} of {tally.records + tally.bad} records read are bad: "
                f"not this format? (first: {tally.examples[0]})"
            )
        sampled.bad += tally.bad
        sampled.bad_examples += tally.examples[: max(0, _EXAMPLES - len(sampled.bad_examples))]
    sampled.seconds = time.monotonic() - start


def _documents(inp: Source, options: ReadOptions, tally: Tally, sampled: Sampled) -> Iterator[list[str]]:
    store = open_store(inp.url)
    fmt, (_, compression) = file_format(store, inp.name, inp.size), describe(inp.name)
    sampled.formats[fmt] = sampled.formats.get(fmt, 0) + 1
    version = inp.version or None
    if fmt == "parquet":
        groups = row_groups(store, inp.name, inp.size, version, options.text_column, inp.display)
        yield from parquet_documents(store, inp.name, inp.size, version, 0, len(groups), inp.display, tally, options)
        return
    raw = io.BufferedReader(StoreFile(store, inp.name, inp.size, version), 4 << 20)
    yield from iter_documents(raw, fmt, compression, inp.display, tally=tally, options=options)
