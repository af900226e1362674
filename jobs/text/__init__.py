"""The shared text layer of the text jobs: a library, not a job (it defines no job object).

- ``tokenization``: BERT WordPiece, fast (``BertTokenizer``); ``vocab``: train a vocab.txt;
- ``tfrecord``: ``tf.train.Example`` bytes and TFRecord framing without TensorFlow;
- ``output``: the output options every text job shares (``output``, ``compression``),
  file naming, and writers for TFRecord and Parquet (``parquet``);
- ``tokenizer_cache``: tokenizers loaded once per process, by the digest of their file;
- ``report``: a look at a run's records.

It depends on ``fleet.job`` only, never on a job.
"""
