"""The text jobs' inputs: corpus formats, cutting files into items at document boundaries,
reading an item's documents, and counting its bad records.

A corpus is plain text (one line per sentence or paragraph, a blank line
between documents), JSON Lines with a ``text`` field (CirrusSearch dumps too),
WikiExtractor output, or Parquet, optionally compressed with gzip, bzip2, xz or zstd.
A plain file is cut into byte ranges that start and end at a document boundary, so a
document is never split and every line is read exactly once. Compressed files, and text in
UTF-16 or UTF-32, cannot be entered in the middle, so each is one item; a Parquet file's items are ranges of its row groups.

This is the text layer's, not the fleet's: the fleet finds input objects
(fleet.core.sources), pins their versions and hands a job an item's byte range; the text
jobs (``fleet_jobs.text.job.TextJob``) say here how a file is cut and read.

Modules: ``names`` (which files in a folder are corpus; a format from a name),
``ranges`` (cutting them into items), ``compression``, ``encoding`` (UTF-16 and UTF-32 by their byte-order mark), ``formats`` (documents from bytes;
``longjson`` for a JSON record too long for a line), ``parquet``, ``slices`` (an item's
bytes, checked to be the ones planned).

Memory stays bounded whatever the data: a document longer than
MAX_DOCUMENT_CHARS is handed on in parts cut at line boundaries (counted as
``documents_cut``), and a document longer than an item is cut between items
at a line boundary too. Each item pins the version of its input file (size,
mtime and inode of a local file, the generation of a ``gs://`` object), so a
file that changes under a run fails its items instead of feeding them other
bytes.
"""

from fleet_jobs.text.inputs.compression import COMPRESSIONS, decompressed
from fleet_jobs.text.inputs.formats import (
    FORMATS,
    MAX_DOCUMENT_CHARS,
    MAX_LINE_BYTES,
    ReadOptions,
    Tally,
    iter_documents,
    read_all,
)
from fleet_jobs.text.inputs.names import corpus_file, describe
from fleet_jobs.text.inputs.ranges import cut_ranges, plan_ranges
from fleet_jobs.text.inputs.slices import (
    Slice,
    cut_source,
    file_format,
    find_corpus,
    iter_path_documents,
    plan_slices,
    read_slice,
)

__all__ = [
    "COMPRESSIONS",
    "FORMATS",
    "MAX_DOCUMENT_CHARS",
    "MAX_LINE_BYTES",
    "ReadOptions",
    "Slice",
    "Tally",
    "corpus_file",
    "cut_ranges",
    "cut_source",
    "decompressed",
    "describe",
    "file_format",
    "find_corpus",
    "iter_documents",
    "iter_path_documents",
    "plan_ranges",
    "plan_slices",
    "read_all",
    "read_slice",
]
