"""The fleet glue: options, plan-time checks, and the per-item conversion.

An item becomes one ``.tfrecord`` file (``.tfrecord.gz`` with GZIP, ``.parquet``
with ``output=parquet``: ``fleet_jobs.text.output``) of ELECTRA examples. Without
``pack_documents`` each document draws from its own stream, seeded by the run
seed and the document's text (``builder.DocumentRandom``): the multiset of
examples depends only on the documents and the seed, not on how the corpus was
cut into items, how many workers ran or which input format carried it.
``pack_documents`` mixes documents, so it is seeded per item (``ctx.seed``).
Either way a retried item rewrites the same bytes.
Within a document, blank lines carry no tokens and do not split it: the
fleet's inputs already cut documents (for ``.txt`` at blank lines, which is
what ELECTRA's builder does with ``--blanks-separate-docs``).

The job is ELECTRA alone. It once held BERT's records as ``format=bert``; that is the ``bert``
job now, and runs planned with the former name (their run.json: ``format`` and the bert job's
options) or commands that give it are read as that job by discovery's rule
(``fleet.core.discovery.FORMER_NAMES``), never here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import accumulate, chain

import numpy as np
from typing import Any, Iterable, Iterator, Sequence

from fleet.job import ConfigError, Feature, ItemContext, Opener, Sink

from fleet_jobs.text.groups import document_groups
from fleet_jobs.text.job import DocumentConverter, TextJob
from fleet_jobs.text.options import TextOptions, check_text_options, masking_tokenizer, with_sentences
from fleet_jobs.text.output import ExampleSink, feature_columns, open_writer, writes_columns
from fleet_jobs.text.inputs.places import Place
from fleet_jobs.text.provenance import FIELD_OUTPUTS, Sidecar, check_fields, field_columns, field_values
from fleet_jobs.text.token_records import TokenRecordEncoder
from fleet_jobs.text.tokenizers.tokenization import BertTokenizer

from .builder import CLS_RUN, SEP_RUN, DocumentRandom, ExampleBuilder, FlatExamples, seeded_document_runs
from .provenance import example_documents

REPORT_RECORDS = 2_000  # records the report at the end of fleet local reads: 60-130 µs each, paid by every run


@dataclass
class ElectraConfig(TextOptions):
    seed: int = 12345  # the run's seed: each document is seeded from it and its text (pack_documents: each item)
    provenance: bool = False  # part-<item>.provenance.jsonl: each example's document in the corpus (docs/outputs.md)
    fields: str = ""  # input fields carried along (JSON keys, Parquet columns: url,id): a column each (output=parquet|mds) and in the provenance sidecar


def _validate(config: ElectraConfig) -> tuple[str, ...]:
    """The config checked (ConfigError naming the option); the fields it carries."""
    check_text_options(config)
    for option in ("provenance", "fields"):
        if getattr(config, option) and config.pack_documents:
            raise ConfigError(f"option {option}: not with pack_documents (its examples mix an item's sentences)")
    from .features import ELECTRA_FEATURES

    return check_fields(config.fields, config.output, config.provenance, ELECTRA_FEATURES)


def _tokenizer(config: ElectraConfig, opener: Opener) -> BertTokenizer:
    return masking_tokenizer(config, opener, "the electra_zh_en job")


class ElectraConverter(DocumentConverter):
    def __init__(self, config: ElectraConfig, tokenizer: BertTokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.cls_id = tokenizer.vocab["[CLS]"]
        self.sep_id = tokenizer.vocab["[SEP]"]
        self.encoder = TokenRecordEncoder(config.max_seq_length, max(tokenizer.vocab.values()))
        self.provenance = config.provenance
        from .features import electra_features

        self.fields = _validate(config)
        self.columns = feature_columns(electra_features(config))
        self.field_output = bool(self.fields) and config.output in FIELD_OUTPUTS  # a column per field
        if self.field_output:
            self.columns += field_columns(self.fields)

    def _gather(self, flat: np.ndarray, runs: FlatExamples) -> np.ndarray:
        """The examples' ids end to end (int64), from ``tokenize_flat``'s array and their runs."""
        if not runs.run_starts:
            return np.zeros(0, np.int64)
        source = np.concatenate([flat.astype(np.int64), [self.cls_id, self.sep_id]])
        starts = np.array(runs.run_starts, np.int64)
        sizes = np.array(runs.run_lengths, np.int64)
        starts[starts == CLS_RUN] = len(flat)
        starts[starts == SEP_RUN] = len(flat) + 1
        ends = np.cumsum(sizes)
        return source[np.repeat(starts - ends + sizes, sizes) + np.arange(int(ends[-1]))]

    def convert(self, documents: Iterable[list[str]], ctx: ItemContext, sink: ExampleSink) -> dict[str, float]:
        max_length = self.config.max_seq_length
        builder = ExampleBuilder(max_length, self.cls_id, self.sep_id, random.Random(ctx.seed), pad=False)
        seed_key = DocumentRandom.seed_key(self.config.seed)
        n_docs = n_lines = n_examples = n_tokens = n_bytes = 0
        columns = writes_columns(self.config.output)
        encoder = self.encoder
        sidecar = None
        placed: Sequence[Sequence[Place]] = ()
        if self.provenance or self.fields:
            assert isinstance(
                sink, Sink
            )  # provenance and fields are refused with --shards (examples go to the shuffle)
            sidecar = Sidecar(documents, sink, file=self.provenance)
        with open_writer(sink, self.config.output, self.config.compression, self.columns) as out:
            for group in _groups(documents):
                lines = [line for document in group for line in document]
                n_docs += len(group)
                n_lines += len(lines)
                if not self.config.pack_documents:  # each document seeded by its own text: examples do not
                    # depend on how items were cut. Packed from the lines' lengths, ids gathered in numpy.
                    texts = ["\n".join(document).encode() for document in group]
                    # UTF-8 bytes of the lines: each text is its lines and a newline between two
                    n_bytes += sum(map(len, texts)) - len(lines) + len(group) - group.count(_EMPTY)
                    flat, line_lengths = self.tokenizer.tokenize_flat(lines)  # one normalization for the group
                    runs = seeded_document_runs(
                        line_lengths.tolist(), accumulate(map(len, group)), texts, seed_key, max_length
                    )
                    ids, lengths, firsts = self._gather(flat, runs), runs.lengths, runs.first_lengths
                    if sidecar:
                        placed = sidecar.write(
                            example_documents(runs, line_lengths, group, sidecar.documents.take(len(group)))
                        )
                else:
                    sentences = self.tokenizer.tokenize_lines(lines)  # one normalization for the group
                    n_bytes += len("\n".join(lines).encode()) - max(0, len(lines) - 1)
                    examples = builder.add_sentences(sentences)
                    last = builder.end_document() if group is _LAST else None  # what packing holds
                    if last is not None:
                        examples.append(last)
                    ids = np.fromiter(chain.from_iterable([ex.input_ids for ex in examples]), np.int64)
                    lengths, firsts = [ex.length for ex in examples], [ex.first_length for ex in examples]
                n_tokens += sum(lengths)
                n_examples += len(lengths)
                if columns:  # rows as they are, not records the writer would parse back
                    if lengths:
                        values: dict[str, Any] = dict(encoder.columns_of(ids, lengths, firsts))
                        if self.field_output:
                            values.update(field_values(placed, self.fields))
                        out.write_examples(values)
                else:
                    out.write(encoder.records_of(ids, lengths, firsts))
            out.note(documents=n_docs, tokens=n_tokens)  # exact, with the file (the run's manifest)
        if sidecar:
            sidecar.close(n_examples)
        return {
            "documents": n_docs,
            "lines": n_lines,
            "examples": n_examples,
            "tokens": n_tokens,
            "positions": n_examples * max_length,
            "text_bytes": n_bytes,
        }


GROUP_CHARS = 1 << 16  # documents are tokenized this many characters at a time
_LAST: list[list[str]] = []  # the empty group _groups ends with
_EMPTY: list[str] = []  # an empty document (no line): its text is b"", no newline to take off


def _groups(documents: Iterable[list[str]]) -> Iterator[list[list[str]]]:
    """Groups of about GROUP_CHARS characters, then ``_LAST`` (the end, for what packing holds)."""
    yield from document_groups(documents, GROUP_CHARS)
    yield _LAST


class ElectraJob(TextJob):
    name = "electra_zh_en"
    config_type = ElectraConfig

    def check(self, config: ElectraConfig, opener: Opener) -> None:
        _validate(config)
        _tokenizer(config, opener)

    def document_converter(self, config: ElectraConfig, opener: Opener) -> DocumentConverter:
        _validate(config)
        return with_sentences(ElectraConverter(config, _tokenizer(config, opener)), config)

    def features(self, config: ElectraConfig) -> dict[str, Feature]:
        from .features import electra_features

        return electra_features(config)

    def summarize(self, totals) -> dict[str, float]:
        positions = totals.get("positions", 0)
        return {"fill_ratio": totals.get("tokens", 0) / positions if positions else 0.0}

    def report(self, output_url: str, config: ElectraConfig) -> str | None:
        """The records' summary (``python -m fleet_jobs.text report``) for a local output folder."""
        from fleet_jobs.text.tools.report import local_report

        return local_report(output_url, config.vocab_file, REPORT_RECORDS)
