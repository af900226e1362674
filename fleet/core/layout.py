"""Every object name under ``runs/<run>/`` in the bucket: the one contract between the planner,
the workers, the readers, `fleet status` and the VMs' startup/startup.sh.

    runs/<run>/run.json                       the run's spec, written once by `fleet plan`
    runs/<run>/items.jsonl                    its immutable list of work items
    runs/<run>/leases/<item>                  an item's lease: who holds it, its attempts, its outputs
    runs/<run>/final/<item>                   create-once marker of a finished (done or failed) item
    runs/<run>/released/<item>                an item given back: taken at once, not after its lease's TTL
    runs/<run>/done/<window>                  create-once marker of a window whose items are all finished
    runs/<run>/workers/<worker>               a worker's heartbeat
    runs/<run>/idle/<worker>                  an idle worker (the standby candidates)
    runs/<run>/launch.json                    where `fleet launch` put the run's MIG and template
    runs/<run>/logs/<instance>.log            a VM's log, streamed by startup.sh
    runs/<run>/boots/<instance>-<boot>        one record per VM boot (startup.sh)
    runs/<run>/failed-boots/<n>/<instance>-<boot>  a failed boot, n = items finished when it failed
    runs/<run>/stopped.json                   the run's stop, when boots kept failing (startup.sh)
    runs/<run>/shuffle/<item>                 a stage's keyed records of one item, for the next stage
    runs/<run>/shuffle/<barrier>.index        where the next stage's items find them (fleet.core.shuffle)
    runs/<run>/counts/<item>.json             a grouped item's exact counts per input file (fleet.core.manifest)
    runs/<run>/finishing                      claimed by the one drained worker that confirms the drain and
                                              writes the run's files; then its word that the run ended

Beside the runs, the bucket holds the code snapshots `fleet sync` uploads (fleet.core.codesync):

    code/<version>/manifest.sha256            a snapshot's manifest (sha256sum format)
    code/objects/<sha256>                     a file's bytes, shared by every snapshot that has it

And the output place (a folder or gs:// prefix, fleet.core.run.output_place) holds the outputs:

    part-<item><suffix>                       an item's outputs (the last stage's: part-00003-of-00016...)
    manifest.json                             the finished run's exact counts (fleet.core.manifest)
    summary.json                              `fleet local`'s summary of the run

startup.sh writes the run's boots, logs and stop with curl alone, and reads the code snapshot,
and never spells a name itself: the launch hands it :func:`vm_paths` (templates over
``{instance}``, ``{boot}``, ``{finished}``, ``{version}``, ``{sha256}``) in the instance
metadata, so the two sides cannot drift (tests/test_layout.py holds them together).
"""

from __future__ import annotations

RUNS = "runs/"
SPEC = "run.json"
STATE_DIR = ".fleet"  # `fleet local OUT_DIR`: the folder in OUT_DIR that stands in for the bucket
LOCAL_RUN = "local"  # the run `fleet local` plans in OUT_DIR/.fleet
LOG_SUFFIX = ".log"
CODE_OBJECTS = "code/objects/"
OUTPUT_PREFIX = "part-"  # every output of an item begins so; nothing else in the output place does
MANIFEST = "manifest.json"  # in the output place, beside the outputs
SUMMARY = "summary.json"  # in `fleet local`'s output folder


def output_name(item: str, suffix: str) -> str:
    """An item's output ``suffix`` (``.tfrecord``, ``-logs/a.txt``) in the output place."""
    return f"{OUTPUT_PREFIX}{item}{suffix}"


def code_manifest_name(version: str) -> str:
    """A code snapshot's manifest (fleet.core.codesync)."""
    return f"code/{version}/manifest.sha256"


def code_object_name(sha256: str) -> str:
    """A file's bytes in the code snapshots, by its sha256."""
    return f"{CODE_OBJECTS}{sha256}"


def run_prefix(run: str) -> str:
    return f"{RUNS}{run}/"


def run_of_spec(name: str) -> str | None:
    """The run whose spec an object name is (``runs/<run>/run.json``), else None: listing runs."""
    if not name.startswith(RUNS) or not name.endswith("/" + SPEC):
        return None
    run = name[len(RUNS) : -len(SPEC) - 1]
    return run if run and "/" not in run else None


def spec_name(run: str) -> str:
    return f"{run_prefix(run)}{SPEC}"


def items_name(run: str) -> str:
    return f"{run_prefix(run)}items.jsonl"


def lease_prefix(run: str) -> str:
    return f"{run_prefix(run)}leases/"


def final_prefix(run: str) -> str:
    """Create-once markers of finished items: one listing tells every worker what is left."""
    return f"{run_prefix(run)}final/"


def done_prefix(run: str) -> str:
    """Create-once markers of finished windows (fleet.core.windows): one listing, 64,000 items a
    call, tells a worker where work is left. Advisory: a sweep of the leases overrules them."""
    return f"{run_prefix(run)}done/"


def released_prefix(run: str) -> str:
    """An empty object per item given back (preemption, shutdown, a retry): workers list these
    and take the item at once instead of waiting for its lease to stand still."""
    return f"{run_prefix(run)}released/"


def worker_prefix(run: str) -> str:
    return f"{run_prefix(run)}workers/"


def idle_prefix(run: str) -> str:
    """An empty object per idle worker: one listing finds the standby candidates."""
    return f"{run_prefix(run)}idle/"


def launch_name(run: str) -> str:
    return f"{run_prefix(run)}launch.json"


def log_prefix(run: str) -> str:
    return f"{run_prefix(run)}logs/"


def log_name(run: str, instance: str) -> str:
    return f"{log_prefix(run)}{instance}{LOG_SUFFIX}"


def boots_prefix(run: str) -> str:
    return f"{run_prefix(run)}boots/"


def boot_name(run: str, instance: str, boot: str) -> str:
    """<boot> differs for every boot, so a VM the MIG recreates under the same name never
    overwrites its predecessor's record."""
    return f"{boots_prefix(run)}{instance}-{boot}"


def failed_prefix(run: str, finished: int | str | None = None) -> str:
    """All failed-boot markers, or (``finished`` given) those of the boots that failed while that
    many items were finished: the failures since the run last finished an item."""
    base = f"{run_prefix(run)}failed-boots/"
    return base if finished is None else f"{base}{finished}/"


def failed_name(run: str, finished: int | str, instance: str, boot: str) -> str:
    return f"{failed_prefix(run, finished)}{instance}-{boot}"


def shuffle_prefix(run: str) -> str:
    """Records between stages: they stay with the run's state, not among its outputs."""
    return f"{run_prefix(run)}shuffle/"


def shuffle_name(run: str, item: str) -> str:
    return f"{shuffle_prefix(run)}{item}"


def index_name(run: str, barrier: str) -> str:
    return f"{shuffle_prefix(run)}{barrier}.index"


def counts_prefix(run: str) -> str:
    """Per-file counts of grouped items: beside the leases, not in them (a lease stays small)."""
    return f"{run_prefix(run)}counts/"


def counts_name(run: str, item: str) -> str:
    return f"{counts_prefix(run)}{item}.json"


def finishing_name(run: str) -> str:
    """The run-state object the worker that confirms the drain and writes the run's files
    (manifest.json, Job.run_files) claims first (create-only), so that the workers that find the
    run drained together do not all list and read every lease; it ends holding that worker's
    word that the run ended (fleet.core.manifest.end_claim), which the others wait for."""
    return f"{run_prefix(run)}finishing"


def stop_name(run: str) -> str:
    return f"{run_prefix(run)}stopped.json"


# What startup.sh fills in, and the keys it looks the templates up by.
INSTANCE, BOOT, FINISHED, VERSION, SHA256 = "{instance}", "{boot}", "{finished}", "{version}", "{sha256}"


def vm_paths(run: str) -> dict[str, str]:
    """The names a VM's startup.sh writes, lists or reads, as templates over {instance}, {boot},
    {finished}, {version} and {sha256}: it gets them from the launch (metadata), never spells
    them itself."""
    return {
        "boot": boot_name(run, INSTANCE, BOOT),
        "log": log_name(run, INSTANCE),
        "final": final_prefix(run),
        "failed": failed_name(run, FINISHED, INSTANCE, BOOT),
        "failed-now": failed_prefix(run, FINISHED),
        "stop": stop_name(run),
        "code-manifest": code_manifest_name(VERSION),
        "code-object": code_object_name(SHA256),
    }


def vm_paths_text(run: str) -> str:
    """vm_paths as the metadata value startup.sh parses: one ``key=template`` a line."""
    return "".join(f"{key}={value}\n" for key, value in vm_paths(run).items())
