"""causal_lm's block records: ``fleet.formats.tfrecord.blocks`` (the format's Python reference
and its C counterpart, ``records.c``) with the C core of the text jobs' library when it loads.

The library (``fleet_jobs.text.tokenizers.native``: the tokenizers' and the records' C, built as one) is
the jobs' to build and load; the format takes its ``rec_blocks`` function, or works in Python.
"""

from __future__ import annotations

from fleet.formats.tfrecord import blocks
from fleet_jobs.text.tokenizers import native


class BlockRecords(blocks.BlockRecords):
    def __init__(self, width: int, padded: bool, use_native: bool | None = None):
        """``use_native``: None, the C path when ``native.available()`` gives the library; False,
        Python; True, C (``NativeError`` when there is no library)."""
        lib = native.available() if use_native is None else native.load() if use_native else None
        super().__init__(width, padded, lib.lib.rec_blocks if lib is not None else None)
