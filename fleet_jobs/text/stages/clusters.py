"""``--dedup near`` through the bucket: the records between its stages and what each stage does
with them, as pure functions over sorted records (``fleet_jobs.text.stages`` wires them to the
fleet; ``near`` makes the signatures).

The rule. Documents are ordered as exact dedup orders them (plan order: input file, byte,
ordinal), and each has a node id, ``item << 32 | ordinal`` (its map item's number and its
ordinal there), which sorts in that order. A document is dropped when an earlier document
shares one of its LSH band keys and their sketches estimate a similarity at the threshold or
above (with ``exact`` too: or when an earlier document has its exact normalized text). Its
*parent* is the earliest such document. Parents are earlier, so they form a forest; a
cluster is a tree of it: a kept document (the root: it has no parent) and every dropped
document whose chain of parents leads to it. Which documents are dropped needs no clusters at
all, only the parent links; the clusters are what the counts and the sidecar report.

The stages, each keyed so that no worker holds more than its key range (the shuffle spills):

====================  ====================================================  =====================
stage                 an item gets (sorted by key, value)                    it emits
====================  ====================================================  =====================
map                   its documents                                          a band record per band
``near_bands``        band records, a bucket (a key) at a time              a link per dropped doc
                                                                             and bucket
``near_links``        a document's links (key: the document)                its parent link, twice:
                                                                             info at itself, query
                                                                             at its parent
``near_jump_<k>``     at node x: x's info (if x has a parent), then the     each child's pointer
  (JUMPS rounds)      queries of the nodes that point at x                  moved to x's: info at
                                                                             the child, query there
``near_clusters``     at node r: r's info, the queries pointing at r        a member record per
                                                                             member, to its map
                                                                             item's ``near`` item
``near``              (rereads map item i) the member records of item i,    the kept documents,
                      by ordinal                                             converted
====================  ====================================================  =====================

Pointer jumping: after ``near_links`` every dropped document points at its parent; each jump
round makes a pointer skip to its target's pointer, so after k rounds a document points 2**k
links up, or at its root. A tree deeper than 2**JUMPS (a chain of 33 successive edits, each
only similar to the one before) is not resolved: its deepest members are still dropped, and
counted as ``near_chains_unresolved``, under the cluster they reached. Memory per worker: a
bucket keeps its first BUCKET_KEEP documents' sketches (a bucket of 100,000 copies costs
100,000 comparisons with its first, and 64 x sketch bytes); every other stage streams its
records. Records: a band record is 17 + bands x rows bytes (14 a document), a link, info,
query or member record 18, so everything after the bands is about 36 bytes per dropped
document a round.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from fleet.job import item_key

JUMPS = 5  # pointer-jumping rounds: trees up to 2**5 = 32 links deep are resolved
BUCKET_KEEP = 64  # sketches a bucket keeps (its earliest documents) to compare the rest with
EXACT, NEAR = 0, 1  # the kind of a band record and of the link it makes (exact first among equal links)
INFO, QUERY = 0, 1  # pointer-jumping records: a node's own pointer; a child asking its pointer's
KEPT, DROPPED = 0, 1  # member records: a cluster's root; a dropped member

_NODE = struct.Struct(">QB")  # band record's value head: node, kind (then the sketch)
_EDGE = struct.Struct(">QBQ")  # a link: the earlier node, kind, the node
_LINK = struct.Struct(">BQQB")  # pointer jumping: tag, node, pointer, kind
_MEMBER = struct.Struct(">IBBQQ")  # ordinal, tag, kind, root, size (the cluster's, on a root's record)
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_MASK = (1 << 64) - 1

Emit = Callable[[int, bytes], None]


def node_id(item: int, ordinal: int) -> int:
    """A document's node: its map item's number, then its ordinal there (plan order)."""
    return item << 32 | ordinal


def node_place(node: int) -> tuple[int, int]:
    """(map item, ordinal) of a node."""
    return node >> 32, node & 0xFFFFFFFF


def node_key(node: int) -> int:
    """The key of a node's records: a bijective mix (SplitMix64's finalizer), so consecutive
    documents spread over every item of a stage instead of all going to the first."""
    z = node
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def band_record(node: int, kind: int, sketch_bytes: bytes) -> bytes:
    """A band record's value: the node (so a bucket's records sort in plan order), its kind, the sketch."""
    return _NODE.pack(node, kind) + sketch_bytes


@dataclass
class NearCounts:
    """What the near stages counted (an item's counters)."""

    links: int = 0  # documents found near an earlier one in a bucket (one per dropped document and bucket)
    compared: int = 0  # sketch comparisons
    unresolved: int = 0  # members whose tree was deeper than the jumps resolve
    clusters: int = 0
    largest: int = 0

    def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.links or self.compared:
            out.update(near_links=self.links, near_comparisons=self.compared)
        if self.unresolved:
            out["near_chains_unresolved"] = self.unresolved
        if self.clusters:
            out.update(near_clusters=self.clusters, near_cluster_size_max=self.largest)
        return out


def bucket_links(records: Iterable[tuple[int, bytes]], min_equal: int, emit: Emit, counts: NearCounts) -> None:
    """``near_bands``: per bucket (records of one key, in node order), each document's link to
    the earliest of the bucket's first BUCKET_KEEP documents whose sketch has ``min_equal``
    equal bytes with its own (an exact bucket: to its first document), emitted as a link record
    keyed by the document."""
    for _key, group in itertools.groupby(records, key=lambda kv: kv[0]):
        values = (v for _k, v in group)
        head = next(values)
        second = next(values, None)
        if second is not None:  # a bucket of one links nothing
            _bucket(head, itertools.chain([second], values), min_equal, emit, counts)


def _bucket(head: bytes, values: Iterator[bytes], min_equal: int, emit: Emit, counts: NearCounts) -> None:
    node0, kind0 = _NODE.unpack_from(head)
    if kind0 == EXACT:
        for value in values:
            node, kind = _NODE.unpack_from(value)
            if kind == EXACT:  # (a near band's key equal to an exact one's: 2**-64 a pair, and apart)
                _link(node, node0, EXACT, emit, counts)
        return
    width = len(head) - _NODE.size
    kept_nodes = [node0]
    kept = np.empty((BUCKET_KEEP, width), np.uint8)
    kept[0] = np.frombuffer(head, np.uint8, offset=_NODE.size)
    for value in values:
        node, kind = _NODE.unpack_from(value)
        if kind != NEAR or len(value) != len(head):
            continue
        sketch = np.frombuffer(value, np.uint8, offset=_NODE.size)
        n = len(kept_nodes)
        equal = np.count_nonzero(kept[:n] == sketch, axis=1)
        counts.compared += n
        hits = np.flatnonzero(equal >= min_equal)
        if len(hits):
            _link(node, kept_nodes[int(hits[0])], NEAR, emit, counts)
        if n < BUCKET_KEEP:
            kept[n] = sketch
            kept_nodes.append(node)


def _link(node: int, earlier: int, kind: int, emit: Emit, counts: NearCounts) -> None:
    counts.links += 1
    emit(node_key(node), _EDGE.pack(earlier, kind, node))  # a node's links sort by the earlier node, exact first


def parents(records: Iterable[tuple[int, bytes]], emit: Emit) -> None:
    """``near_links``: a document's links (sorted: the earliest first) make its parent; it is
    emitted as the node's info (keyed by the node) and as its query (keyed by the parent)."""
    for _key, group in itertools.groupby(records, key=lambda kv: kv[0]):
        parent, kind, node = _EDGE.unpack(next(group)[1])
        _pointer(node, parent, kind, emit)


def _pointer(node: int, pointer: int, kind: int, emit: Emit) -> None:
    emit(node_key(node), _LINK.pack(INFO, node, pointer, kind))
    emit(node_key(pointer), _LINK.pack(QUERY, node, pointer, kind))


def _at_node(records: Iterable[tuple[int, bytes]]) -> Iterator[tuple[tuple | None, Iterator[tuple]]]:
    """Per key: the node's info (tag INFO, node, pointer, kind) or None, and its queries."""
    for _key, group in itertools.groupby(records, key=lambda kv: kv[0]):
        rows = (_LINK.unpack(v) for _k, v in group)
        first = next(rows)
        if first[0] == INFO:
            yield first, rows
        else:
            yield None, itertools.chain([first], rows)


def jump(records: Iterable[tuple[int, bytes]], emit: Emit) -> None:
    """``near_jump_<k>``: at node x, every node pointing at x now points at x's pointer (x itself
    if x is a root): its info and its query emitted anew."""
    for info, queries in _at_node(records):
        for _tag, child, pointer, kind in queries:
            _pointer(child, info[2] if info else pointer, kind, emit)


def members(records: Iterable[tuple[int, bytes]], near_items: int, emit: Emit, counts: NearCounts) -> None:
    """``near_clusters``: at a root, its cluster: a member record for it (kept, with the size) and
    one per dropped member, each keyed to its map item's ``near`` item by ordinal (``item_key``).
    At a node that still has a pointer, the tree was deeper than the jumps: its members are
    dropped all the same, counted as unresolved."""

    def to_item(node: int, tag: int, kind: int, root: int, size: int) -> None:
        item, ordinal = node_place(node)
        emit(item_key(item, near_items, ordinal), _MEMBER.pack(ordinal, tag, kind, root, size))

    for info, queries in _at_node(records):
        size = 0
        root = None
        for _tag, child, pointer, kind in queries:
            root = pointer
            size += 1
            to_item(child, DROPPED, kind, pointer, 0)
        if info is not None:
            counts.unresolved += size
        elif root is not None:
            counts.clusters += 1
            counts.largest = max(counts.largest, size + 1)
            to_item(root, KEPT, NEAR, root, size + 1)


@dataclass(frozen=True)
class Member:
    """A document's member record as the ``near`` item reads it."""

    ordinal: int
    dropped: bool
    kind: int  # NEAR or EXACT: how it was found (a dropped document's own link)
    root: int  # the cluster's kept document (node)
    size: int  # the cluster's size, on the kept document's record (0 on the others)

    @property
    def cluster(self) -> str:
        """The cluster's name in the sidecar: its kept document's map item and ordinal."""
        item, ordinal = node_place(self.root)
        return f"{item}:{ordinal}"


def read_members(records: Iterable[tuple[int, bytes]]) -> Iterator[Member]:
    """The member records of a ``near`` item, by ordinal."""
    for _key, value in records:
        ordinal, tag, kind, root, size = _MEMBER.unpack(value)
        yield Member(ordinal, tag == DROPPED, kind, root, size)
