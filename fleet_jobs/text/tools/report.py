"""A picture of a run's records, to catch a bad vocab or a broken split before training.

Reads the records back with ``fleet.formats.tfrecord`` (``records``, ``parse_example``) (no
TensorFlow), the rows of ``.parquet`` outputs with pyarrow, or the samples of MDS shards
(``fleet.formats.mds``), and summarises: real sequence lengths and the fill ratio,
segments per example, masked positions per example and how they were
replaced, next-sentence labels, and the share of ``[UNK]`` among text tokens
(a vocab that misses characters shows up here first). Causal-LM blocks
(``input_ids`` and maybe ``attention_mask``, no segments) get lengths and fill.

A run with more records than ``max_records`` is summarised from a uniform random sample of
them all (seeded: the same files give the same report), never from its first files: the items
of a run differ (a file of long documents, one of short ones), and the first file's figures can
be far from the run's. Counting every record walks the files' frames without decoding them (a
Parquet file's counts are in its footer, an MDS shard's in its head); only the records drawn are parsed. The text says how
many of how many were read, and the 95% margin of a share at that sample size.
"""

from __future__ import annotations

import glob
import gzip
import json
import math
import os
import zlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from fleet.formats import tfrecord

from ..output import MDS_SUFFIXES, PARQUET_SUFFIX, SUFFIXES
from ..tokenizers.tokenization import VocabError, load_vocab

MAX_RECORDS = 100_000  # enough for the shares (a share's 95% interval is within ±0.31%); a bigger run is sampled
SAMPLE_SEED = 0  # the sample's draw: the same report for the same files


class ReportError(Exception):
    """The folder or a record cannot be read; the message names it."""


@dataclass(frozen=True)
class VocabIds:
    unk: int
    mask: int | None


def vocab_ids(path: str) -> VocabIds | None:
    """The ids the report needs from a local vocab file; None if it cannot be read."""
    try:
        with open(path, "rb") as f:
            vocab = load_vocab(f.read(), path)
    except (OSError, VocabError):
        return None
    return VocabIds(vocab["[UNK]"], vocab.get("[MASK]"))


def vocab_of_run(folder: str) -> str | None:
    """The vocab_file a ``fleet local`` run in ``folder`` was planned with, if any."""
    for spec in sorted(glob.glob(os.path.join(folder, ".fleet", "runs", "*", "run.json"))):
        try:
            with open(spec, encoding="utf-8") as f:
                return json.load(f)["config"]["vocab_file"] or None
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def record_files(folder: str) -> list[str]:
    """A run's output files, in every format a text job writes (``output.SUFFIXES``)."""
    return sorted(path for suffix in SUFFIXES for path in glob.glob(os.path.join(folder, "*" + suffix)))


def count_records(path: str) -> int:
    """How many records one output file holds: a TFRecord file's frames walked (lengths read and
    checked, payloads skipped, nothing decoded), a Parquet file's footer, an MDS shard's head."""
    if path.endswith(MDS_SUFFIXES):
        from fleet.formats import mds

        try:
            with open(path, "rb") as f:
                return mds.shard_samples(f)
        except (OSError, mds.MDSError) as e:
            raise ReportError(f"{path}: cannot read as an MDS shard ({e})") from None
    if path.endswith(PARQUET_SUFFIX):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows
        except (OSError, pa.ArrowException) as e:
            raise ReportError(f"{path}: cannot read as Parquet ({e})") from None
    n = pos = 0
    with _open(path) as f:
        # A plain file's end, read once: seeking past it succeeds, so a cut record shows only against it.
        end = math.inf if path.endswith(".gz") else os.fstat(f.fileno()).st_size
        try:
            while header := f.read(12):
                length = tfrecord.frame_length(header, pos)
                pos += 16 + length
                # Skipped, not decoded: a plain file seeks, a GZIP stream decompresses as far.
                if f.seek(pos) != pos or pos > end:
                    raise ValueError(f"truncated record at byte {pos - 16 - length}")
                n += 1
        except ValueError as e:
            raise ReportError(f"{path}: {e}") from None
        except (OSError, EOFError, zlib.error) as e:  # a broken gzip stream (BadGzipFile is an OSError)
            raise ReportError(f"{path}: cannot read ({e})") from None
    return n


def _open(path: str):
    try:
        return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    except OSError as e:
        raise ReportError(f"{path}: cannot read ({e})") from None


def _examples(path: str, wanted: np.ndarray | None = None) -> Iterator[dict]:
    """The examples of one output file as {feature: array}, whatever its format: all of them, or
    those at the sorted record numbers (from 0) in ``wanted``, the others read but not decoded."""
    if path.endswith(PARQUET_SUFFIX):
        yield from _parquet_examples(path, wanted)
        return
    if path.endswith(MDS_SUFFIXES):
        yield from _mds_examples(path, wanted)
        return
    take = None if wanted is None else iter(wanted.tolist())
    next_wanted = -1 if take is None else next(take, None)
    with _open(path) as f:
        records = tfrecord.records(f)
        number = 0
        while next_wanted is not None:
            try:
                raw = next(records, None)
            except ValueError as e:
                raise ReportError(f"{path}: {e}") from None
            except (OSError, EOFError, zlib.error) as e:  # a broken gzip stream (BadGzipFile is an OSError)
                raise ReportError(f"{path}: cannot read ({e})") from None
            if raw is None:
                return
            number += 1
            if take is not None:
                if number - 1 != next_wanted:
                    continue
                next_wanted = next(take, None)
            try:
                example = tfrecord.parse_example(raw)
            except ValueError as e:
                raise ReportError(f"{path}: record {number} is not a tf.train.Example ({e})") from None
            yield example


def _parquet_examples(path: str, wanted: np.ndarray | None = None) -> Iterator[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        start = 0
        for group in range(parquet.num_row_groups):
            rows_here = parquet.metadata.row_group(group).num_rows
            if wanted is None:
                picked = np.arange(rows_here)
            else:
                lo, hi = np.searchsorted(wanted, [start, start + rows_here])
                picked = wanted[lo:hi] - start
            start += rows_here
            if not len(picked):
                continue  # a row group with no record drawn is not read
            table = parquet.read_row_group(group).take(pa.array(picked))
            columns = {name: table.column(name).to_pylist() for name in table.column_names}
            for i in range(table.num_rows):
                yield {name: np.asarray(rows[i]) for name, rows in columns.items()}
    except (OSError, pa.ArrowException) as e:
        raise ReportError(f"{path}: cannot read as Parquet ({e})") from None


def _mds_examples(path: str, wanted: np.ndarray | None = None) -> Iterator[dict]:
    from fleet.formats import mds

    try:
        with open(path, "rb") as f:
            _, samples = mds.read_shard(f.read())
        take = None if wanted is None else set(wanted.tolist())
        for number, example in enumerate(samples):
            if take is None or number in take:
                yield example
    except (OSError, mds.MDSError) as e:
        raise ReportError(f"{path}: cannot read as an MDS shard ({e})") from None


def sample(counts: list[int], max_records: int, seed: int = SAMPLE_SEED) -> list[np.ndarray] | None:
    """Per file, the sorted record numbers of a uniform random sample of ``max_records`` of all
    the files' records (without replacement, seeded); None when there are no more than that."""
    total = sum(counts)
    if total <= max_records:
        return None
    drawn = np.sort(np.random.default_rng(seed).choice(total, size=max_records, replace=False))
    edges = np.cumsum([0, *counts])
    return [drawn[np.searchsorted(drawn, lo) : np.searchsorted(drawn, hi)] - lo for lo, hi in zip(edges, edges[1:])]


@dataclass
class RecordStats:
    folder: str
    files: int = 0
    records: int = 0  # read and summarised
    total: int = 0  # in all the files: more than ``records`` when they are a sample
    max_seq_length: int = 0
    layout: str = ""  # bert, bert (v2 names), electra or causal_lm
    max_predictions: int = 0
    lengths: list[int] = field(default_factory=list)
    second_lengths: list[int] = field(default_factory=list)  # 0: one segment
    masked: list[int] = field(default_factory=list)
    random_next: list[int] = field(default_factory=list)
    replaced: dict[str, int] = field(default_factory=lambda: {"[MASK]": 0, "random": 0, "unchanged": 0})
    unk: int | None = None
    text_tokens: int = 0

    # -- figures -------------------------------------------------------------
    @property
    def sampled(self) -> bool:
        return self.total > self.records

    @property
    def fill_ratio(self) -> float:
        return sum(self.lengths) / (len(self.lengths) * self.max_seq_length) if self.lengths else 0.0

    def text(self, histogram: bool = True) -> str:
        if not self.records:
            return f"report: no records in {self.folder}"
        lengths = np.array(self.lengths)
        second = np.array(self.second_lengths)
        where = (
            f"sampled at random from {self.total:,} in {self.files} files (a share within ±"
            f"{0.98 / self.records**0.5:.2%} at 95%; "
            if self.sampled
            else f"in {self.files} files ("
        )
        lines = [
            f"records: {self.records:,} {where}{self.layout}, max_seq_length {self.max_seq_length})",
            f"real length: mean {lengths.mean():.1f} of {self.max_seq_length}, fill ratio {self.fill_ratio:.3f}",
            *(_histogram(lengths, self.max_seq_length) if histogram else []),
        ]
        if self.layout != "causal_lm":
            lines.append(
                f"segments per example: two {np.mean(second > 0):.1%}, one {np.mean(second == 0):.1%}; "
                f"second segment mean {second[second > 0].mean() if (second > 0).any() else 0:.1f} tokens"
            )
        if self.masked:
            masked = np.array(self.masked)
            total = max(1, masked.sum())
            r = self.replaced
            split = (
                (
                    f"; [MASK] {r['[MASK]'] / total:.1%}, random {r['random'] / total:.1%}, "
                    f"unchanged {r['unchanged'] / total:.1%}"
                )
                if self.unk is not None
                else ""
            )
            lines.append(
                f"masked per example: mean {masked.mean():.1f} (min {masked.min()}, max {masked.max()} "
                f"of {self.max_predictions}), {masked.sum() / max(1, lengths.sum()):.1%} of real tokens"
                f"{split}"
            )
            lines.append(f"next_sentence_labels: 1 (random next) {np.mean(self.random_next):.1%}")
        if self.unk is None:
            lines.append("[UNK]: unknown (no vocab: pass --vocab)")
        else:
            share = self.unk / max(1, self.text_tokens)
            warn = "  <- high: does the vocab cover the text?" if share > 0.01 else ""
            lines.append(f"[UNK]: {share:.3%} of text tokens ({self.unk:,} of {self.text_tokens:,}){warn}")
        return "\n".join(lines)

    def png(self, path: str) -> None:
        try:
            import matplotlib
        except ImportError:
            raise ImportError("the PNG needs matplotlib: pip install -e '.[report]'") from None

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
        lengths = np.array(self.lengths)
        ax = axes[0, 0]
        ax.hist(lengths, bins=min(64, self.max_seq_length), range=(0, self.max_seq_length), color="#4878a8")
        ax.set_title(f"real sequence length (fill ratio {self.fill_ratio:.3f})")
        ax.set_xlabel("tokens incl. [CLS]/[SEP]")
        ax.set_yscale("log")  # the full-length bar would hide the rest
        ax.set_ylabel("examples (log scale)")
        ax = axes[0, 1]
        if self.masked:
            top = self.max_predictions
            ax.hist(self.masked, bins=np.arange(top + 2) - 0.5, color="#c06030")
            ax.set_title("masked positions per example")
            ax.set_xlabel(f"predictions (max_predictions_per_seq {top})")
        else:
            ax.hist(self.second_lengths, bins=32, color="#c06030")
            ax.set_title("second segment length (0 = one segment)")
            ax.set_xlabel("tokens")
        ax.set_ylabel("examples")
        ax = axes[1, 0]
        second = np.array(self.second_lengths)
        bars = {"one segment": float(np.mean(second == 0)), "two segments": float(np.mean(second > 0))}
        if self.random_next:
            bars["NSP label 1"] = float(np.mean(self.random_next))
        ax.bar(list(bars), list(bars.values()), color=["#4878a8", "#4878a8", "#60a060"][: len(bars)])
        ax.set_ylim(0, 1.12)
        ax.set_title("segments per example, next-sentence labels")
        ax.set_ylabel("share of examples")
        for i, v in enumerate(bars.values()):
            ax.text(i, v + 0.02, f"{v:.1%}", ha="center")
        ax = axes[1, 1]
        ax.axis("off")
        ax.text(
            0,
            1,
            self.text(histogram=False).replace("; ", ";\n    ").replace(", fill", ",\n    fill"),
            va="top",
            ha="left",
            family="monospace",
            fontsize=8,
        )
        fig.suptitle(f"records in {self.folder}")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


def local_report(output_url: str, vocab_file: str = "", max_records: int = MAX_RECORDS) -> str | None:
    """The report's text for a run's local output folder (what ``fleet local`` prints at the end);
    None for a bucket. ``vocab_file``: a local BERT vocab.txt, for the [UNK] share."""
    path = output_url[len("file://") :] if output_url.startswith("file://") else output_url
    if "://" in path or not os.path.isdir(path):
        return None
    ids = vocab_ids(vocab_file) if vocab_file and "://" not in vocab_file else None
    return read_report(path, ids, max_records=max_records).text()


def _histogram(values: np.ndarray, top: int, bins: int = 8, width: int = 30) -> list[str]:
    counts, edges = np.histogram(values, bins=bins, range=(0, top))
    share = counts / max(1, counts.sum())
    scale = width / max(share.max(), 1e-9)
    return [
        f"  {int(lo):4d}-{int(hi) - (i < bins - 1):4d} {'#' * int(round(s * scale)):<{width}} {s:6.1%}"
        for i, (lo, hi, s) in enumerate(zip(edges[:-1], edges[1:], share))
    ]


def _layout(features: dict) -> tuple[str, str, str]:
    """(description, ids feature, segments feature)."""
    if "segment_ids" not in features and "input_type_ids" not in features:
        return "causal_lm", "input_ids", ""
    if "input_word_ids" in features:
        return "bert (v2 feature names)", "input_word_ids", "input_type_ids"
    if "masked_lm_positions" in features:
        return "bert", "input_ids", "segment_ids"
    return "electra", "input_ids", "segment_ids"


def read_report(folder: str, vocab: VocabIds | None = None, max_records: int = MAX_RECORDS) -> RecordStats:
    """Summarise the records of ``folder`` (``*.tfrecord``, ``*.tfrecord.gz``, ``*.parquet``): all of
    them, or a uniform random sample of ``max_records`` (``sample``) where there are more."""
    if not os.path.isdir(folder):
        raise ReportError(f"{folder}: not a folder")
    files = record_files(folder)
    counts = [count_records(path) for path in files]
    drawn = sample(counts, max_records)
    stats = RecordStats(folder, files=len(files), total=sum(counts))
    ids_name = segments_name = ""
    for i, path in enumerate(files):
        if drawn is not None and not len(drawn[i]):
            continue
        for ex in _examples(path, None if drawn is None else drawn[i]):
            if not stats.layout:
                stats.layout, ids_name, segments_name = _layout(ex)
            try:
                _add(stats, ex, ids_name, segments_name, vocab)
            except (KeyError, IndexError, ValueError) as e:
                raise ReportError(f"{path}: record {stats.records + 1} lacks a feature or is malformed ({e})") from None
            stats.records += 1
    if vocab is not None:
        stats.unk = stats.unk or 0
    return stats


def _add(stats: RecordStats, ex: dict, ids_name: str, segments_name: str, vocab: VocabIds | None) -> None:
    if not segments_name:  # causal_lm: a block of ids, padded ones masked
        ids = ex[ids_name]
        mask = ex.get("attention_mask", np.ones(len(ids), np.int64))
        n = int(mask.sum())
        stats.max_seq_length = len(ids)
        stats.lengths.append(n)
        stats.second_lengths.append(0)
        if vocab is not None:
            stats.unk = (stats.unk or 0) + int((ids[:n] == vocab.unk).sum())
            stats.text_tokens += n
        return
    ids, mask, segments = ex[ids_name], ex["input_mask"], ex[segments_name]
    n = int(mask.sum())
    stats.max_seq_length = len(mask)
    stats.lengths.append(n)
    stats.second_lengths.append(max(0, int(segments[:n].sum()) - 1))  # B's tokens, without its [SEP]
    original = ids[:n].copy()
    if "masked_lm_positions" in ex:
        weights = ex["masked_lm_weights"]
        k = int((weights > 0).sum())
        stats.max_predictions = len(weights)
        positions, labels = ex["masked_lm_positions"][:k], ex["masked_lm_ids"][:k]
        stats.masked.append(k)
        stats.random_next.append(int(ex["next_sentence_labels"][0]))
        if vocab is not None and k:
            now = ids[positions]
            is_mask = now == vocab.mask if vocab.mask is not None else np.zeros(k, bool)
            unchanged = now == labels
            stats.replaced["[MASK]"] += int(is_mask.sum())
            stats.replaced["unchanged"] += int((unchanged & ~is_mask).sum())
            stats.replaced["random"] += int((~unchanged & ~is_mask).sum())
        original[positions] = labels
    if vocab is not None:
        n_first = int(n - segments[:n].sum())
        text = np.ones(n, bool)
        text[[0, n_first - 1, n - 1]] = False  # [CLS] and the [SEP]s
        stats.unk = (stats.unk or 0) + int((original[text] == vocab.unk).sum())
        stats.text_tokens += int(text.sum())
