"""A job's former name keeps working (issue 31): electra_zh_en held BERT's records as
``format=bert`` until they became the bert job; discovery's one rule (fleet.core.discovery.
FORMER_NAMES) reads that name, and the format and bert options electra_zh_en wrote into every
run.json, as the job they are now. A command that gives ``--set format=bert`` plans the bert job
(the same bytes as ``--job bert``), and a run.json written before the move resumes, shows its
status and reads, by every path that loads a job from a run's spec."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import pytest

from fleet.core.discovery import FORMER_NAMES, JobChoice, load_configured, resolve_job
from fleet.core.follow import RunReader
from fleet.job import ConfigError, load_job
from tests.helpers.cli import fleet, one_line_error
from tests.helpers.trained import wordpiece_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BERT_OPTIONS = {
    "masked_lm_prob": 0.15,
    "max_predictions_per_seq": 20,
    "short_seq_prob": 0.1,
    "dupe_factor": 1,
    "whole_word_masking": True,
    "v2_feature_names": False,
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small corpus of both languages and a vocab trained on it."""
    folder = tmp_path_factory.mktemp("former")
    documents = []
    for lang, n in (("zh", 30), ("en", 20)):
        with open(os.path.join(ROOT, "corpus", f"sample_{lang}.txt"), encoding="utf-8") as f:
            documents += [block.split("\n") for block in f.read().split("\n\n") if block.strip()][:n]
    path = folder / "corpus.txt"
    path.write_text("".join("\n".join(doc) + "\n\n" for doc in documents), encoding="utf-8")
    return str(path), wordpiece_vocab(documents, str(folder), 4000)


def local(corpus, out, *args):
    path, vocab = corpus
    proc = fleet(
        "local",
        path,
        out,
        "--workers",
        "2",
        "--item-mb",
        "0.02",
        "--set",
        f"vocab_file={vocab}",
        *args,
        tmp=os.path.dirname(out),
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def parts(out) -> dict[str, str]:
    return {
        name: hashlib.sha256(open(os.path.join(out, name), "rb").read()).hexdigest()
        for name in sorted(os.listdir(out))
        if name.startswith("part-")
    }


def spec_path(out) -> str:
    return os.path.join(out, ".fleet", "runs", "local", "run.json")


def as_planned_before(out, job: str, config: dict) -> None:
    """The run in ``out`` as the code before the move left it, planned but not converted: its
    run.json naming ``job`` with ``config``, every other file of the run gone."""
    keep = {spec_path(out), os.path.join(out, ".fleet", "runs", "local", "items.jsonl")}
    with open(spec_path(out), encoding="utf-8") as f:
        spec = json.load(f)
    for folder, _, names in os.walk(out):
        for name in names:
            if os.path.join(folder, name) not in keep:
                os.remove(os.path.join(folder, name))
    with open(spec_path(out), "w", encoding="utf-8") as f:
        json.dump({**spec, "job": job, "config": config}, f, indent=1, sort_keys=True)


def test_the_rule_is_a_table_of_data():
    assert {(row.job, row.setting, row.value, row.becomes) for row in FORMER_NAMES} == {
        ("electra_zh_en", "format", "electra", "electra_zh_en"),
        ("electra_zh_en", "format", "bert", "bert"),
    }
    assert resolve_job("electra_zh_en", {"vocab_file": "v"}) == JobChoice("electra_zh_en", {"vocab_file": "v"})
    assert resolve_job("electra_zh_en", {"format": "electra", "seed": "3", "dupe_factor": "1"}) == JobChoice(
        "electra_zh_en", {"seed": "3"}
    )
    assert resolve_job("electra_zh_en", {"format": "bert", "dupe_factor": "2", "provenance": "false"}) == JobChoice(
        "bert", {"dupe_factor": "2"}
    )
    assert resolve_job("bert", {"format": "bert"}) == JobChoice("bert", {"format": "bert"})  # the rule's name only
    job, config = load_configured("electra_zh_en", {"format": "bert", "vocab_file": "v", "v2_feature_names": "true"})
    assert job is load_job("bert") and config.v2_feature_names is True
    for settings, message in (
        (
            {"format": "xyz"},
            "option format: 'xyz' is not supported (known: electra, bert; format=bert is the job bert: --job bert)",
        ),
        ({"format": "bert", "provenance": "true"}, "option provenance: not with format=bert"),
        ({"format": "electra", "dupe_factor": "2"}, "option dupe_factor: not with format=electra"),
    ):
        with pytest.raises(ConfigError) as e:
            resolve_job("electra_zh_en", settings)
        assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.e2e  # whole `fleet local` runs
def test_set_format_bert_plans_the_bert_job_and_an_old_run_json_resumes_and_reads(corpus, tmp_path):
    job = str(tmp_path / "job")
    local(corpus, job, "--job", "bert")
    direct = parts(job)
    assert len(direct) > 2
    # --set format=bert: the bert job, planned as such (its run.json names it), the same bytes.
    alias = str(tmp_path / "alias")
    local(corpus, alias, "--set", "format=bert")
    assert parts(alias) == direct
    with open(spec_path(alias), encoding="utf-8") as f:
        planned = json.load(f)
    assert planned["job"] == "bert" and "format" not in planned["config"]
    # A run.json from before the move (format=bert, every electra_zh_en option written out) resumes
    # with the command that planned it, its workers convert it to the same bytes, and it reads.
    old = {**planned["config"], "format": "bert", "provenance": False}
    as_planned_before(alias, "electra_zh_en", old)
    proc = local(corpus, alias, "--set", "format=bert")
    assert "resuming the run" in proc.stderr and "masked per example" in proc.stderr  # the bert job's report
    assert parts(alias) == direct
    with open(spec_path(alias), encoding="utf-8") as f:
        assert json.load(f)["config"] == old  # run.json is never written again
    status = fleet("status", alias)
    assert status.returncode == 0 and "bert" in status.stdout + status.stderr, status.stderr
    reader = RunReader(alias)
    assert reader.layout == load_job("bert").features(load_job("bert").parse_config(planned["config"]))
    assert sum(1 for _ in reader.records()) == json.load(open(os.path.join(alias, "summary.json")))["examples"]
    # The same old run resumed with --job bert plans nothing new either: it is that job's run.
    as_planned_before(alias, "electra_zh_en", old)
    local(corpus, alias, "--job", "bert")
    assert parts(alias) == direct


@pytest.mark.e2e  # whole `fleet local` runs
def test_an_old_electra_run_json_resumes(corpus, tmp_path):
    """An electra_zh_en run.json from before the move holds format=electra and the bert job's
    options at their defaults: it resumes, with or without ``--set format=electra``."""
    out = str(tmp_path / "electra")
    local(corpus, out)
    done = parts(out)
    with open(spec_path(out), encoding="utf-8") as f:
        config = json.load(f)["config"]
    assert "format" not in config and not set(BERT_OPTIONS) & set(config)
    for args in ((), ("--set", "format=electra")):
        as_planned_before(out, "electra_zh_en", {**config, "format": "electra", **BERT_OPTIONS})
        assert "resuming the run" in local(corpus, out, *args).stderr
        assert parts(out) == done


@pytest.mark.e2e  # whole `fleet local` runs
def test_a_former_option_that_does_not_fit_is_one_line(corpus, tmp_path):
    path, vocab = corpus
    out = str(tmp_path / "bad")
    for args, message in (
        (("--set", "format=xyz"), "option format: 'xyz' is not supported"),
        (("--set", "format=bert", "--set", "provenance=true"), "option provenance: not with format=bert"),
        (("--job", "bert", "--set", "format=bert"), "unknown option(s) format"),
    ):
        one_line_error(fleet("local", path, out, "--set", f"vocab_file={vocab}", *args), message)


def test_the_electra_config_is_electra_alone():
    from fleet_jobs.electra_zh_en import ElectraConfig

    names = {f.name for f in dataclasses.fields(ElectraConfig)}
    assert "format" not in names and not names & set(BERT_OPTIONS)
