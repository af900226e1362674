"""The tools every text job shares (electra_zh_en, bert, causal_lm's vocab): train a vocab, tokenize
a file (to check a vocab by eye), look at a run's records, check a corpus sample before the spend.

    python -m fleet_jobs.text vocab INPUT... --size 21128 --out vocab.txt
    python -m fleet_jobs.text tokenize --vocab vocab.txt INPUT
    python -m fleet_jobs.text report OUT_DIR [--png report.png] [--vocab vocab.txt]
    python -m fleet_jobs.text check INPUT... --vocab vocab.txt [--max-seq-length 128]

They lived in electra_zh_en (the first job) until the bert job left it (issue 31): they belong to
no job, so they live with the text layer; ``python -m fleet_jobs.text`` forwards here, for
the scripts that call it so.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from typing import List, NoReturn

import typer
from typer.core import TyperGroup

try:  # typer 0.2x parses with its own copy of click
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover (older typer: click itself)
    from click.exceptions import NoArgsIsHelpError, UsageError  # type: ignore[assignment]

from fleet.job import ConfigError, InputError

from fleet_jobs.text.tokenizers.tokenization import BertTokenizer, VocabError


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {' '.join(message.split())}", err=True)  # one line, whatever the message holds
    raise typer.Exit(2)


class _Commands(TyperGroup):
    """A malformed command line (a bad number, a missing option) is one line and exit 2, as every
    other user error here, not click's framed usage text. Subcommands parse inside ``invoke``."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except NoArgsIsHelpError:
            raise
        except UsageError as e:
            _fail(f"{e.format_message()} (see --help)")

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise
        except UsageError as e:
            where = f"{e.ctx.info_name}: " if e.ctx is not None and e.ctx is not ctx else ""
            _fail(f"{where}{e.format_message()} (see --help)")


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


def _read_vocab(vocab: str) -> bytes:
    """A local vocab file, or one named by URL (``gs://``) as a run's ``vocab_file`` may be."""
    from fleet.job import StoreError, read_url

    try:
        if "://" in vocab:
            return read_url(vocab)
        with open(vocab, "rb") as f:
            return f.read()
    except StoreError as e:
        _fail(f"{vocab}: cannot read vocab ({e})")
    except OSError as e:
        _fail(f"{vocab}: cannot read vocab ({e.strerror or e})")


def _tokenizer(vocab: str, lowercase: bool) -> BertTokenizer:
    try:
        return BertTokenizer.from_bytes(_read_vocab(vocab), vocab, do_lower_case=lowercase)
    except VocabError as e:
        _fail(str(e))


def _bad_records(sampled) -> None:
    if sampled.bad:
        typer.echo(f"bad records skipped: {sampled.bad} (first: {sampled.bad_examples[0]})", err=True)


@app.command()
def vocab(
    inputs: List[str] = typer.Argument(
        ...,
        metavar="INPUT",
        help="Files or folders, local or gs://, in any format fleet reads "
        "(text, JSON Lines, WikiExtractor, CirrusSearch, Parquet), maybe .gz/.bz2/.xz/.zst.",
    ),
    size: int = typer.Option(
        21128,
        help="Vocab size, at most (a small corpus gives fewer). Refused when "
        "below what the corpus needs: the special tokens and every character kept.",
    ),
    out: str = typer.Option("vocab.txt", help="Where to write the vocab, one token per line."),
    lowercase: bool = typer.Option(True, help="Lower-case and strip accents, as do_lower_case."),
    limit_alphabet: int = typer.Option(10000, help="Most single characters kept; Chinese needs thousands."),
    min_frequency: int = typer.Option(2, help="Fewest occurrences for a merged piece."),
) -> None:
    """Train a BERT WordPiece vocab ([PAD] [UNK] [CLS] [SEP] [MASK] first)."""
    from fleet.job import StoreError
    from fleet_jobs.text.inputs import ReadOptions

    from fleet_jobs.text.tokenizers.tokenization import SPECIAL_TOKENS
    from fleet_jobs.text.tokenizers.vocab import VocabTooSmall, check_options, train_vocab, words_in_pieces, write_vocab

    from fleet_jobs.text.tools.sample import Sampled, sample_documents

    problem = check_options(size, limit_alphabet, min_frequency)
    if problem:  # ("limit_alphabet -1: ...": the option as this command spells it)
        name, _, rest = problem.partition(" ")
        _fail(f"--{name.replace('_', '-')} {rest}")
    sampled = Sampled()
    documents = sample_documents(inputs, math.inf, math.inf, ReadOptions(), sampled)
    lines = (line for document in documents for line in document)
    try:
        tokens = train_vocab(
            lines, size, lowercase=lowercase, limit_alphabet=limit_alphabet, min_frequency=min_frequency
        )
    except (InputError, StoreError) as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{e.filename}: {e.strerror or e}" if e.filename else str(e.strerror or e))
    except VocabTooSmall as e:
        _fail(
            f"--size {size}: this corpus needs at least {e.needed} tokens (the {len(SPECIAL_TOKENS)} special "
            f"tokens and each character kept, alone and as a ## piece): give --size {e.needed} or more, "
            "or a smaller --limit-alphabet"
        )
    if len(tokens) <= len(SPECIAL_TOKENS):
        _fail(f"{' '.join(inputs)}: no text to train on (empty files?)")
    try:
        write_vocab(tokens, out)
    except OSError as e:
        _fail(f"{out}: cannot write ({e.strerror or e})")
    _bad_records(sampled)
    if len(tokens) >= size:
        typer.echo(f"wrote {len(tokens)} tokens to {out}", err=True)
        return
    # Fewer than asked: say which of the trainer's two stops it met (fleet_jobs.text.tokenizers.vocab). The
    # corpus is read again, but only a small one gives fewer tokens than a vocab's size.
    again = sample_documents(inputs, math.inf, math.inf, ReadOptions(), Sampled())
    split = words_in_pieces(tokens, (line for document in again for line in document), lowercase)
    if split:
        why = (
            f"the trainer merges only pairs of pieces seen at least --min-frequency {min_frequency} times, and the "
            f"pairs left in the {split:,} words still in pieces are each seen fewer; a bigger corpus gives more "
            "tokens" + (", as does a lower --min-frequency" if min_frequency > 1 else "")
        )
    else:
        why = "every word of the corpus is a token already, nothing is left to merge; only a bigger corpus gives more"
    typer.echo(f"wrote {len(tokens)} tokens to {out}, fewer than --size {size}: {why}", err=True)


@app.command()
def tokenize(
    input: str = typer.Argument(
        ..., metavar="INPUT", help="A UTF-8 text file; one JSON list of ids is printed per non-blank line."
    ),
    vocab: str = typer.Option(..., "--vocab", help="The vocab.txt to use."),
    lowercase: bool = typer.Option(True, help="do_lower_case (must match how the vocab was made)."),
) -> None:
    """Print the token ids of every non-blank line of INPUT."""
    tokenizer = _tokenizer(vocab, lowercase)
    try:
        f = open(input, "rb")
    except OSError as e:
        _fail(f"{input}: cannot read ({e.strerror})")
    with f:
        write = sys.stdout.write
        for number, raw in enumerate(f, 1):  # binary lines split at "\n" only, as the fleet reads text
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                _fail(f"{input}: invalid UTF-8 on line {number} (byte {e.start} of the line)")
            if line.strip():
                write(json.dumps(tokenizer.tokenize_ids(line)) + "\n")


@app.command()
def report(
    out_dir: str = typer.Argument(
        ..., metavar="OUT_DIR", help="A folder of .tfrecord / .tfrecord.gz / .parquet files."
    ),
    png: str = typer.Option(None, "--png", help="Also draw the histograms into this PNG file."),
    vocab: str = typer.Option(
        None,
        "--vocab",
        help="The run's vocab.txt, for the [UNK] share (default: the vocab_file of the fleet local run in OUT_DIR).",
    ),
    max_records: int = typer.Option(
        100_000, help="Summarise at most this many records: a uniform random sample where the run has more (seeded)."
    ),
) -> None:
    """Summarise a run's records: lengths, fill ratio, segments, masking, [UNK] share."""
    from fleet_jobs.text.tools.report import ReportError, VocabIds, read_report, record_files, vocab_ids, vocab_of_run

    if not os.path.isdir(out_dir):
        _fail(f"{out_dir}: not a folder")
    if not record_files(out_dir):
        _fail(f"{out_dir}: no .tfrecord, .tfrecord.gz or .parquet files")
    if max_records < 1:
        _fail(f"--max-records {max_records}: give 1 or more")
    ids: VocabIds | None
    if vocab:  # (local or gs://; an unusable one is one line saying why)
        tokenizer = _tokenizer(vocab, True)
        ids = VocabIds(tokenizer.unk_id, tokenizer.vocab.get("[MASK]"))
    else:  # the run's own, if it is a local file that loads
        run_vocab = vocab_of_run(out_dir)
        ids = vocab_ids(run_vocab) if run_vocab else None
    try:
        stats = read_report(out_dir, ids, max_records)
    except ReportError as e:
        _fail(str(e))
    typer.echo(stats.text())
    if png:
        try:
            stats.png(png)
        except ImportError as e:
            _fail(f"{png}: {e}")
        except OSError as e:
            _fail(f"{png}: cannot write ({e.strerror})")
        typer.echo(f"wrote {png}", err=True)


@app.command()
def check(
    inputs: List[str] = typer.Argument(
        ...,
        metavar="INPUT",
        help="Files or folders, local or gs://, in any "
        "format fleet reads (text, JSON Lines, WikiExtractor, CirrusSearch, Parquet).",
    ),
    vocab: str = typer.Option(..., "--vocab", help="The vocab.txt the run will use."),
    max_seq_length: int = typer.Option(128, help="The run's max_seq_length."),
    lowercase: bool = typer.Option(True, help="do_lower_case (must match how the vocab was made)."),
    mb: float = typer.Option(16.0, "--mb", help="Read at most this many MB of text, shared among the files."),
    seconds: float = typer.Option(20.0, help="Stop reading after this many seconds."),
    text_column: str = typer.Option("text", help="The JSON field / Parquet column of the text; several: title,text."),
    keep_titles: bool = typer.Option(False, "--keep-titles", help="WikiExtractor: keep each document's title line."),
) -> None:
    """A look before the spend: read a bounded sample of the inputs and print documents and lines
    per MB, tokens per line, the [UNK] share, Chinese/English share, lines longer than
    max_seq_length, and what split_sentences would change."""
    from fleet.job import StoreError
    from fleet_jobs.text.inputs import ReadOptions
    from fleet_jobs.text.inputs.formats import text_fields

    from fleet_jobs.text.tools.sample import Sampled, sample_documents
    from fleet_jobs.text.tools.survey import Survey

    # The one figure of a job's own: the tokens ELECTRA's packing would truncate (Survey.kept). The
    # text layer imports no job at load; this tool imports the first job's builder when it runs.
    from fleet_jobs.electra_zh_en.builder import ExampleBuilder

    if not 5 <= max_seq_length <= 1 << 16:
        _fail(f"--max-seq-length: must be between 5 and 65536, got {max_seq_length}")
    for option, value in (("--mb", mb), ("--seconds", seconds)):
        if not 0 < value < 1e9:  # (not NaN, not inf: --mb is made a byte count)
            _fail(f"{option} {value:g}: give a positive number")
    try:
        text_fields(text_column)
    except ConfigError as e:
        _fail(str(e))
    tokenizer = _tokenizer(vocab, lowercase)
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    survey = Survey(tokenizer, lambda: ExampleBuilder(max_seq_length, cls_id, sep_id, random.Random(0)), max_seq_length)
    sampled = Sampled()
    try:
        for document in sample_documents(
            inputs, int(mb * 1e6), seconds, ReadOptions(text_column, keep_titles), sampled
        ):
            survey.add(document)
    except (InputError, StoreError) as e:  # a store's errors name the bucket or object
        _fail(str(e))
    except OSError as e:
        _fail(f"{e.filename}: {e.strerror or e}" if e.filename else str(e.strerror or e))
    if not survey.documents:
        _fail(f"{' '.join(inputs)}: no documents in the sample (empty files?)")
    formats = ", ".join(f"{n} {fmt}" for fmt, n in sorted(sampled.formats.items()))
    stopped = " (time limit reached)" if sampled.timed_out else ""
    typer.echo(f"read {sampled.files_read} of {sampled.files} files ({formats}) in {sampled.seconds:.1f} s{stopped}")
    typer.echo(survey.text())
    if sampled.bad:
        typer.echo(f"bad records skipped: {sampled.bad} (first: {sampled.bad_examples[0]})")  # (in the report)


def main() -> None:
    app(prog_name="python -m fleet_jobs.text")


if __name__ == "__main__":
    main()
