"""The tokenizers of the text layer, and their C core: everything that turns text into ids.

- ``tokenization``: BERT WordPiece, fast (``BertTokenizer``), on ``unicode_classes`` (the
  character classes BERT's basic tokenizer uses, as code point ranges);
- ``tokenizer_cache``: tokenizers loaded once per process, by the digest of their file
  (a vocab.txt, or a tiktoken ranks file: ``tiktoken_file``);
- ``vocab``: train a vocab.txt (``python -m fleet_jobs.text vocab``);
- ``native``: the loader of the C core, ``_ccore.abi3.so``, built by setup.py from
  ``wordpiece.c`` and ``unigram.c`` (beside it here) and ``fleet/formats/tfrecord/records.c``
  (TFRecord block framing, kept beside its Python reference in the format). The library is named
  for what it holds, the C core of several formats, not for WordPiece alone; it lives here since
  two of its three sources are tokenizers' and its loader is asked first by ``tokenization``.

Nothing here imports the rest of ``fleet_jobs.text``: the layer above (options, tools, jobs)
imports the tokenizers, never the other way round. (``from tokenizers import ...`` inside it is
Hugging Face's package, an absolute import: this one is always ``fleet_jobs.text.tokenizers``.)
"""
