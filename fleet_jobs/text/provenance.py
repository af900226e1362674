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

``fields=url,id`` (electra_zh_en, causal_lm): input fields carried along with each place, found
by the same second reading (JSON keys, Parquet columns; plain text and WikiExtractor have none,
so their values are null). Each value is text (``places.field_text``: a string as it is, any other
value as its JSON, null where the record lacks it). They go into the sidecar (``"fields"`` in
each place) and, with ``output=parquet|mds``, into a column per field: for each example, the
values of every document it holds, in order (``field_columns``), so a packed block carries them
all and an unpacked one a list of one. Fields ride on places, so they refuse what provenance
refuses.
"""

from __future__ import annotations

import contextlib
import json
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence

from fleet.formats.writer import Column
from fleet.job import ConfigError, Sink, StageOptions

from .inputs.places import Place

PROVENANCE_SUFFIX = ".provenance.jsonl"
FIELD_OUTPUTS = ("parquet", "mds")  # the outputs with a column per field


def parse_fields(value: str) -> tuple[str, ...]:
    """The option ``fields`` (``url,id``) as names, in order; ConfigError for an empty or repeated one."""
    if not str(value).strip():
        return ()
    names = tuple(name.strip() for name in str(value).split(","))
    if any(not name for name in names):
        raise ConfigError(f"option fields: {value!r} names an empty field (give names, comma-separated: url,id)")
    if len(set(names)) != len(names):
        raise ConfigError(f"option fields: {value!r} names a field twice")
    return names


def check_fields(value: str, output: str, provenance: bool, features: Iterable[str]) -> tuple[str, ...]:
    """Plan time: the fields go somewhere (a column, or the sidecar), and no field is named as a feature."""
    fields = parse_fields(value)
    if fields and output not in FIELD_OUTPUTS and not provenance:
        raise ConfigError(
            f"option fields: output={output} has no columns to carry them; use output=parquet or "
            "output=mds, or provenance=true (the sidecar carries them)"
        )
    clash = sorted(set(fields) & set(features)) if output in FIELD_OUTPUTS else []
    if clash:
        raise ConfigError(f"option fields: {clash[0]!r} is the name of one of the examples' features")
    return fields


def field_columns(fields: Sequence[str]) -> list[Column]:
    """The writer's columns of the fields: a list of text values each (``Column`` kind "text")."""
    return [Column(name, "text") for name in fields]


def field_values(examples: Sequence[Sequence[Place]], fields: Sequence[str]) -> dict[str, list[list[str | None]]]:
    """Each field's column for these examples: per example, its documents' values, in order."""
    return {name: [[(p.fields or {}).get(name) for p in places] for places in examples] for name in fields}


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


def check_provenance(provenance: bool, options: StageOptions, option: str = "provenance") -> None:
    """Plan time: provenance (and the fields that ride on it: ``option``) is known in the map only
    (see the module's docstring)."""
    if provenance and options.shards:
        raise ConfigError(
            f"option {option}: not with --shards (a shard's examples come shuffled from every "
            f"item; leave {option} unset, or run without --shards)"
        )
    if provenance and options.dedup:
        raise ConfigError(
            f"option {option}: not with --dedup (its documents reach the converter from the "
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

    def __init__(self, documents: Iterable[list[str]], sink: Sink, file: bool = True):
        """``file``: write the sidecar (provenance=true); without it the places are only handed
        back by ``write``, for the fields' columns."""
        if not isinstance(documents, PlacedDocuments):
            raise TypeError("provenance=true: these documents come with no places (a map item's do)")
        self.documents = documents
        self.raw = sink.open(PROVENANCE_SUFFIX) if file else None
        self.out = ProvenanceWriter(self.raw) if self.raw else None
        self.lines = 0

    def write(self, examples: Sequence[Sequence[Place]]) -> Sequence[Sequence[Place]]:
        """The examples' places into the sidecar; handed back (for ``field_values``)."""
        if self.out:
            self.out.write(examples)
        self.lines += len(examples)
        return examples

    def close(self, examples: int) -> None:
        if self.raw:
            self.raw.close()
        if self.lines != examples:
            raise AssertionError(f"provenance: {self.lines} lines for {examples} examples")
