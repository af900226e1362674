"""How the fleet's commands look on a terminal: messages, tables, status and summaries
(fleet.cli.commands and fleet.cli.local say what to show; this module, how).

Every message goes out with rich markup off: a path, a URL or a job's hint may hold `[/`,
which rich would read as a closing tag and crash on. Only the label before it is styled.
"""

from __future__ import annotations

import os
import time
from typing import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text


def printable(text: str) -> str:
    """The text with bytes that are not UTF-8 (a path from argv) and lone surrogates shown as
    escapes: any terminal or pipe can take it."""
    try:
        raw = text.encode("utf-8", "surrogateescape")  # argv's undecodable bytes back to bytes
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def say(out: Console, text: str, label: str = "", style: str = "") -> None:
    """One message as it is (no markup, no highlighting, never wrapped), after an optional styled label."""
    line = Text.assemble((label, style), " ", printable(text)) if label else Text(printable(text), style=style)
    out.print(line, highlight=False, soft_wrap=True)


def print_skipped(out: Console, examples: list[dict], count: int) -> None:
    """The bad records that were skipped (the first few of each item, with where they were)."""
    for b in examples:
        say(out, f"a bad record (item {b['item']}): {b['where']}", "skipped", "yellow")
    if count > len(examples):
        say(out, f"{count:,} bad records in all (the first few of each item above)", "skipped", "yellow")


def print_input_files(out: Console, input_files: dict) -> None:
    """What became of every file found under the inputs at plan time (RunSpec.input_files): read
    and skipped, files and bytes, then one line per reason a file was skipped, with the first
    names. Nothing for a run planned before accounts were kept."""
    if not input_files:
        return
    from fleet.core.accounting import InputAccount

    account = InputAccount.from_dict(input_files)
    say(out, account.line(), "input files:")
    for line in account.lines():
        say(out, line, "skipped", "yellow")


def print_failed_files(out: Console, failed: list[dict], count: int) -> None:
    """Input files a grouped item could not read (the rest of its files were converted): one line each."""
    for f in failed:
        say(out, f"{f['error']} (item {f['item']}: its other files are converted)", "failed file", "red")
    if count > len(failed):
        say(
            out,
            f"{count:,} input files failed in all (the first few of each item above; manifest.json counts "
            "each in its row as files_failed)",
            "failed file",
            "red",
        )


def print_detail(out: Console, detail: dict, indent: str = "    ") -> None:
    """What a failed attempt left beside its error line (fleet.job.ItemFailed): a program's exit
    code and the last lines of its stderr, indented under that line."""
    if not detail:
        return
    rest = {k: v for k, v in detail.items() if k != "stderr_tail"}
    if rest:
        say(out, indent + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(rest.items())))
    tail = detail.get("stderr_tail") or []
    if tail:
        say(out, f"{indent}last {len(tail)} line(s) of its stderr:")
        for line in tail:
            say(out, f"{indent}| {line}")


def stdout() -> Console:
    """Tables and reports: markup off, since they hold run names, paths and job texts."""
    return Console(markup=False)


def print_options(out: Console, title: str, options: list) -> None:
    """`fleet jobs`: a job's options (fleet.job.describe_options), one row each."""
    table = Table(title=title, show_header=True, title_justify="left")
    for col in ("option", "type", "default", "meaning"):
        table.add_column(col)
    for opt in options:
        table.add_row(opt.name, opt.type, repr(opt.default), opt.help)
    out.print(table)


def plan_line(spec, items: int, created: bool, groups: Sequence[int] = ()) -> str:
    """`fleet plan`'s one line; ``groups``: the files of each item that packs several small ones."""
    verb = "planned" if created else "already planned (unchanged)"
    packed = f" ({sum(groups):,} small files packed into {len(groups):,} of them)" if groups else ""
    account = ""
    if spec.input_files:  # (the skipped files' reasons: in the warnings above)
        from fleet.core.accounting import InputAccount

        account = f"; input files: {InputAccount.from_dict(spec.input_files).line()}"
    return (
        f"run {spec.run} {verb}: {items} items{packed}, {spec.input_bytes / 1e6:,.1f} MB, "
        f"job {spec.job}, code {spec.code_version}{account}"
    )


def sync_line(result) -> str:
    """`fleet sync`'s one line (fleet.core.codesync.SyncResult)."""
    return (
        f"code {result.version}: {result.files} files, {result.uploaded} new "
        f"({result.uploaded_bytes / 1e3:,.1f} kB uploaded)"
        + ("" if result.manifest_created else "; this version was already synced")
    )


def roles_text(roles, condition_title: str, name_prefix: str) -> str:
    """`fleet iam`: the workers' roles and the calls each permission is for, as comments."""
    lines = []
    for r in roles:
        lines.append(f"# role {r.id}: {r.description}")
        lines += [f"#   {p.name:40} {p.calls}" for p in sorted(r.permissions, key=lambda p: p.name)]
    lines.append(
        f"# bound on the project with the condition {condition_title}: templates named {name_prefix}* "
        f"only; MIGs: every one in the project (IAM Conditions cannot name them)"
    )
    return "".join(line + "\n" for line in lines)


def logs_text(logs: dict) -> str:
    """`fleet logs`: the VMs' logs with their sizes, by name."""
    return "".join(f"{name}\t{blob.size:,} bytes\n" for name, blob in sorted(logs.items()))


def stage_row(row: dict) -> str:
    parts = [f"{row['done']:,}/{row['items']:,} done"]
    parts += [f"{row[k]:,} {k}" for k in ("leased", "failed", "blocked") if row.get(k)]
    return ", ".join(parts)


def stage_counts(st) -> str:
    """A run with stages, in one line: items done per stage."""
    return " · ".join(f"{row['name']} {row['done']}/{row['items']}" for row in st.stages)


def print_status(out: Console, st) -> None:
    """`fleet status`: the run's counts, speed and ETA, then its failures and skipped records."""
    table = Table(title=f"run {st.run} ({st.job})", show_header=False)
    table.add_row("items", f"{st.items:,}")
    table.add_row("pending", f"{st.pending:,}")
    table.add_row("leased", f"{st.leased:,}")
    table.add_row("done", f"{st.done:,}")
    table.add_row("failed", f"{st.failed:,}")
    if st.stages:
        for row in st.stages:
            table.add_row(f"stage {row['name']}", stage_row(row))
        if st.blocked:
            table.add_row("blocked", f"{st.blocked:,} (a stage before them failed)")
    table.add_row("MB done", f"{st.bytes_done / 1e6:,.1f} of {st.input_bytes / 1e6:,.1f}")
    for key in (
        "examples",
        "tokens",
        "items_without_outputs",
        "dedup_documents_dropped",
        "dedup_bytes_dropped",
        "near_documents_dropped",
        "near_bytes_dropped",
        "near_clusters",
        "near_cluster_size_max",
    ):
        if key in st.totals:
            table.add_row(key.replace("_", " "), f"{int(st.totals[key]):,}")
    if st.bytes_done:
        span = st.busy_seconds  # the time items were being converted: a pause between runs is no work
        if span > 0:
            rate = st.bytes_done / span
            table.add_row("MB/s", f"{rate / 1e6:,.2f}")
            if not st.finished and rate > 0 and st.live_workers:
                table.add_row("ETA", f"{(st.input_bytes - st.bytes_done) / rate:,.0f} s")
    if not st.finished and not st.live_workers:
        table.add_row("ETA", "none: no live worker (resume the run to go on)")
    table.add_row("live workers", str(st.live_workers))
    if st.requests is not None and st.requests.workers:
        label, text = requests_row(st.requests, st.finished)
        table.add_row(label, text)
    out.print(table)
    if st.requests is not None:
        for line in requests_caveats(st.requests):
            say(out, line, "requests:", "yellow")
    print_input_files(out, st.input_files)
    print_counts(out, st.sources, st.output_counts)
    for f in st.failures:
        say(out, f"item {f['item']} ({f['source']}): {f['error']}", "failed", "red")
        print_detail(out, f.get("detail") or {})
    print_failed_files(out, st.failed_files, int(st.totals.get("files_failed", 0)))
    print_skipped(out, st.bad_records, int(st.totals.get("bad_records", 0)))
    for r in st.retrying:
        say(out, f"item {r['item']} after attempt {r['attempt']}: {r['error']}", "retrying", "yellow")
        print_detail(out, r.get("detail") or {})


def requests_row(tally, finished: bool) -> tuple[str, str]:
    """`fleet status`: the store requests the workers counted (fleet.core.status.RequestTally), by
    billing class, and what Cloud Storage charges for them at list price (fleet.gce.estimate)."""
    from fleet.gce.estimate import PRICES, usd

    c = tally.counts
    text = (
        f"{c.class_a:,} Class A ({c.list_pages:,} list pages, {c.writes:,} writes), {c.class_b:,} Class B "
        f"({c.reads:,} reads, {c.stats:,} stats), {c.free:,} free (deletes): ≈ {usd(PRICES.usd(c.class_a, c.class_b))} "
        "at Cloud Storage list price"
    )
    return ("store requests" if finished and not tally.running else "store requests so far"), text


def requests_caveats(tally) -> list[str]:
    """Where the counts are not the whole: workers that died before their final heartbeat, and
    heartbeats that carry no counts."""
    lines = []
    if tally.cut:
        lines.append(
            f"{len(tally.cut):,} worker(s) stopped before their final heartbeat (a VM killed, a kill -9: "
            f"{_names(tally.cut)}): their requests after their last heartbeat are not in the count"
        )
    if tally.missing:
        lines.append(
            f"{len(tally.missing):,} worker(s) left heartbeats without request counts (code from before "
            f"they were counted: {_names(tally.missing)}): their requests are not in the count"
        )
    return lines


def _names(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown:,} more" if len(names) > shown else "")


COUNT_COLUMNS = (
    "documents",
    "documents_read",
    "examples",
    "tokens",
)  # the counts a trainer budgets by, when a job gives them
TOP_SOURCES = 10


def print_counts(out: Console, sources: dict, outputs: dict) -> None:
    """The run's exact counts (fleet.core.manifest): the top input files by tokens (else by
    input bytes), with the sum over all of them, and the outputs' sum in one line."""
    if sources:
        names = [c for c in COUNT_COLUMNS if any(c in row for row in sources.values())]
        # A grouped item's files have rows of what was read (bytes, documents): what it made of them
        # together (examples, tokens) is no one file's, shown "-" and left out of the sum.
        partial = {c for c in names if not all(c in row for row in sources.values())}
        key = "tokens" if "tokens" in names and "tokens" not in partial else "input_bytes"
        folder = os.path.commonprefix(list(sources)).rpartition("/")[0] + "/"  # shown once, in the title
        table = Table(
            title=f"per input file in {printable(folder)} ({len(sources):,}; top "
            f"{min(TOP_SOURCES, len(sources))} by {key.replace('_', ' ')})",
            show_header=True,
            title_justify="left",
        )
        for col in ("input file", "input bytes", *names):
            table.add_column(
                col,
                justify="left" if col == "input file" else "right",
                overflow="fold" if col == "input file" else "ellipsis",
            )
        top = sorted(sources.items(), key=lambda kv: (-kv[1].get(key, 0), kv[0]))[:TOP_SOURCES]
        for name, row in top:
            table.add_row(
                Text(printable(name[len(folder) :])),
                *(f"{row[c]:,}" if c in row else "-" for c in ("input_bytes", *names)),
            )
        sums = {c: sum(row.get(c, 0) for row in sources.values()) for c in ("input_bytes", *names)}
        table.add_row(Text("all", style="bold"), *("-" if c in partial else f"{v:,}" for c, v in sums.items()))
        out.print(table)
        if partial:
            say(
                out,
                f"-: {', '.join(sorted(partial))} of small files grouped into one item are counted for the item "
                "(outputs below), not per file",
            )
    counted = {
        c: sum(row.get(c, 0) for row in outputs.values())
        for c in COUNT_COLUMNS
        if any(c in row for row in outputs.values())
    }
    if outputs and counted:
        holders = sum(1 for row in outputs.values() if any(c in row for c in counted))
        rest = len(outputs) - holders  # (a dataset's .idx, a provenance sidecar: files that hold no examples)
        say(
            out,
            f"{holders:,} output files hold "
            + ", ".join(f"{v:,} {k}" for k, v in counted.items())
            + (f" ({rest:,} more beside them: indexes, sidecars)" if rest else ""),
            "counted:",
        )


def deadline_line(deadline: float, now: float) -> str:
    """When the run's VMs are gone at the latest (their terminationTime), and how far that is."""
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(deadline))
    left = deadline - now
    span = f"{left / 60:.0f} min" if abs(left) < 5400 else f"{left / 3600:.1f} h"
    return (
        f"deadline {at} (in {span}): every VM, recreated ones included, is gone by then"
        if left > 0
        else f"deadline {at} ({span.lstrip('-')} ago): the run's VMs are gone and no new one can start; "
        "`fleet launch` again to go on"
    )


def print_fleet(out: Console, view: dict) -> None:
    """`fleet status` of a launched run: its MIG's VMs, errors, VM-hours and boots."""
    launch = view["launch"]
    mig = view["mig"]
    title = (
        f"fleet {launch['mig']} ({launch['zone'] or launch['region']}, {launch['machine_type']}"
        f"{', Spot' if launch['spot'] else ''})"
    )
    table = Table(title=title, show_header=True)
    for col in ("VM", "zone", "status", "action", "last error"):
        table.add_column(col)
    for vm in (mig or {}).get("instances", []):
        table.add_row(vm["name"], vm["zone"], vm["status"], vm["action"], "; ".join(vm["errors"]))
    out.print(table)
    if launch.get("deadline"):
        out.print(deadline_line(launch["deadline"], time.time()), highlight=False)
    if mig:
        out.print(f"target size {mig['target_size']}, template {mig['template']}", highlight=False)
        short = mig.get("short_zones") or {}
        if short:
            say(
                out,
                ", ".join(f"{zone} ({n} failed creation{'s' if n > 1 else ''})" for zone, n in sorted(short.items()))
                + ": no capacity there (a stock-out, in the MIG's recent errors); "
                + (
                    "the run goes on in the other zones"
                    if launch.get("region")
                    else "a regional MIG (region in fleet.toml) would go on in other zones"
                ),
                "zones short:",
                "yellow",
            )
    elif view.get("stopped"):
        say(out, view["stopped"], style="red")
    elif not view["problem"]:
        out.print("the MIG is gone (the run's VMs have all left)", highlight=False)
    if view["problem"]:
        say(out, view["problem"], "cannot read the MIG:", "yellow")
    for e in (mig or {}).get("errors", [])[:10]:
        say(out, f"{e['time']}: {e['code']}: {e['message']}", f"{e['action'].lower()} {e['instance']}", "red")
    out.print(
        f"VM-hours so far: {view['vm_hours']:,.2f} over {view['vms_seen']} VMs (from heartbeats; boot not counted)",
        highlight=False,
    )
    if view.get("boots"):
        out.print(
            "VM boots: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(view["boots"].items())), highlight=False
        )
