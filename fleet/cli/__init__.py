"""The command line: the `fleet` commands, `fleet local`, and how they render. Nothing imports it
but the entry point."""


def main() -> None:
    """The `fleet` command (imported here on use: importing the package stays cheap)."""
    from fleet.cli.commands import main as run

    run()
