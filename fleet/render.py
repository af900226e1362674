"""How parts of a run look on a terminal, shared by `fleet status` and `fleet local`.

Every message goes out with rich markup off: a path, a URL or a job's hint may hold `[/`,
which rich would read as a closing tag and crash on. Only the label before it is styled.
"""

from __future__ import annotations

from rich.console import Console
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
