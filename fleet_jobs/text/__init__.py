"""The shared text layer of the text jobs: a library, not a job (it defines no job object).

- ``tokenization``: BERT WordPiece, fast (``BertTokenizer``); ``vocab``: train a vocab.txt;
- ``options``: the options the WordPiece example jobs (electra_zh_en, bert) share, and
  ``split_sentences`` (``sentences``: rule-based sentence splitting);
- ``token_records``: records of token examples, many at a time (on ``fleet.formats.tfrecord``:
  every record format's bytes, its writer and reader, live in ``fleet.formats``);
- ``output``: the output options every text job shares (``output``, ``compression``),
  file naming, and the writer of an item's outputs in the run's format;
- ``tokenizer_cache``: tokenizers loaded once per process, by the digest of their file;
- ``report``: a look at a run's records; ``sample`` + ``survey``: a bounded sample of a corpus
  and its figures, before the spend (the ``check`` tool); ``tools``: the tools every text job
  shares (``python -m fleet_jobs.text vocab|tokenize|report|check``);
- ``job``: ``TextJob``, the fleet's item API read as documents; ``inputs``: the corpus
  formats, cutting files into items at document boundaries, and bad-record accounting.

It depends on the fleet's job API (``fleet.job``: the item API, ranged reads of an
input's pinned version for Parquet's footer and a plan's look for document boundaries, and
``find_sources`` for the tools) and the record formats (``fleet.formats``) only, never on a job
(but ``check``, which imports ELECTRA's builder when it runs, for the tokens ELECTRA's packing
would truncate).
"""
