"""What a text job writes: a DocumentConverter, one item's documents (each a list of lines) to
outputs, and how often a reader of documents checks the item's lease (CHECK_EVERY).

Below both routes that feed it documents, the map (``job.TextJob``: an item's input files) and
the dedup stage (``stages``: the documents kept), which import it; ``fleet_jobs.text.job``
re-exports DocumentConverter, the name a job imports.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Iterable

from fleet.job import ItemContext

if TYPE_CHECKING:  # (output imports no converter; this only names its type)
    from .output import ExampleSink


CHECK_EVERY = 64  # documents between checkpoints


class DocumentConverter(abc.ABC):
    """The pure part of a text job: one item's documents to outputs, and counters."""

    # True (``provenance=true``): ``convert`` gets a fleet_jobs.text.provenance.PlacedDocuments, whose
    # ``take`` gives each document's place in the corpus, in a map item (not from a stage).
    provenance: bool = False
    # Input fields (``fields=url,id``) each place carries (``Place.fields``): non-empty, ``convert``
    # gets a PlacedDocuments too, its sidecar written or not (``provenance``).
    fields: tuple[str, ...] = ()

    @abc.abstractmethod
    def convert(self, documents: Iterable[list[str]], ctx: ItemContext, sink: ExampleSink) -> dict[str, float]:
        """Turn one item's documents (each a list of lines) into outputs; return counters. ``sink``:
        the item's (``open_writer`` writes its files), or, when its outputs feed a stage, the shuffle."""
