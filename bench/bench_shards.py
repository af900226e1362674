"""What stages cost (issue 19): the shuffle stage of ``--shards N`` as a share of the map stage,
``--dedup exact`` against a plain run, and the peak RSS of a reduce worker whose partition is
bigger than its memory budget.

    .venv/bin/python bench/bench_shards.py [--repeat 10] [--shards 16] [--workers 2] [--rounds 5]
                                           [--vocab vocab.txt] [--rss-shuffle-mb 8] [--rss-repeat 10]
                                           [--combine 4 --combine-blocks 1]

Stage times: ``fleet local`` on the short-document corpus (bench/short_corpus.py) repeated
``--repeat`` times, job electra_zh_en, once plain (the map only: one file per item), once with
``--shards N``, once with ``--dedup exact`` and once with both, each in a fresh OUT_DIR; with
``--combine G``, once more ``--shards N`` with a combine step before the shards (groups of G map
files, in ``--combine-blocks`` key blocks; a run this small gets none by itself: the command runs
with fleet.core.shuffle.COMBINE_RULE set to that shape). Per stage: the sum over its items of the
``seconds`` their leases record (claim to upload, the item's own work), from
``StatusReader.leases()``; an item's step says its stage (fleet.core.run.StepPlan: the map, a
stage's combine step, its barrier, its items). Beside them the whole command's
wall and CPU (user + system of the process tree, ``os.wait4``). On a shared 2-core machine
these are noisy: each run is repeated ``--rounds`` times and the one with the least CPU kept,
and the figures are compared as ratios within one invocation. The short corpus repeats each
document ``--repeat`` times, so ``--dedup exact`` drops all copies but one: its stage converts
a tenth of what the plain run converts (the report says how many were dropped).

Peak RSS: ``fleet plan`` (fleet.core.run.plan) of the same corpus with ``--shards 1`` and a
budget of ``--rss-shuffle-mb``, in items of ``--rss-item-mb`` (each map item's records then
exceed the budget too, so the map spills); then worker processes run by hand
(fleet.core.processes.work_one, each in a fresh interpreter that prints its own ``VmHWM``):
one that runs the whole run (map, barrier, the one reduce item, whose partition is every
record of the run), then, after the reduce item is reopened, a fresh one that runs only the
reduce, then a fresh one with nothing left to do (its start-up: the job and its vocab loaded).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_convert import run_process  # noqa: E402
from short_corpus import short_sample  # noqa: E402

JOB = "electra_zh_en"
RUN = "local"  # fleet local's run name (fleet.cli.local.RUN), kept here so this process stays small


@dataclass
class RunFigures:
    label: str
    wall: float  # the whole command
    cpu: float  # user + system of the command and its worker processes
    run_wall: float  # fleet local's own figure: workers started to run finished
    items: int
    seconds: dict[str, float] = field(default_factory=dict)  # stage name ("map", "<stage> barrier", "<stage>") -> s
    counts: dict[str, int] = field(default_factory=dict)  # items per stage name
    summary: dict = field(default_factory=dict)

    @property
    def item_seconds(self) -> float:
        return sum(self.seconds.values())


def stage_seconds(state: str) -> tuple[dict[str, float], dict[str, int]]:
    """Seconds of the items' own work (their leases' ``seconds``) summed per stage, and items per stage."""
    from fleet.core.run import StepPlan, load_items, load_spec
    from fleet.core.status import StatusReader
    from fleet.core.store import open_store

    from fleet.core.run import BARRIER

    store = open_store(state)
    steps = StepPlan(load_spec(store, RUN))
    step_of = {i.id: i.step for i in load_items(store, RUN)}
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    for item, lease in sorted(StatusReader(store, RUN).leases().items(), key=lambda kv: step_of[kv[0]]):
        step = step_of[item]  # in step order: the map, then each stage's combine step, barrier and items
        name = steps.name(step) + (" barrier" if steps.kind(step) == BARRIER else "")
        seconds[name] += float(lease.stats.get("seconds", 0.0))
        counts[name] += 1
    return dict(seconds), dict(counts)


def fleet_local(
    label: str,
    corpus: str,
    out: str,
    vocab: str,
    workers: int,
    extra: list[str],
    combine: tuple[int, int] | None = None,
) -> RunFigures:
    """``combine``: (group, blocks) of a combine step forced on the run's stages."""
    shutil.rmtree(out, ignore_errors=True)
    fleet = [os.path.join(os.path.dirname(sys.executable), "fleet")]
    if combine:  # the planner is the command's own process: set its rule, then run the CLI as it is
        fleet = [
            sys.executable,
            "-c",
            "from fleet.core import shuffle; "
            f"shuffle.COMBINE_RULE = shuffle.CombineRule(group={combine[0]}, blocks={combine[1]}); "
            "from fleet.cli import main; main()",
        ]
    cmd = [
        *fleet,
        "local",
        corpus,
        out,
        "--job",
        JOB,
        "--workers",
        str(workers),
        "--set",
        f"vocab_file={vocab}",
        *extra,
    ]
    r = run_process(cmd)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    seconds, counts = stage_seconds(os.path.join(out, ".fleet"))
    shutil.rmtree(out, ignore_errors=True)
    return RunFigures(label, r["wall"], r["cpu"], summary["wall_seconds"], summary["items"], seconds, counts, summary)


def stage_rows(args, corpus: str, vocab: str, folder: str) -> list[str]:
    modes = {
        "plain (map only)": [],
        f"--shards {args.shards}": ["--shards", str(args.shards)],
        "--dedup exact": ["--dedup", "exact"],
        f"--dedup exact --shards {args.shards}": ["--dedup", "exact", "--shards", str(args.shards)],
    }
    combined_label = f"--shards {args.shards}, combine {args.combine}x{args.combine_blocks}"
    if args.combine:
        modes[combined_label] = ["--shards", str(args.shards)]
    best: dict[str, RunFigures] = {}
    shares: dict[str, list[float]] = collections.defaultdict(list)  # the shuffle stage's share, each round
    for _ in range(args.rounds):
        for label, extra in modes.items():
            forced = (args.combine, args.combine_blocks) if label == combined_label else None
            r = fleet_local(label, corpus, os.path.join(folder, "out"), vocab, args.workers, extra, forced)
            if label not in best or r.cpu < best[label].cpu:
                best[label] = r
            if "shards" in r.seconds:
                stage = sum(s for name, s in r.seconds.items() if name.startswith("shards"))
                shares[label].append(stage / (r.item_seconds - stage))
    plain, shards, dedup, both = (best[m] for m in list(modes)[:4])
    docs = plain.summary.get("documents", 0)
    lines = [
        f"input: the short-document corpus x{args.repeat} ({os.path.getsize(corpus) / 1e6:.1f} MB, "
        f"{docs:,} documents), job {JOB}, fleet local --workers {args.workers}; per mode the round with the "
        f"least CPU of {args.rounds}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}",
        "item seconds: the sum over a stage's items of the seconds their leases record (claim to upload)",
        "",
        f"  {'run':34}{'items':>7}{'cmd wall':>10}{'run wall':>10}{'CPU s':>8}   item seconds by stage",
    ]
    for r in best.values():
        stages = ", ".join(f"{name} {s:.2f} ({r.counts[name]})" for name, s in r.seconds.items())
        lines.append(f"  {r.label:34}{r.items:>7}{r.wall:>10.2f}{r.run_wall:>10.2f}{r.cpu:>8.2f}   {stages}")
    lines.append(
        "  (cmd wall: the whole `fleet local` command; run wall: its own figure, workers started to finished; "
        "in brackets: items)"
    )

    def shuffle_share(r: RunFigures) -> tuple[float, float]:
        stage = sum(s for name, s in r.seconds.items() if name.startswith("shards"))  # its combine step too
        before = r.item_seconds - stage
        return stage, before

    stage, before = shuffle_share(shards)
    lines += [
        "",
        f"--shards {args.shards}: the shuffle stage (its barrier + {shards.counts.get('shards', 0)} shard items) took "
        f"{stage:.2f} s = {100 * stage / before:.0f}% of the map stage's {before:.2f} s (goal: at most 25%); "
        f"{spread(shares[shards.label])}",
        f"  the map of the sharded run (keyed records into partition files instead of output files) took "
        f"{before / plain.item_seconds:.2f}x the plain run's map ({plain.item_seconds:.2f} s)",
        f"  the whole cost of sharding against the plain run: item seconds {shards.item_seconds / plain.item_seconds:.2f}x, "
        f"run wall {shards.run_wall / plain.run_wall:.2f}x, command wall {shards.wall / plain.wall:.2f}x, "
        f"CPU {shards.cpu / plain.cpu:.2f}x",
    ]
    dropped = dedup.summary.get("dedup_documents_dropped", 0)
    dmap, dstage = (
        dedup.seconds.get("map", 0.0),
        dedup.seconds.get("dedup", 0.0) + dedup.seconds.get("dedup barrier", 0.0),
    )
    lines += [
        f"--dedup exact: the map (documents keyed by their text's digest, no conversion) {dmap:.2f} s + the dedup stage "
        f"(barrier + {dedup.counts.get('dedup', 0)} items that convert the kept documents) {dstage:.2f} s = "
        f"{dmap + dstage:.2f} s, {(dmap + dstage) / plain.item_seconds:.2f}x the plain run's {plain.item_seconds:.2f} s; "
        f"run wall {dedup.run_wall / plain.run_wall:.2f}x, command wall {dedup.wall / plain.wall:.2f}x, "
        f"CPU {dedup.cpu / plain.cpu:.2f}x",
        f"  it dropped {dropped:,} of {docs:,} documents (the corpus is each document x{args.repeat}): the dedup stage "
        f"converts {docs - dropped:,}, the plain run {docs:,}",
    ]
    stage, before = shuffle_share(both)
    lines.append(
        f"--dedup exact --shards {args.shards}: item seconds {both.item_seconds:.2f} "
        f"({', '.join(f'{n} {s:.2f}' for n, s in both.seconds.items())}); the shuffle stage "
        f"= {100 * stage / before:.0f}% of the stages before it ({spread(shares[both.label])}); run wall {both.run_wall / plain.run_wall:.2f}x "
        f"the plain run's"
    )
    if args.combine:
        combined = best[combined_label]
        stage, before = shuffle_share(combined)
        step, n = combined.seconds.get("shards combine", 0.0), combined.counts.get("shards combine", 0)
        lines += [
            f"{combined_label}: the shuffle stage (combine step {step:.2f} s in {n} "
            f"items + barrier + {combined.counts.get('shards', 0)} shard items) took {stage:.2f} s = "
            f"{100 * stage / before:.0f}% of the map stage's {before:.2f} s ({spread(shares[combined_label])}); "
            f"without the combine step {shuffle_share(shards)[0]:.2f} s",
            f"  against --shards {args.shards} without it: item seconds "
            f"{combined.item_seconds / shards.item_seconds:.2f}x, "
            f"run wall {combined.run_wall / shards.run_wall:.2f}x, command wall {combined.wall / shards.wall:.2f}x, "
            f"CPU {combined.cpu / shards.cpu:.2f}x",
        ]
    return lines


def spread(values: list[float]) -> str:
    """The share in every round, as the median and range: item seconds are wall time, so a busy
    machine moves them; the share within one run moves less."""
    values = sorted(values)
    return (
        f"over the {len(values)} rounds: median {100 * values[len(values) // 2]:.0f}%, "
        f"{100 * values[0]:.0f}-{100 * values[-1]:.0f}%"
    )


def worker_child(bucket: str, name: str, log_file: str) -> None:
    """In a fresh interpreter: one worker until the run is drained, then its own peak RSS as JSON."""
    from fleet.core.processes import work_one

    rc = work_one(bucket, RUN, name, log_file)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    print(json.dumps({"rc": rc, "hwm_mib": hwm}))


def run_worker(bucket: str, name: str, folder: str) -> float:
    log_file = os.path.join(folder, f"{name}.log")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker-child", bucket, name, log_file],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode:
        raise SystemExit(f"worker {name} failed:\n{proc.stderr[-2000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if r["rc"]:
        with open(log_file) as f:
            raise SystemExit(f"worker {name} exited {r['rc']}:\n{f.read()[-2000:]}")
    return r["hwm_mib"]


def rss_rows(args, corpus: str, vocab: str, folder: str) -> list[str]:
    from fleet.core.lease import DONE
    from fleet.core.run import PlanRequest, load_items, plan
    from fleet.core.status import StatusReader
    from fleet.core.store import open_store
    from fleet.core.verify import reopen
    from fleet.job import StageOptions

    out = os.path.join(folder, "rss")
    shutil.rmtree(out, ignore_errors=True)
    bucket = os.path.join(out, ".fleet")
    budget = int(args.rss_shuffle_mb * 1e6)
    _, items, _ = plan(
        bucket,
        PlanRequest(
            run=RUN,
            job=JOB,
            inputs=[corpus],
            output=out,
            code_version="bench",
            settings={"vocab_file": vocab},
            lease_ttl=60,
            item_bytes=int(args.rss_item_mb * 1e6),
            stage_options=StageOptions(1, ""),
            shuffle_budget=budget,
        ),
    )
    whole = run_worker(bucket, "whole", folder)
    store = open_store(bucket)
    leases = StatusReader(store, RUN).leases()
    if not all(lease.state == DONE for lease in leases.values()):
        raise SystemExit(f"{out}: the run did not finish")
    maps = [i for i in items if i.step == 0]
    files = [o["size"] for i in maps for o in leases[i.id].outputs if o.get("place") == "state"]
    [reduce_item] = [i for i in load_items(store, RUN) if i.step == 2]
    records = int(leases[reduce_item.id].stats.get("shard_examples", 0))
    reopen(store, RUN, [reduce_item.id])
    only_reduce = run_worker(bucket, "reduce", folder)
    idle = run_worker(bucket, "idle", folder)
    partition = sum(files)
    shutil.rmtree(out, ignore_errors=True)
    return [
        f"peak RSS of a reduce worker with a budget smaller than its partition: the short corpus x{args.rss_repeat} "
        f"({os.path.getsize(corpus) / 1e6:.1f} MB), --shards 1 --shuffle-mb {args.rss_shuffle_mb:g}, one worker, "
        f"{len(maps)} map item(s) of ~{args.rss_item_mb:g} MB",
        f"  the reduce item's partition: {partition / 1e6:.1f} MB ({records:,} records, all of the run's, in "
        f"{len(files)} partition file(s) of {', '.join(f'{s / 1e6:.1f}' for s in files)} MB) against a budget of "
        f"{budget / 1e6:.0f} MB: {partition / budget:.1f}x",
        f"  VmHWM of a worker running the whole run (map, barrier, reduce):  {whole:6.0f} MiB",
        f"  VmHWM of a fresh worker running only the reduce item (reopened): {only_reduce:6.0f} MiB",
        f"  VmHWM of a fresh worker with nothing to do (job and vocab loaded): {idle:5.0f} MiB",
        f"  so the reduce itself added {only_reduce - idle:.0f} MiB to a worker for a {partition / 1e6:.0f} MB partition",
    ]


def write_corpus(path: str, repeat: int) -> None:
    parts = short_sample()
    with open(path, "wb") as f:
        for lang in ("zh", "en"):
            f.write(parts[lang] * repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10, help="the short corpus this many times (x10: 12 MB)")
    ap.add_argument("--shards", type=int, default=16, help="--shards of the sharded runs")
    ap.add_argument("--workers", type=int, default=2, help="fleet local --workers")
    ap.add_argument("--rounds", type=int, default=5, help="run each mode this many times, keep the least CPU")
    ap.add_argument("--vocab", help="vocab.txt (default: train one on the sample, as bench_convert.py does)")
    ap.add_argument("--rss-shuffle-mb", type=float, default=8.0, help="the budget of the peak RSS run (0: skip it)")
    ap.add_argument("--rss-repeat", type=int, default=10, help="the short corpus this many times for the RSS run")
    ap.add_argument("--rss-item-mb", type=float, default=6.0, help="map item size of the RSS run")
    ap.add_argument(
        "--combine",
        type=int,
        default=0,
        help="also a --shards run with a combine step of groups of this many map files (0: none)",
    )
    ap.add_argument("--combine-blocks", type=int, default=1, help="key blocks of that combine step")
    ap.add_argument("--worker-child", nargs=3, metavar=("BUCKET", "NAME", "LOG"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_child:
        worker_child(*args.worker_child)
        return
    if args.repeat < 1 or args.rss_repeat < 1 or args.shards < 1 or args.workers < 1 or args.rounds < 1:
        ap.error("--repeat, --rss-repeat, --shards, --workers and --rounds: give 1 or more")
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as folder:
        vocab = args.vocab
        if not vocab:
            vocab = os.path.join(folder, "vocab.txt")
            samples = [os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("zh", "en")]
            subprocess.run(
                [sys.executable, "-m", "fleet_jobs.text", "vocab", *samples, "--size", "21128", "--out", vocab],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
        corpus = os.path.join(folder, "short.txt")
        write_corpus(corpus, args.repeat)
        print("\n".join(stage_rows(args, corpus, vocab, folder)), flush=True)
        if args.rss_shuffle_mb > 0:
            if args.rss_repeat != args.repeat:
                corpus = os.path.join(folder, "rss.txt")
                write_corpus(corpus, args.rss_repeat)
            print()
            print("\n".join(rss_rows(args, corpus, vocab, folder)))


if __name__ == "__main__":
    main()
