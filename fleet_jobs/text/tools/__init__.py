"""The tools every text job shares, run before or after a run: ``python -m fleet_jobs.text
vocab|tokenize|report|check`` (``cli``: the click commands; ``fleet_jobs.text.__main__`` runs them).

- ``report``: a look at a run's records (also the jobs' ``report`` hook, so a job imports it);
- ``sample`` + ``survey``: a bounded sample of a corpus and its figures, before the spend
  (the ``check`` tool).

Here they sit apart from the jobs' path: a worker converting items imports none of ``cli``,
``sample`` or ``survey``. They import the layer below (``inputs``, ``tokenizers``, ``output``,
``sentences``), never a stage or the job.
"""
