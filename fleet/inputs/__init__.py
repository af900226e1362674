"""Input corpora: finding the files, cutting them into items, reading documents.

A corpus is plain text (one line per sentence or paragraph, a blank line
between documents) or JSON Lines with a ``text`` field, optionally
compressed with gzip, bzip2 or zstd. A plain file is cut into byte ranges
that start and end at a document boundary, so a document is never split and
every line is read exactly once. Compressed files cannot be entered in the
middle, so each is one item.

Modules: ``files`` (which files), ``ranges`` (cutting them into items),
``compression``, ``formats`` (documents from bytes; ``longjson`` for a JSON record too
long for a line), ``slices`` (an item's bytes, checked to be the ones planned).

Memory stays bounded whatever the data: a document longer than
MAX_DOCUMENT_CHARS is handed on in parts cut at line boundaries (counted as
``documents_cut``), and a document longer than an item is cut between items
at a line boundary too. Each item pins the version of its input file (size,
mtime and inode of a local file, the generation of a ``gs://`` object), so a
file that changes under a run fails its items instead of feeding them other
bytes.
"""

from fleet.inputs.compression import COMPRESSIONS, decompressed
from fleet.inputs.files import InputFile, describe, find_inputs, printable
from fleet.inputs.formats import (FORMATS, MAX_DOCUMENT_CHARS, MAX_LINE_BYTES, ReadOptions, Tally, iter_documents,
                                  read_all)
from fleet.inputs.ranges import cut_ranges, plan_ranges
from fleet.inputs.slices import Slice, file_format, iter_path_documents, read_slice

__all__ = ["COMPRESSIONS", "FORMATS", "MAX_DOCUMENT_CHARS", "MAX_LINE_BYTES", "InputFile", "ReadOptions", "Slice",
           "Tally", "cut_ranges", "decompressed", "describe", "file_format", "find_inputs", "iter_documents",
           "iter_path_documents", "plan_ranges", "printable", "read_all", "read_slice"]
