"""The fleet glue: options, plan-time checks, and one item's documents -> blocks -> output file.

Documents are tokenized a batch of about ``BATCH_CHARS`` characters at a time and cut
by ``blocks.BlockCutter``; each batch's blocks go to the shared writer
(``fleet_jobs.text.output``) as columns: ``input_ids`` and, when partial blocks are padded,
``attention_mask``. Nothing here is random, so a retried item rewrites the same bytes.

``output=megatron`` and ``output=tokens`` write no blocks: one sequence per document (its ids
and the end-of-document id) into a Megatron indexed dataset or a flat token file
(``fleet.formats.token_files``); the trainer cuts its own samples, so the block options are refused.
With ``--shards`` each sequence goes to the shuffle as one Example and every shard is a dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

import numpy as np

from fleet.formats.token_files import (
    DATA_PATH_FILE,
    SEQUENCE_FEATURE,
    SEQUENCE_OUTPUTS,
    describe,
    megatron_data_path,
    sequence_example,
)
from fleet.job import (
    ConfigError,
    Feature,
    ItemContext,
    KeyedSink,
    Opener,
    Reducer,
    RunManifest,
    Sink,
    Stage,
    StageOptions,
    parse_example,
)

from fleet_jobs.text.job import DocumentConverter, TextJob
from fleet_jobs.text.groups import document_groups
from fleet_jobs.text.output import (
    OUTPUTS,
    ShuffledExamples,
    feature_columns,
    check_output,
    open_sequence_writer,
    open_writer,
)
from fleet_jobs.text.inputs.places import Place
from fleet_jobs.text.provenance import (
    FIELD_OUTPUTS,
    check_fields,
    check_provenance,
    field_columns,
    field_values,
    parse_fields,
)
from fleet_jobs.text.stages import SHARD_BATCH, SHARDS, checkpointed, text_stages
from fleet_jobs.text.tokenizers.tokenizer_cache import TOKENIZER_KINDS, bert_tokenizer, file_tokenizer

from .blocks import LAST_BLOCKS, BlockCutter, BlockOptions, framed
from .provenance import Trace
from .records import BlockRecords
from .tokenizer import DocumentTokenizer, from_bert, from_json, from_sentencepiece, from_tiktoken

BATCH_CHARS = 1 << 20  # text tokenized per call: amortises the call, bounds memory
REPORT_RECORDS = 2_000  # records the report at the end of fleet local reads: ~30 µs each, paid by every run (as bert's)


@dataclass
class CausalLMConfig:
    tokenizer_file: str = ""  # URL or path: a tokenizer.json, a SentencePiece .model or a .tiktoken file; or vocab_file
    tokenizer_type: str = "auto"  # auto (by name, else content) | json | sentencepiece | tiktoken: the file's kind
    tiktoken_pattern: str = ""  # tiktoken: the split regex (default: the known encoding's, else cl100k_base's)
    tiktoken_special_tokens: str = ""  # tiktoken: TOKEN=ID,... e.g. <|endoftext|>=100257 (default: the encoding's)
    vocab_file: str = ""  # URL or path of a BERT vocab.txt (WordPiece); or tokenizer_file
    do_lower_case: bool = True  # vocab_file only (a tokenizer.json carries its own normalizer)
    max_seq_length: int = 1024  # tokens per example
    shifted_labels: bool = False  # blocks of max_seq_length + 1 tokens: inputs block[:-1], labels block[1:]
    last_block: str = "pad"  # pad | drop: a document's last partial block (with pack_documents: the item's)
    pack_documents: bool = True  # one token stream per item, padded only at its end; false: blocks per document
    eod: str = "auto"  # auto | always | never: the end-of-document id after each document (auto: unless the tokenizer ends texts itself)
    eod_token: str = ""  # ends each document (default: <|endoftext|>, </s>, <eos> or [SEP], the first known)
    pad_token: str = ""  # fills padded blocks (default: [PAD], <pad> or <|padding|>, else the eod token)
    output: str = "tfrecord"  # tfrecord | parquet | mds | megatron (.bin + .idx) | tokens (.bin + .npy)
    compression: str = "none"  # none | GZIP (output=tfrecord; files end .tfrecord.gz) | zstd[:level] (output=mds)
    provenance: bool = False  # part-<item>.provenance.jsonl: each example's documents in the corpus (docs/outputs.md)
    fields: str = ""  # input fields carried along (JSON keys, Parquet columns: url,id): a column each (output=parquet|mds) and in the provenance sidecar
    near_threshold: float = 0.8  # --dedup near: estimated Jaccard similarity that makes a near copy
    near_ngram: int = 5  # --dedup near: words a shingle (a document with fewer is one shingle of all)
    near_bands: str = "14x8"  # --dedup near: LSH bands x rows; the MinHash signature holds bands x rows values
    near_clusters: bool = False  # --dedup near: part-<item>.near.jsonl, each cluster's documents (docs/outputs.md)


def _validate(config: CausalLMConfig) -> tuple[str, ...]:
    """The config checked (ConfigError naming the option); the fields it carries."""
    if bool(config.tokenizer_file) == bool(config.vocab_file):
        raise ConfigError(
            "give one of the options tokenizer_file (a tokenizers tokenizer.json, a SentencePiece "
            ".model or a .tiktoken file) or vocab_file (a BERT vocab.txt)"
        )
    if config.tokenizer_type not in TOKENIZER_KINDS:
        raise ConfigError(
            f"option tokenizer_type: {config.tokenizer_type!r} is not supported (known: {', '.join(TOKENIZER_KINDS)})"
        )
    if not 2 <= config.max_seq_length <= 1 << 20:
        raise ConfigError(f"option max_seq_length: must be between 2 and 1048576, got {config.max_seq_length}")
    if config.eod not in EOD_MODES:
        raise ConfigError(f"option eod: {config.eod!r} is not supported (known: {', '.join(EOD_MODES)})")
    if config.last_block not in LAST_BLOCKS:
        raise ConfigError(f"option last_block: {config.last_block!r} is not supported (known: pad, drop)")
    check_output(config.output, config.compression, OUTPUTS + SEQUENCE_OUTPUTS)
    if config.output in SEQUENCE_OUTPUTS:
        defaults = {f.name: f.default for f in dataclasses.fields(CausalLMConfig)}
        for name in BLOCK_OPTIONS:
            if getattr(config, name) != defaults[name]:
                raise ConfigError(
                    f"option {name}: output={config.output} writes each document whole, as one "
                    "sequence (the trainer cuts its samples); leave it unset"
                )
    return check_fields(config.fields, config.output, config.provenance, features(config))


EOD_MODES = ("auto", "always", "never")

# What only blocks use: output=megatron and output=tokens refuse them when set.
BLOCK_OPTIONS = ("max_seq_length", "shifted_labels", "last_block", "pack_documents", "pad_token")


def _tokenizer(config: CausalLMConfig, opener: Opener) -> DocumentTokenizer:
    if config.vocab_file:
        bert = bert_tokenizer(config.vocab_file, config.do_lower_case, opener)
        return from_bert(bert, config.vocab_file, config.eod_token, config.pad_token)
    kind, tokenizer = file_tokenizer(
        config.tokenizer_file, opener, config.tokenizer_type, config.tiktoken_pattern, config.tiktoken_special_tokens
    )
    if kind != "tiktoken" and (config.tiktoken_pattern or config.tiktoken_special_tokens):
        raise ConfigError(
            f"options tiktoken_pattern and tiktoken_special_tokens apply to a .tiktoken file, "
            f"not {config.tokenizer_file} ({kind})"
        )
    build = {"json": from_json, "sentencepiece": from_sentencepiece, "tiktoken": from_tiktoken}[kind]
    return build(tokenizer, config.tokenizer_file, config.eod_token, config.pad_token)


def features(config: CausalLMConfig) -> dict[str, Feature]:
    """What every example holds (``Job.features``, and the converter's columns): ``input_ids``,
    a block (``max_seq_length`` + 1 tokens with ``shifted_labels``: the trainer shifts), and
    ``attention_mask`` when partial blocks are padded (``last_block=pad``)."""
    width = config.max_seq_length + int(config.shifted_labels)
    names = ["input_ids"] + (["attention_mask"] if config.last_block == "pad" else [])
    return {name: Feature(width) for name in names}


class CausalLMConverter(DocumentConverter):
    def __init__(self, config: CausalLMConfig, tokenizer: DocumentTokenizer):
        self.config = config
        self.tokenizer = tokenizer
        head, tail = tokenizer.ends(config.eod)
        self.options = BlockOptions(
            config.max_seq_length + int(config.shifted_labels),
            tokenizer.eod_id,
            tokenizer.pad_id,
            config.last_block,
            config.pack_documents,
            head,
            tail,
        )
        self.padded = config.last_block == "pad"
        self.columns = feature_columns(features(config))
        self.provenance = config.provenance
        self.fields = _validate(config)
        self.field_output = bool(self.fields) and config.output in FIELD_OUTPUTS  # a column per field
        if self.field_output:
            self.columns += field_columns(self.fields)

    def convert(
        self, documents: Iterable[list[str]], ctx: ItemContext, sink: Union[Sink, ShuffledExamples]
    ) -> dict[str, float]:
        """``sink``: the item's, or (``example_sink``: its outputs feed a stage) the shuffle."""
        if self.config.output in SEQUENCE_OUTPUTS:
            return self._sequences(documents, sink)
        cutter = BlockCutter(self.options)
        trace = None
        if self.provenance or self.fields:
            assert not isinstance(sink, ShuffledExamples)  # provenance is refused with --shards (check_provenance)
            trace = Trace(documents, sink, self.options, file=self.provenance)
        # TFRecords (a file, or the shuffle's Examples) of blocks from cached heads; Parquet from columns
        records = BlockRecords(self.options.block_size, self.padded) if self.config.output == "tfrecord" else None
        counts: dict[str, float] = dict.fromkeys(
            ("documents", "lines", "text_bytes", "tokens", "examples", "real_tokens"), 0
        )
        with open_writer(sink, self.config.output, self.config.compression, self.columns) as out:

            def write(blocks, sources: Sequence[Sequence[Place]]) -> None:
                if not len(blocks):
                    return
                if records is not None:
                    out.write(records.records(blocks.ids, blocks.lengths), len(blocks))
                else:
                    columns: dict[str, Any] = {"input_ids": blocks.ids}
                    if self.padded:
                        columns["attention_mask"] = blocks.attention_mask
                    if self.field_output:
                        columns.update(field_values(sources, self.fields))
                    out.write_columns(columns)
                counts["examples"] += len(blocks)
                counts["real_tokens"] += int(blocks.lengths.sum())

            for batch in document_groups(documents, BATCH_CHARS):
                _count_text(counts, batch)
                ids, per_document = self.tokenizer.encode_flat(batch)
                counts["tokens"] += len(ids) + self.options.framing * int(np.count_nonzero(per_document))
                blocks = cutter.add_flat(ids, per_document)
                write(blocks, trace.batch(per_document) if trace else ())
            write(cutter.finish(), trace.finish() if trace else ())
        if trace:
            trace.close(int(counts["examples"]))
        counts["dropped_tokens"] = cutter.dropped
        counts["positions"] = counts["examples"] * self.options.block_size
        return counts

    def _sequences(self, documents: Iterable[list[str]], sink: Union[Sink, ShuffledExamples]) -> dict[str, float]:
        """One sequence per document with ids (its ids, framed: ``eod``)."""
        counts: dict[str, float] = dict.fromkeys(("documents", "lines", "text_bytes", "tokens", "sequences"), 0)
        trace = None
        if self.provenance:  # (fields without provenance are refused: these outputs have no columns)
            assert not isinstance(sink, ShuffledExamples)  # provenance is refused with --shards (check_provenance)
            trace = Trace(documents, sink, None)
        with self._sequence_output(sink) as write:
            for batch in document_groups(documents, BATCH_CHARS):
                _count_text(counts, batch)
                ids, per_document = self.tokenizer.encode_flat(batch)
                stream, lengths = framed(ids, per_document, *self.options.ends)
                sequences = np.split(stream.astype(np.int64), np.cumsum(lengths)[:-1]) if len(lengths) else []
                write(sequences)
                if trace:
                    trace.batch(per_document)
                counts["tokens"] += len(stream)
                counts["sequences"] += len(lengths)
        if trace:
            trace.close(int(counts["sequences"]))
        return counts

    @contextlib.contextmanager
    def _sequence_output(self, sink: Union[Sink, ShuffledExamples]) -> Iterator[Callable[[Sequence[np.ndarray]], None]]:
        """Where sequences go: the item's dataset, or (``--shards``) the shuffle, one Example each."""
        if isinstance(sink, ShuffledExamples):

            def emit(sequences: Sequence[np.ndarray]) -> None:
                for sequence in sequences:
                    sink.emit_example(sequence_example(sequence))

            yield emit
            return
        with open_sequence_writer(sink, self.config.output, self.tokenizer.vocab_size) as out:
            yield out.write


def _count_text(counts: dict[str, float], batch: Sequence[list[str]]) -> None:
    """A batch's documents, lines and UTF-8 bytes of its lines, counted in one join and one encode."""
    counts["documents"] += len(batch)
    counts["lines"] += sum(map(len, batch))
    counts["text_bytes"] += len("".join(chain.from_iterable(batch)).encode())


class SequenceShardReducer(Reducer):
    """A "shards" item of output=megatron|tokens: its share of the shuffled sequences, in the
    order given, as one dataset (``part-<i>-of-<n>.bin`` and its index)."""

    def __init__(self, output: str, vocab_size: int):
        self.output, self.vocab_size = output, vocab_size

    def reduce(self, records, ctx: ItemContext, sink: Sink | KeyedSink) -> dict[str, float]:
        if isinstance(sink, KeyedSink):
            raise TypeError(f"item {ctx.item_id}: the shards stage writes the run's outputs, not records")
        with open_sequence_writer(sink, self.output, self.vocab_size) as out:
            batch: list[np.ndarray] = []
            for _key, example in checkpointed(records, ctx):
                batch.append(parse_example(example[12:-4])[SEQUENCE_FEATURE])  # a TFRecord frame of the Example
                if len(batch) >= SHARD_BATCH:
                    out.write(batch)
                    batch.clear()
            out.write(batch)
        return {"shard_documents": out.documents, "shard_tokens": out.tokens}


class CausalLMJob(TextJob):
    name = "causal_lm"
    config_type = CausalLMConfig

    def check(self, config: CausalLMConfig, opener: Opener) -> None:
        _validate(config)
        _tokenizer(config, opener)

    def document_converter(self, config: CausalLMConfig, opener: Opener) -> DocumentConverter:
        _validate(config)
        return CausalLMConverter(config, _tokenizer(config, opener))

    def features(self, config: CausalLMConfig) -> dict[str, Feature]:
        """The blocks' features; none for output=megatron|tokens, whose sequences are not examples."""
        return {} if config.output in SEQUENCE_OUTPUTS else features(config)

    def stages(self, config: CausalLMConfig, options: StageOptions, map_items: int) -> list[Stage]:
        """As every text job's; with output=megatron|tokens the shards hold sequences, not examples."""
        if config.output in SEQUENCE_OUTPUTS:
            check_provenance(config.provenance, options)
            check_provenance(bool(parse_fields(config.fields)), options, "fields")
            return text_stages(options, map_items, config)
        return super().stages(config, options, map_items)

    def reducer(self, config: CausalLMConfig, opener: Opener, stage: str) -> Reducer:
        if stage == SHARDS and config.output in SEQUENCE_OUTPUTS:
            _validate(config)
            return SequenceShardReducer(config.output, _tokenizer(config, opener).vocab_size)
        return super().reducer(config, opener, stage)

    def run_files(self, config: CausalLMConfig, manifest: RunManifest) -> dict[str, bytes]:
        """output=megatron: ``megatron-data-path.txt``, Megatron's --data-path list of every dataset
        of the run, weighted by its exact token count (the manifest's, as ``Sink.count`` recorded it);
        output=mds: ``index.json`` (TextJob's)."""
        if config.output != "megatron":
            return super().run_files(config, manifest)  # output=mds: index.json
        return {DATA_PATH_FILE: megatron_data_path(manifest.outputs)}

    def summarize(self, totals) -> dict[str, float]:
        positions, tokens = totals.get("positions", 0), totals.get("tokens", 0)
        if "sequences" in totals:  # output=megatron|tokens: whole documents, no blocks to fill
            return {}
        return {
            "fill_ratio": totals.get("real_tokens", 0) / positions if positions else 0.0,
            "dropped_share": totals.get("dropped_tokens", 0) / tokens if tokens else 0.0,
        }

    def report(self, output_url: str, config: CausalLMConfig) -> str | None:
        """Block lengths and fill of a local run (``fleet local`` prints it)."""
        from fleet_jobs.text.tools.report import local_report

        if config.output in SEQUENCE_OUTPUTS:
            path = output_url[len("file://") :] if output_url.startswith("file://") else output_url
            return describe(path, config.output) if "://" not in path else None
        return local_report(output_url, config.vocab_file, REPORT_RECORDS)
