"""``provenance=true``: a sidecar per output that maps each example or sequence to its source,
so that a bad sample in training can be traced back to the corpus.

``part-<item>.provenance.jsonl``: one JSON line per example (or sequence) of the item's output,
in output order. Each names the example's first document: ``file`` (the input file), ``offset``
(the byte where its record starts; in a compressed file, a byte of the decompressed stream) or
``row`` (Parquet: its row in the file), and ``document`` (its ordinal among the item's documents,
as the job received them: a document longer than MAX_DOCUMENT_CHARS is several, in parts). An
example that holds several documents (``pack_documents``) also has ``spans``: every one of them,
in order, each as such an object. Where the places come from: fleet_jobs.text.inputs.places.

JSON Lines rather than Parquet: a run's outputs are found by their suffix (``.parquet`` is an
output format), and a line per example is read by ``sed -n <n+1>p`` next to its example.

The places exist only in the map, where documents are read from the corpus: with ``--dedup``
the documents reach the converter from the shuffle and with ``--shards`` the examples are
shuffled into shards, so ``provenance=true`` refuses both, in one line.
"""

from __future__ import annotations

import contextlib
import json
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence

from fleet.job import ConfigError, Sink, StageOptions

from .inputs.places import Place

PROVENANCE_SUFFIX = ".provenance.jsonl"


class PlacedDocuments:
    """An item's documents, and the place of each, known once the document has been handed on
    (``take`` them as the documents are used: a batch's places after the batch)."""

    def __init__(self, documents: Iterable[list[str]], places: list[Place]):
        self._documents, self._places = documents, places

    def __iter__(self) -> Iterator[list[str]]:
        return iter(self._documents)

    def mapped(self, change: Callable[[list[str]], list[str]]) -> PlacedDocuments:
        """The same documents, each changed (one for one: split_sentences), with the same places."""
        return PlacedDocuments(map(change, self._documents), self._places)

    def take(self, n: int) -> list[Place]:
        """The places of the next ``n`` documents handed on (in order), forgotten here."""
        if n > len(self._places):
            raise ValueError(f"places of {n} documents asked, {len(self._places)} handed on")
        out = self._places[:n]
        del self._places[:n]
        return out


def check_provenance(provenance: bool, options: StageOptions) -> None:
    """Plan time: provenance is known in the map only (see the module's docstring)."""
    if provenance and options.shards:
        raise ConfigError(
            "option provenance: not with --shards (a shard's examples come shuffled from every "
            "item; leave provenance unset, or run without --shards)"
        )
    if provenance and options.dedup:
        raise ConfigError(
            "option provenance: not with --dedup (its documents reach the converter from the "
            "shuffle, not from the corpus files)"
        )


class ProvenanceWriter:
    """The sidecar's lines, written as the examples are."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.lines = 0

    def write(self, examples: Sequence[Sequence[Place]]) -> None:
        """One line per example: the places of the documents it holds, in order (at least one)."""
        lines = []
        for places in examples:
            record = places[0].as_json()
            if len(places) > 1:
                record["spans"] = [p.as_json() for p in places]
            lines.append(json.dumps(record, separators=(",", ":")) + "\n")
        self.out.write("".join(lines).encode("ascii"))  # json.dumps escapes the rest
        self.lines += len(lines)


@contextlib.contextmanager
def open_provenance(sink: Sink) -> Iterator[ProvenanceWriter]:
    """The item's sidecar, ``part-<item>.provenance.jsonl``, complete when the block ends."""
    with sink.open(PROVENANCE_SUFFIX) as raw:
        yield ProvenanceWriter(raw)


class Sidecar:
    """An item's sidecar opened beside its output and fed as examples are written, for a converter
    that writes in several places (``with`` would re-indent its body): ``close`` it at the end with
    the examples written, which the lines must match."""

    def __init__(self, documents: Iterable[list[str]], sink: Sink):
        if not isinstance(documents, PlacedDocuments):
            raise TypeError("provenance=true: these documents come with no places (a map item's do)")
        self.documents = documents
        self.raw = sink.open(PROVENANCE_SUFFIX)
        self.out = ProvenanceWriter(self.raw)

    def write(self, examples: Sequence[Sequence[Place]]) -> None:
        self.out.write(examples)

    def close(self, examples: int) -> None:
        self.raw.close()
        if self.out.lines != examples:
            raise AssertionError(f"provenance: {self.out.lines} lines for {examples} examples")
