"""The shared text layer of the text jobs: a library, not a job (it defines no job object).

- ``tokenization``: BERT WordPiece, fast (``BertTokenizer``); ``vocab``: train a vocab.txt;
- ``options``: the options the WordPiece example jobs (electra_zh_en, bert) share, and
  ``split_sentences`` (``sentences``: rule-based sentence splitting);
- ``tfrecord``: ``tf.train.Example`` bytes and TFRecord framing without TensorFlow (every
  TFRecord byte a job writes); ``token_records``: records of token examples, many at a time;
- ``output``: the output options every text job shares (``output``, ``compression``),
  file naming, and writers for TFRecord and Parquet (``parquet``);
- ``tokenizer_cache``: tokenizers loaded once per process, by the digest of their file;
- ``report``: a look at a run's records; ``sample`` + ``survey``: a bounded sample of a corpus
  and its figures, before the spend (the ``check`` tool).

It depends on ``fleet.job`` only, never on a job; but ``sample``, which reads a corpus as the
fleet does, through ``fleet.inputs`` and ``fleet.store`` (the input layer is to move here).
"""
