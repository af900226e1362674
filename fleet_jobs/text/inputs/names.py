"""What a file's name says to the text layer: whether a file found in a folder is corpus
(``corpus_file``, the text jobs' ``Job.accepts``), and its format and compression (``describe``).

Inside a folder only corpus files are taken: not READMEs, licences or build files (with or
without an extension). A file named on its own is always taken (fleet.core.sources)."""

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
NOT_CORPUS = frozenset({
    "readme", "license", "licence", "licenses", "licences", "copying", "copyright", "notice", "authors",
    "contributors", "contributing", "changelog", "codeowners", "makefile", "dockerfile", "containerfile",
    "cmakelists", "manifest", "checksums", "md5sums", "sha1sums", "sha256sums", "sha512sums",
})


def corpus_file(name: str) -> bool:
    """Inside a folder, take text files and extension-less shards (wiki_00); skip READMEs and code."""
    if _hidden(name):
        return False
    base = name.rsplit("/", 1)[-1].lower()
    if base.split(".", 1)[0] in NOT_CORPUS:
        return False
    for ext in COMPRESSIONS:
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    return base.endswith(TEXT_EXTENSIONS) or "." not in base
