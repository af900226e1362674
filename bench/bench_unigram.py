"""The C unigram encoder against SentencePiece alone, tokenizing only (no fleet around it).

    .venv/bin/python bench/bench_unigram.py [--rounds 3] [--vocab 8000]

A unigram ``.model`` is trained on the sample (as bench_lm_tokenizers does); then each row
encodes the same documents (the short corpus's: lines joined by ``\\n``, 1-3 lines each) with

- the library: ``SentencePieceProcessor.encode(batch, out_type=int, num_threads=1)``, 10,000
  documents a call, ids kept as its lists;
- fleet: ``fleet_jobs.causal_lm.unigram.UnigramEncoder.encode`` (normalized and encoded in C,
  word by word), the same batches, ids as one int32 array; a FRESH encoder per row, so the word
  cache starts empty: "once" rows are text seen for the first time (making it, once per worker
  process, is timed apart).

Rows: the sample once (every document unique; English and Chinese apart: Chinese has no spaces,
so its "words" are whole clauses and the cache rarely answers), and the sample x10 (each document
10 times: what bench_lm_tokenizers --repeat 10 feeds fleet local). CPU seconds of this process,
least of ``--rounds``; ratio = library / fleet (above 1: fleet is faster). Every row also checks
that the ids are the library's.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from short_corpus import short_sample  # noqa: E402

BATCH = 10_000


def cpu(fn, rounds: int, setup=lambda: None) -> tuple[float, object]:
    """Least CPU seconds of fn(setup()) over rounds (setup untimed)."""
    best, result = float("inf"), None
    for _ in range(rounds):
        made = setup()
        start = time.process_time()
        result = fn(made)
        best = min(best, time.process_time() - start)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8000)
    args = ap.parse_args()

    import numpy as np
    import sentencepiece as spm

    from fleet_jobs.causal_lm.unigram import UnigramEncoder, model_proto, why_not
    from fleet_jobs.text.tokenizers import native

    parts = short_sample()
    docs = {lang: [b.strip("\n") for b in parts[lang].decode().split("\n\n") if b.strip()] for lang in ("en", "zh")}
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line for d in docs["en"] + docs["zh"] for line in d.split("\n")]),
        model_writer=model,
        vocab_size=args.vocab,
        minloglevel=2,
        character_coverage=0.9995,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    proto, lib = model_proto(sp), native.load()
    assert why_not(proto, spm.__version__) is None

    def library(texts):
        out = []
        for at in range(0, len(texts), BATCH):
            out += sp.encode(texts[at : at + BATCH], out_type=int, num_threads=1)
        return out

    def fleet(enc, texts):
        parts = [enc.encode(texts[at : at + BATCH]) for at in range(0, len(texts), BATCH)]
        return np.concatenate([p[0] for p in parts]), enc.stats()

    start = time.process_time()
    UnigramEncoder(sp, proto, lib)
    made_in = time.process_time() - start

    rows = {
        "English, once": docs["en"],
        "Chinese, once": docs["zh"],
        "both, once": docs["en"] + docs["zh"],
        "both, x10": (docs["en"] + docs["zh"]) * 10,
    }
    print(
        f"unigram .model of {args.vocab} pieces; sentencepiece {spm.__version__}; least CPU of {args.rounds}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'documents':16}{'MB':>7}{'library':>10}{'fleet':>10}{'ratio':>8}   words: cached, added, computed")
    for name, texts in rows.items():
        mb = sum(len(t.encode()) for t in texts) / 1e6
        lib_s, expected = cpu(lambda _, texts=texts: library(texts), args.rounds)
        ours_s, (ids, stats) = cpu(
            lambda enc, texts=texts: fleet(enc, texts), args.rounds, lambda: UnigramEncoder(sp, proto, lib)
        )  # (a cold cache every round)
        assert ids.tolist() == [i for doc in expected for i in doc], name
        print(
            f"{name:16}{mb:7.2f}{lib_s:9.3f}s{ours_s:9.3f}s{lib_s / ours_s:7.2f}x   "
            f"{stats['hits']:,}, {stats['added']:,}, {stats['computed']:,}"
        )
    print(
        f"(CPU seconds of this process; ratio = library / fleet; every row's ids are the library's; making "
        f"the encoder's C tables, once per worker, not in the rows: {made_in * 1000:.1f} ms)"
    )


if __name__ == "__main__":
    main()
