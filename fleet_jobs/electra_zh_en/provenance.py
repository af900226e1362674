"""electra_zh_en's ``provenance=true``: the document each example comes from (fleet_jobs.text.provenance).

Without ``pack_documents`` an example holds lines of one document (each is seeded by its own
text), so its document is the one its first id comes from: found from ``seeded_document_runs``'
runs into the group's ids laid end to end. ``pack_documents`` mixes documents, and refuses the
option (as the bert job, whose pairs mix them, has none).
"""

from __future__ import annotations

from typing import Sequence, TypeVar

import numpy as np

from .builder import FlatExamples

T = TypeVar("T")


def example_documents(
    runs: FlatExamples, line_lengths, group: Sequence[Sequence[str]], sources: Sequence[T]
) -> list[list[T]]:
    """``[source of its document]`` per example of ``runs`` (a group's, in order)."""
    if not runs.lengths:
        return []
    line_starts = np.concatenate([[0], np.cumsum(np.asarray(line_lengths, np.int64))])
    first_lines = np.concatenate([[0], np.cumsum([len(document) for document in group])[:-1]]).astype(np.int64)
    doc_starts = line_starts[first_lines]  # where each document's ids start (an empty one: where the next does)
    out, r = [], 0
    starts, sizes = runs.run_starts, runs.run_lengths
    for length in runs.lengths:
        total, first = 0, -1
        while total < length:
            if first < 0 and starts[r] >= 0 and sizes[r] > 0:
                first = starts[r]
            total += sizes[r]
            r += 1
        if first < 0:
            raise AssertionError("provenance: an example with no ids of a document")
        out.append([sources[int(np.searchsorted(doc_starts, first, "right")) - 1]])
    return out
