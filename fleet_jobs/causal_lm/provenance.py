"""causal_lm's ``provenance=true``: which documents each block (or sequence) holds, in output order,
into the item's sidecar (fleet_jobs.text.provenance).

A block's documents follow from the documents' lengths alone, as ``blocks.BlockCutter`` cuts
them: without ``pack_documents`` each document's ids and its end-of-document id fill blocks of
their own (the last one padded, or dropped with ``last_block=drop``); with it the item is one
stream, and a block holds every document with an id in it (``spans``). A document with no ids
makes no block. ``output=megatron|tokens``: one sequence per document with ids.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Iterable, Sequence, TypeVar

import numpy as np

from fleet.job import Sink

from fleet_jobs.text.inputs.places import Place
from fleet_jobs.text.provenance import Sidecar

from .blocks import BlockOptions

T = TypeVar("T")


class BlockSources(Generic[T]):
    """The sources of the blocks a BlockCutter with the same options makes, call for call."""

    def __init__(self, opts: BlockOptions):
        self.opts = opts
        self.stream: deque[list] = deque()  # pack_documents: [source, ids of it not yet in a block]
        self.held = 0  # ids in the stream

    def add(self, lengths: Sequence[int], sources: Sequence[T]) -> list[list[T]]:
        """The sources of the blocks ``BlockCutter.add`` makes of documents of these lengths."""
        size, pad, framing = self.opts.block_size, self.opts.last_block == "pad", self.opts.framing
        out: list[list[T]] = []
        for n, source in zip(lengths, sources):
            if not n:
                continue
            if not self.opts.pack_documents:
                full, rest = divmod(n + framing, size)
                out += [[source] for _ in range(full + int(bool(rest) and pad))]
                continue
            self.stream.append([source, n + framing])
            self.held += n + framing
            while self.held >= size:
                block, need = [], size
                while need:
                    head = self.stream[0]
                    block.append(head[0])
                    took = min(need, head[1])
                    need -= took
                    head[1] -= took
                    if not head[1]:
                        self.stream.popleft()
                self.held -= size
                out.append(block)
        return out

    def finish(self) -> list[list[T]]:
        """The sources of what ``BlockCutter.finish`` makes: the packed stream's padded tail."""
        tail = [source for source, _ in self.stream]
        self.stream.clear()
        self.held = 0
        return [tail] if tail and self.opts.last_block == "pad" else []


class Trace(Sidecar):
    """An item's sidecar, fed batch by batch as the converter tokenizes and writes."""

    def __init__(self, documents: Iterable[list[str]], sink: Sink, opts: BlockOptions | None, file: bool = True):
        """``documents``: a PlacedDocuments (Sidecar raises TypeError for any other); ``file``: write
        the sidecar (without it, the places are only handed back, for the fields' columns)."""
        super().__init__(documents, sink, file)
        self.sources: BlockSources[Place] | None = BlockSources(opts) if opts else None

    def batch(self, lengths: Sequence[int] | np.ndarray) -> Sequence[Sequence[Place]]:
        """A batch of documents tokenized (``lengths``: each document's number of ids): the lines
        of its blocks, or (no BlockOptions: one sequence per document) of its sequences; the places
        of each, handed back."""
        places = self.documents.take(len(lengths))
        if self.sources is None:
            return self.write([[place] for place, n in zip(places, lengths) if n])
        return self.write(self.sources.add([int(n) for n in lengths], places))

    def finish(self) -> Sequence[Sequence[Place]]:
        """The lines of what ``BlockCutter.finish`` makes (the packed stream's padded tail)."""
        return self.write(self.sources.finish()) if self.sources is not None else []

    def close(self, examples: int) -> None:
        """The sidecar complete; ``examples``: what the output holds, which it must match line for line."""
        super().close(examples)
