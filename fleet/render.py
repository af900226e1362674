"""How parts of a run look on a terminal, shared by `fleet status` and `fleet local`."""

from __future__ import annotations

from rich.console import Console


def print_skipped(out: Console, examples: list[dict], count: int) -> None:
    """The bad records that were skipped (the first few of each item, with where they were)."""
    for b in examples:
        out.print(f"[yellow]skipped[/yellow] a bad record (item {b['item']}): {b['where']}", highlight=False,
                  soft_wrap=True)
    if count > len(examples):
        out.print(f"[yellow]skipped[/yellow] {count:,} bad records in all (the first few of each item above)",
                  highlight=False)
