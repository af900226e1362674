"""The command line and the Python API under it: the `fleet` commands, `fleet local` and its
library form (``api``: ``fleet.local``), and how they render. Nothing imports it but the entry
point and ``fleet``'s own names (``fleet.local``), each on first use."""


def main() -> None:
    """The `fleet` command (imported here on use: importing the package stays cheap)."""
    import gc
    import os

    from fleet.core.processes import ONE_BLAS_THREAD

    for name, value in ONE_BLAS_THREAD.items():  # before numpy is imported (fleet.core.processes says why)
        os.environ.setdefault(name, value)
    from fleet.cli.commands import main as run

    try:
        run()
    finally:
        # What is left lives until the process ends: out of the collector's reach, the interpreter's
        # last full collection at exit no longer walks every module's objects (0.04 s of CPU).
        gc.freeze()
