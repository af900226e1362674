"""The shared text layer of the text jobs: a library, not a job (it defines no job object).

In sub-packages by idea, each with a docstring saying what it holds:

- ``tokenizers``: BERT WordPiece (``BertTokenizer``), the tokenizer cache, tiktoken ranks files,
  training a vocab.txt, and the C core (``native`` loads ``_ccore.abi3.so``: WordPiece, unigram
  and TFRecord block framing);
- ``stages``: the stages a text job asks for after its map (``--shards N``, ``--dedup exact``);
- ``tools``: the tools every text job shares (``python -m fleet_jobs.text
  vocab|tokenize|report|check``), ``report`` (a look at a run's records), ``sample`` +
  ``survey`` (a bounded sample of a corpus and its figures, before the spend);
- ``inputs``: the corpus formats, cutting files into items at document boundaries, and
  bad-record accounting.

And at the top, what a text job is made of:

- ``job``: ``TextJob``, the fleet's item API read as documents (``converter``: what turns an
  item's documents into outputs; ``parts``: a grouped item's files, each read as an item;
  ``groups``: text handed on in groups of a bounded size; ``provenance``: where each document
  came from);
- ``options``: the options the WordPiece example jobs (electra_zh_en, bert) share, and
  ``split_sentences`` (``sentences``: rule-based sentence splitting);
- ``token_records``: records of token examples, many at a time (on ``fleet.formats.tfrecord``:
  every record format's bytes, its writer and reader, live in ``fleet.formats``);
- ``output``: the output options every text job shares (``output``, ``compression``),
  file naming, and the writer of an item's outputs in the run's format.

It depends on the fleet's job API (``fleet.job``: the item API, ranged reads of an
input's pinned version for Parquet's footer and a plan's look for document boundaries, and
``find_sources`` for the tools) and the record formats (``fleet.formats``) only, never on a job
(but ``check``, which imports ELECTRA's builder when it runs, for the tokens ELECTRA's packing
would truncate).
"""
