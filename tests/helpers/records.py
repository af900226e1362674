"""Examples read back from a text job's outputs, whatever their format, for comparisons."""

from __future__ import annotations

import glob
import gzip
import io
import os

import pyarrow.parquet as pq

from fleet.formats import tfrecord
from fleet_jobs.text.output import SUFFIXES


def examples(data: bytes, suffix: str) -> list[dict[str, list]]:
    """Every example of one output file as {feature: list of numbers}, in file order."""
    if suffix == ".parquet":
        table = pq.read_table(io.BytesIO(data)).to_pydict()
        names = sorted(table)
        return [{name: list(table[name][i]) for name in names} for i in range(len(table[names[0]]) if names else 0)]
    if suffix.endswith(".gz"):
        data = gzip.decompress(data) if data else b""
    return [
        {name: v.tolist() if hasattr(v, "tolist") else v for name, v in sorted(tfrecord.parse_example(r).items())}
        for r in tfrecord.iter_records(data)
    ]


def folder_examples(folder: str) -> list[dict[str, list]]:
    """The examples of every output file of a run's folder, file by file in name order."""
    out = []
    for path in sorted(p for p in glob.glob(os.path.join(folder, "part-*")) if p.endswith(SUFFIXES)):
        with open(path, "rb") as f:
            out += examples(
                f.read(),
                next(s for s in SUFFIXES if path.endswith(s) and not (s == ".tfrecord" and path.endswith(".gz"))),
            )
    return out


def canonical(rows: list[dict[str, list]]) -> list[tuple]:
    """Examples as sortable tuples (floats rounded as float32 stores them): compare multisets."""
    return sorted(
        tuple((k, tuple(round(x, 6) if isinstance(x, float) else x for x in v)) for k, v in sorted(r.items()))
        for r in rows
    )
