"""causal_lm for a decoder's trainer on the Compute Engine stand-in: a SentencePiece `.model` read
from the bucket (pinned in run.json), `output=megatron` written by the VMs, `manifest.json` and
`megatron-data-path.txt` written by the one drained VM that claims the run's finish, and
megatron-core's own IndexedDataset reading every token back: the bytes `fleet local` writes here."""

from __future__ import annotations

import io
import json
import warnings

from rich.console import Console

from fleet.cli.local import run_local
from fleet.core.run import load_spec
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from tests.test_gcp_e2e import cloud_fixture  # noqa: F401 (the `cloud` fixture)
from tests.test_gcp_e2e import CORPUS, check_clean_exit, init, local_digests, output_digests


def test_vms_write_megatron_datasets_with_a_sentencepiece_model_from_the_bucket(cloud, tmp_path):
    import sentencepiece as spm

    prefix = str(tmp_path / "sp")
    lines = [line for line in (CORPUS / "sample_en.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=prefix, vocab_size=1200, model_type="unigram", minloglevel=2
    )
    store = open_store(cloud.bucket)
    store.upload_file("sp.model", prefix + ".model")
    init(cloud)
    cloud.fleet("sync")
    options = {"tokenizer_file": f"{cloud.bucket}/sp.model", "output": "megatron"}
    cloud.fleet(
        "plan",
        "--run",
        "mg",
        "--job",
        "causal_lm",
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-mg/",
        *(a for k, v in options.items() for a in ("--set", f"{k}={v}")),
        "--item-mb",
        "0.15",
        "--lease-ttl",
        "20",
    )
    assert load_spec(store, "mg").files["tokenizer_file"].startswith("sha256:")  # the model is pinned
    cloud.fleet("launch", "--run", "mg", "--workers", "3", "--template", "fleet-t-mg")
    cloud.wait_until_gone("fleet-mg", "fleet-t-mg")
    st = StatusReader(store, "mg").collect()
    assert st.done == st.items >= 3 and not st.failed, st
    check_clean_exit(cloud, "mg")

    out = open_store(f"{cloud.bucket}/out-mg")
    manifest = json.loads(out.read("manifest.json"))
    path_list = out.read("megatron-data-path.txt").decode().split()
    weights = dict(zip(path_list[1::2], map(int, path_list[0::2])))
    assert sorted(weights) == [f"part-{i:05d}" for i in range(st.items)]
    assert sum(weights.values()) == manifest["totals"]["outputs"]["tokens"] == st.totals["tokens"]

    local = tmp_path / "local"
    result = run_local(
        [str(CORPUS / "sample_en.txt")],
        str(local),
        "causal_lm",
        2,
        {**options, "tokenizer_file": prefix + ".model"},
        item_bytes=int(0.15e6),
        console=Console(file=io.StringIO()),
    )
    assert result.exit_code == 0
    on_vms = output_digests(f"{cloud.bucket}/out-mg")
    assert on_vms == local_digests(local) and len(on_vms) == 2 * st.items

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    documents = [d for d in (CORPUS / "sample_en.txt").read_text(encoding="utf-8").split("\n\n") if d.strip()]
    sequences = [seq.tolist() for name in sorted(weights) for seq in IndexedDataset(str(local / name))]
    assert sum(map(len, sequences)) == sum(weights.values())
    assert len(sequences) == manifest["totals"]["outputs"]["documents"]
    assert sequences[0] == sp.encode("\n".join(documents[0].strip("\n").split("\n"))) + [sp.eos_id()]
