"""What a file's name says to the text layer: whether a file found in a folder is corpus
(``corpus_file``, the text jobs' ``Job.accepts``), and its format and compression (``describe``).

Inside a folder only corpus files are taken: not READMEs, licences or build files (with or
without an extension), nor files of other kinds or compressions it cannot read; each skipped file
gets its reason (``skip_reason``: the text jobs' ``Job.skip_reason``). A file named on its own is
always taken (fleet.core.sources)."""

from __future__ import annotations

from fleet_jobs.text.inputs.compression import COMPRESSIONS


def describe(name: str) -> tuple[str, str]:
    """(format, compression) from a file name: 'a.jsonl.gz' -> ('jsonl', 'gz')."""
    base = name.lower()
    compression = "none"
    for ext, comp in COMPRESSIONS.items():
        if base.endswith(ext):
            compression, base = comp, base[: -len(ext)]
            break
    if base.endswith(".parquet"):
        return "parquet", compression
    fmt = "jsonl" if base.endswith((".jsonl", ".json", ".ndjson")) else "text"
    return fmt, compression


TEXT_EXTENSIONS = (".txt", ".text", ".jsonl", ".json", ".ndjson", ".parquet")


def _hidden(name: str) -> bool:
    return any(part.startswith((".", "_")) for part in name.split("/"))


# Files that come with a corpus but are not corpus, whatever their extension (README, readme.txt,
# LICENSE.md, Makefile.am): taken only when named on their own.
NOT_CORPUS = frozenset(
    {
        "readme",
        "license",
        "licence",
        "licenses",
        "licences",
        "copying",
        "copyright",
        "notice",
        "authors",
        "contributors",
        "contributing",
        "changelog",
        "codeowners",
        "makefile",
        "dockerfile",
        "containerfile",
        "cmakelists",
        "manifest",
        "checksums",
        "md5sums",
        "sha1sums",
        "sha256sums",
        "sha512sums",
    }
)


# Compressions and archives a text job does not read: a file of one is named, with this, not read.
UNREAD_COMPRESSIONS = (".lz4", ".lzma", ".lz", ".lzo", ".br", ".sz", ".snappy", ".z")
ARCHIVES = (".zip", ".tar", ".tgz", ".tbz", ".tbz2", ".txz", ".7z", ".rar")


def skip_reason(name: str) -> str | None:
    """Inside a folder, why a file is not corpus, or None: text files and extension-less shards
    (wiki_00) are; READMEs, code, data of other kinds and compressions this layer cannot read
    are not, each with its reason (the run's account names them: fleet.core.accounting)."""
    if _hidden(name):
        return "a hidden name (starts with '.' or '_')"
    base = name.rsplit("/", 1)[-1].lower()
    if base.split(".", 1)[0] in NOT_CORPUS:
        return "a README-like name (readme, licence, build file...), not corpus"
    for ext in COMPRESSIONS:
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    if base.endswith(TEXT_EXTENSIONS) or "." not in base:
        return None
    ext = "." + base.rsplit(".", 1)[1]
    if ext in UNREAD_COMPRESSIONS:
        return f"an unsupported compression ({ext}): decompress it, or recompress as .gz, .bz2, .xz or .zst"
    if ext in ARCHIVES:
        return f"an archive ({ext}): unpack it"
    if ext[1:].isdigit():
        return f"a numbered extension ({ext}), as of a piece of a split file: join the pieces"
    return f"not a corpus extension ({ext or '.'}): .txt, .jsonl, .json, .ndjson or .parquet"


def corpus_file(name: str) -> bool:
    """Inside a folder, take text files and extension-less shards (wiki_00); skip READMEs and code."""
    return skip_reason(name) is None
