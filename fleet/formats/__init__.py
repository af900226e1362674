"""The record formats fleet writes and reads, one owner per format: its writer and its reader
side by side (as mosaicml streaming keeps ``streaming/base/format/<name>/``), each module's
docstring the format byte by byte.

- ``tfrecord``: TFRecord files of ``tf.train.Example``s (the framing and its crc32c, the
  Example's wire format, the writer, causal_lm's block records and their C counterpart);
- ``parquet``: one row per example, a list column per feature;
- ``mds``: MosaicML Streaming's MDS shards and their ``index.json`` (as its ``MDSWriter``);
- ``token_files``: Megatron indexed datasets and flat token files of whole sequences;
- ``writer``: the writer interface the example formats share (``Column``, ``ExampleWriter``).

A layer below the rest: the jobs (``fleet_jobs``) write through it, the fleet's readers of a
run (``fleet.core.outputs``, ``follow``) read through it, and it imports nothing of the fleet
(no ``fleet.core``, ``fleet.job``, ``fleet.gce``, ``fleet.cli``) nor of a job
(tests/test_wings.py). So records are the same bytes whoever writes them, and read back by the
same code that knows how they were written.
"""
