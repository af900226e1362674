"""MosaicML Streaming's MDS shards of examples (``output=mds``): written here (``MDSExampleWriter``,
the root ``index.json``: ``root_index``) and read back (``read_shard``), byte for byte as
mosaicml-streaming 0.13's ``MDSWriter`` writes them, so ``StreamingDataset(local=OUT)`` (or
``remote="gs://..."``) reads a run's outputs with no conversion, and no worker needs the
``mosaicml-streaming`` package (nor the torch, torchvision and transformers it imports).

A shard, little-endian throughout::

    num_samples                 uint32
    offsets[num_samples + 1]    uint32, from the shard's first byte: sample i is [offsets[i], offsets[i+1])
    config                      JSON (sort_keys): version 2, format "mds", compression, hashes [],
                                size_limit, column_names, column_encodings, column_sizes
    sample 0, sample 1, ...     each: a uint32 size per column of no fixed size, in column order,
                                then every column's bytes in column order

Columns are in name order (as ``MDSWriter`` sorts them). A feature is ``ndarray:int32:<length>``
(``ndarray:float32:<length>`` for a float feature), of fixed size: its ``length`` values, the
same values as the Parquet output's list column (int32: all far below 2**31; a value that is not
raises). An input field carried along (``fields``: a Column of kind "text") is ``json``: the
list of its values, as ``json.dumps`` writes it (MDSWriter's JSON encoding), its size in the
sample's head; ``str`` (UTF-8) is read and written too.

Shards are cut as ``MDSWriter`` cuts them: a new one starts before the sample that would take
the shard past ``SIZE_LIMIT`` (64 MiB, counting 4 bytes of offset a sample and the head), so an
item's examples give the same shards, byte for byte, as ``MDSWriter`` over them. An item's shards
are ``part-<item>.<k>.mds`` (k = 00000, 00001, ...); with ``compression=zstd[:level]`` each is
kept as ``.mds.zstd`` only (a zstd frame of the raw shard, its size in the header), as
``MDSWriter`` uploads it, and streaming unpacks it where it caches shards.

``index.json`` (``root_index``) lists every shard of the run, in output-name order, with its
samples and its raw (and zstd) bytes: ``{"version": 2, "shards": [...]}``, each entry the shard's
config with ``samples``, ``raw_data`` and ``zip_data`` (``{"basename", "bytes", "hashes": {}}``,
``zip_data`` null when uncompressed). The fleet writes it when the run ends
(``Job.run_files``) from the counts each shard's item recorded, so it needs no shard read back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional, Sequence

import numpy as np

from fleet.formats import tfrecord
from fleet.formats.writer import Column, ExampleWriter, Readable, row_count

SIZE_LIMIT = 1 << 26  # MDSWriter's default size_limit: streaming downloads and caches a shard whole
SUFFIX = ".mds"
ZSTD_SUFFIX = ".zstd"  # streaming's extension for zstd-compressed shards
ZSTD_LEVEL = 3  # streaming's default level for "zstd"
INDEX = "index.json"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame's first bytes
RAW_BYTES, ZIP_BYTES = "mds_raw_bytes", "mds_zip_bytes"  # a shard's counts (Sink.count) that index.json needs
_INT32 = np.iinfo(np.int32)


class MDSError(ValueError):
    """The bytes are not an MDS shard of the examples asked for; the message says why."""


def check_compression(value: str) -> Optional[str]:
    """``none`` -> None; ``zstd`` or ``zstd:<1..22>`` -> itself (streaming's names). ValueError otherwise."""
    text = str(value).lower()
    if text == "none":
        return None
    name, _, level = text.partition(":")
    if name == "zstd" and (not level or (level.isdigit() and 1 <= int(level) <= 22)):
        return text
    raise ValueError(f"{value!r} is not an MDS compression (known: none, zstd, zstd:<1..22>)")


def encoding(column: Column) -> str:
    """A feature's MDS encoding: a fixed-shape array of its ``length`` int32 (or float32) values; a
    text column's (input fields): ``json``. ValueError for a feature of no length."""
    if column.kind == "text":
        return "json"
    if not column.length:
        raise ValueError(f"output=mds: column {column.name} has no length (build it with feature_columns)")
    return f"ndarray:{'float32' if column.kind == 'float' else 'int32'}:{column.length}"


@dataclass(frozen=True)
class ShardConfig:
    """What every shard of a run says of itself (and its entry in ``index.json``)."""

    names: tuple[str, ...]  # in name order
    encodings: tuple[str, ...]
    sizes: tuple[Optional[int], ...]  # bytes a sample, None for a column of no fixed size (str)
    compression: Optional[str] = None
    size_limit: int = SIZE_LIMIT

    @classmethod
    def of(cls, encodings: Mapping[str, str], compression: Optional[str] = None, size_limit: int = SIZE_LIMIT):
        names = tuple(sorted(encodings))
        return cls(
            names,
            tuple(encodings[n] for n in names),
            tuple(map(_size, (encodings[n] for n in names))),
            compression,
            size_limit,
        )

    def as_dict(self) -> dict:
        return {
            "version": 2,
            "format": "mds",
            "compression": self.compression,
            "hashes": [],
            "size_limit": self.size_limit,
            "column_names": list(self.names),
            "column_encodings": list(self.encodings),
            "column_sizes": list(self.sizes),
        }

    def json(self) -> bytes:
        return json.dumps(self.as_dict(), sort_keys=True).encode()

    def suffix(self, shard: int) -> str:
        """The end of an item's shard ``shard``'s file name: ``part-<item>`` + this."""
        return f".{shard:05d}{SUFFIX}" + (ZSTD_SUFFIX if self.compression else "")


def _size(encoding: str) -> Optional[int]:
    kind, _, rest = encoding.partition(":")
    if kind in ("str", "json"):
        return None
    dtype, _, shape = rest.partition(":")
    if kind != "ndarray" or dtype not in ("int32", "float32") or not shape.isdigit():
        raise ValueError(f"MDS encoding {encoding!r}: fleet writes ndarray:int32|float32:<length>, str and json")
    return 4 * int(shape)


def shard_bytes(config: ShardConfig, samples: Sequence[bytes]) -> bytes:
    """One raw shard of encoded samples (``encode_rows``)."""
    head = config.json()
    offsets = np.zeros(len(samples) + 1, np.int64)
    np.cumsum([len(s) for s in samples], out=offsets[1:])
    offsets += 4 + 4 * (len(samples) + 1) + len(head)
    return np.uint32(len(samples)).tobytes() + offsets.astype("<u4").tobytes() + head + b"".join(samples)


def encode_rows(config: ShardConfig, values: Mapping[str, np.ndarray], n: int) -> list[bytes]:
    """``n`` samples of columns of fixed size (2-D arrays) and text (sequences of str)."""
    if not n:
        return []
    parts: list[np.ndarray] = []
    heads: list[np.ndarray] = []
    for name, code, size in zip(config.names, config.encodings, config.sizes):
        value = values[name]
        if size is None:
            data = [json.dumps(v).encode() if code == "json" else str(v).encode() for v in value]
            heads.append(np.array([len(d) for d in data], "<u4").reshape(n, 1).view(np.uint8))
            parts.append(np.array(data, dtype=object))
            continue
        array = np.asarray(value).reshape(n, -1)
        if array.shape[1] * 4 != size:
            raise ValueError(f"column {name}: {array.shape[1]} values a row, its encoding {code} says {size // 4}")
        if code.startswith("ndarray:int32"):
            if array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
                raise ValueError(f"feature {name}: a value does not fit the int32 MDS column")
            parts.append(array.astype("<i4").view(np.uint8).reshape(n, size))
        else:
            parts.append(array.astype("<f4").view(np.uint8).reshape(n, size))
    if not any(p.dtype == object for p in parts):
        rows = np.concatenate([*heads, *parts], axis=1) if parts else np.zeros((n, 0), np.uint8)
        return [row.tobytes() for row in rows]
    head = np.concatenate(heads, axis=1) if heads else np.zeros((n, 0), np.uint8)
    return [
        head[i].tobytes() + b"".join(p[i] if p.dtype == object else p[i].tobytes() for p in parts) for i in range(n)
    ]


ShardOut = Callable[[str, bytes, Mapping[str, int]], None]  # (suffix, file bytes, counts): one shard file


class MDSExampleWriter(ExampleWriter):
    """An item's examples as MDS shards: ``out(suffix, data, counts)`` takes each finished shard
    file (``fleet_jobs.text.output.open_writer`` makes it an output of the item's sink). The
    counts the job notes (``note``) go with the item's last shard."""

    def __init__(
        self,
        out: ShardOut,
        columns: Sequence[Column],
        compression: Optional[str] = None,
        size_limit: int = SIZE_LIMIT,
        encodings: Optional[Mapping[str, str]] = None,
    ):
        super().__init__(columns)
        codes = {c.name: encoding(c) for c in columns}
        codes.update(encodings or {})
        self.config = ShardConfig.of(codes, compression, size_limit)
        self.out = out
        self.head = 4 + 4 + len(self.config.json())  # MDSWriter's extra_bytes_per_shard
        self.samples: list[bytes] = []
        self.size = self.head
        self.shards = 0

    def write(self, records: bytes, count: Optional[int] = None) -> None:
        """Framed TFRecords decoded back into rows (for jobs that encode records themselves)."""
        names = {c.name for c in self.columns}
        rows: dict[str, list] = {name: [] for name in names}
        for raw in tfrecord.iter_records(records):
            example = tfrecord.parse_example(raw)
            if set(example) != names:
                raise ValueError(f"a record has the features {sorted(example)}, the writer {sorted(names)}")
            for name, value in example.items():
                rows[name].append(value)
        n = len(next(iter(rows.values()), []))
        if n:  # encoded as one batch: a shard's records come here by the thousand (--shards)
            self._add(encode_rows(self.config, {name: np.stack(values) for name, values in rows.items()}, n))

    def write_columns(self, values: Mapping[str, np.ndarray]) -> None:
        n = row_count(self.columns, {k: v for k, v in values.items() if k in {c.name for c in self.columns}})
        self._add(encode_rows(self.config, values, n))

    def _add(self, samples: list[bytes]) -> None:
        for sample in samples:
            if self.config.size_limit < self.size + len(sample) + 4:
                self._flush(last=False)
            self.samples.append(sample)
            self.size += len(sample) + 4
        self.examples += len(samples)

    def _flush(self, last: bool) -> None:
        if not self.samples and not last:
            return
        raw = shard_bytes(self.config, self.samples)
        counts = {"examples": len(self.samples), RAW_BYTES: len(raw)}
        data = raw
        if self.config.compression:
            data = _zstd(raw, self.config.compression)
            counts[ZIP_BYTES] = len(data)
        if last:
            counts.update(self.counts)
        self.out(self.config.suffix(self.shards), data, counts)
        self.shards += 1
        self.samples, self.size = [], self.head

    def close(self) -> None:
        """The last shard (written even empty, so every item has an output; index.json skips it)."""
        self._flush(last=True)


def _zstd(raw: bytes, compression: str) -> bytes:
    import zstandard

    level = int(compression.partition(":")[2] or ZSTD_LEVEL)
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(raw)


def root_index(config: ShardConfig, outputs: Mapping[str, Mapping[str, int]]) -> bytes:
    """``index.json`` over every shard among ``outputs`` (the run's manifest: output name -> the
    counts its item recorded), in name order; shards of no sample are left out."""
    shards = []
    suffix = SUFFIX + (ZSTD_SUFFIX if config.compression else "")
    for name in sorted(outputs):
        counts = outputs[name]
        if not name.endswith(suffix) or not counts.get("examples"):
            continue
        raw_name = name[: -len(ZSTD_SUFFIX)] if config.compression else name
        entry = config.as_dict()
        entry["samples"] = int(counts["examples"])
        entry["raw_data"] = {"basename": raw_name, "bytes": int(counts[RAW_BYTES]), "hashes": {}}
        entry["zip_data"] = (
            {"basename": name, "bytes": int(counts[ZIP_BYTES]), "hashes": {}} if config.compression else None
        )
        shards.append(entry)
    return json.dumps({"version": 2, "shards": shards}, sort_keys=True).encode()


def shard_samples(head: Readable) -> int:
    """How many samples a shard file holds, from its first bytes (a zstd frame's too)."""
    first = head.read(4)
    if first == ZSTD_MAGIC:
        import zstandard

        unzip, data = zstandard.ZstdDecompressor().decompressobj(), first
        first = b""
        try:
            while len(first) < 4 and data:
                first += unzip.decompress(data)
                data = head.read(1 << 16)
        except zstandard.ZstdError as e:
            raise MDSError(f"not a zstd frame of an MDS shard ({e})") from None
        first = first[:4]
    if len(first) != 4:
        raise MDSError("shorter than an MDS shard's head")
    return int.from_bytes(first, "little")


def read_shard(data: bytes) -> tuple[dict, Iterator[dict[str, object]]]:
    """A shard file's bytes (raw, or a zstd frame of them) -> (its config, its samples as
    ``{name: 1-D array | str}``). ``MDSError`` when the bytes are not an MDS shard."""
    if data[:4] == ZSTD_MAGIC:
        import zstandard

        try:
            data = zstandard.ZstdDecompressor().decompress(data)
        except zstandard.ZstdError as e:
            raise MDSError(f"not a zstd frame of an MDS shard ({e})") from None
    try:
        n = int(np.frombuffer(data, "<u4", 1)[0])
        offsets = np.frombuffer(data, "<u4", n + 1, 4).astype(np.int64)
        config = json.loads(data[4 + 4 * (n + 1) : offsets[0]])
        names, codes, sizes = config["column_names"], config["column_encodings"], config["column_sizes"]
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise MDSError(f"not an MDS shard ({e.__class__.__name__}: {e})") from None
    if len(data) != offsets[-1] or np.any(np.diff(offsets) < 0):
        raise MDSError(f"its offsets end at {offsets[-1]}, the shard has {len(data)} bytes")
    return config, _samples(data, offsets, names, codes, sizes)


def _samples(data: bytes, offsets: np.ndarray, names, codes, sizes) -> Iterator[dict[str, object]]:
    variable = [i for i, s in enumerate(sizes) if s is None]
    for begin, end in zip(offsets[:-1], offsets[1:]):
        heads = np.frombuffer(data, "<u4", len(variable), int(begin)) if variable else ()
        widths = list(sizes)
        for i, size in zip(variable, heads):
            widths[i] = int(size)
        at = int(begin) + 4 * len(variable)
        sample: dict[str, object] = {}
        for name, code, width in zip(names, codes, widths):
            chunk = data[at : at + width]
            if code == "str":
                sample[name] = chunk.decode()
            elif code == "json":
                sample[name] = json.loads(chunk)
            else:
                sample[name] = np.frombuffer(chunk, "<" + code.split(":")[1][0] + "4")
            at += width
        if at != end:
            raise MDSError(f"a sample holds {end - begin} bytes, its columns {at - begin}")
        yield sample
